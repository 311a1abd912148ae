"""The histograms each engine's model servers record that the canary analysis judges (roles/monitoring's
vars, one source for Prometheus' rules and the guard on every backend)."""

from __future__ import annotations

from infra.nodes.role_templates import role_vars


def _engine_metrics(engine: str) -> dict[str, str]:
    return dict(role_vars("monitoring")["__monitoring_engine_metrics"][engine])


def latency_histogram(engine: str) -> str:
    """The histogram the analysis judges latency on: the time to the first token (for the CPU reference
    server, which answers in one piece, the whole answer)."""
    return str(_engine_metrics(engine)["ttft_histogram"])


def itl_histograms(engine: str) -> tuple[str, ...]:
    """The engine's inter-token latency histogram, by each name it may have, the preferred first (none for
    the CPU reference server). vLLM's v1 engine named it vllm:time_per_output_token_seconds
    (vllm/v1/metrics/loggers.py, `histogram_time_per_output_token`, observed per
    `time_per_output_tokens_iter`, at vllm-project/vllm commit 005a810b, a 0.10 release); the 0.11 series'
    loggers.py adds vllm:inter_token_latency_seconds over the same buckets and marks the old name
    "DEPRECATED: Use vllm:inter_token_latency_seconds instead". The first name a server has is read, never
    both (the same observations twice)."""
    names = _engine_metrics(engine).get("itl_histogram") or ""
    return tuple(name for name in str(names).split("|") if name)
