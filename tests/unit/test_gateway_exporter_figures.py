"""exporter_figures on the exporter's text as HAProxy's promex writes it (addons/promex/README, "Backend
metrics"): the failed answers the gateway program counts from `show stat` (4xx, 5xx, client and server
aborts, at most one per request), and an answer that cannot give a backend's figures refused, never read
as zeros. tests/roles/test_k8s_gateway_metrics.py runs the real HAProxy; its canary answers only 500."""

from __future__ import annotations

import re

import pytest

from infra.serving.metrics_text import exporter_figures

BACKENDS = ("inference", "inference_canary")


def exposition(backend: str, sessions: str, codes: dict[str, int], aborts: tuple[int, int], up: int) -> str:
    lines = [
        "# TYPE haproxy_backend_sessions_total counter",
        f'haproxy_backend_sessions_total{{proxy="{backend}"}} {sessions}',
        *(
            f'haproxy_backend_http_responses_total{{proxy="{backend}",code="{code}"}} {n}'
            for code, n in codes.items()
        ),
        f'haproxy_backend_client_aborts_total{{proxy="{backend}"}} {aborts[0]}',
        f'haproxy_backend_server_aborts_total{{proxy="{backend}"}} {aborts[1]}',
        f'haproxy_backend_active_servers{{proxy="{backend}"}} {up}',
        f'haproxy_backend_total_time_average_seconds{{proxy="{backend}"}} NaN',
        f'haproxy_server_sessions_total{{proxy="{backend}",server="replica-1"}} 999',
    ]
    return "\n".join(lines) + "\n"


def test_4xx_5xx_and_aborted_answers_are_failed_answers() -> None:
    text = exposition("inference", "100", {"2xx": 90, "4xx": 3, "5xx": 2, "other": 1}, (1, 0), 4)
    text += exposition("inference_canary", "20", {"2xx": 15, "4xx": 0, "5xx": 1}, (0, 4), 1)
    figures = exporter_figures(text, BACKENDS, 20)
    assert figures.requests == {"inference": 100, "inference_canary": 20}
    assert figures.errors == {"inference": 6, "inference_canary": 5}
    assert figures.servers_up == {"inference": 4, "inference_canary": 1}
    assert figures.canary_percent == 20


def test_failed_answers_are_at_most_the_requests() -> None:
    """An aborted request may also have its 5xx counted: no backend fails more requests than it took."""
    text = exposition("inference", "10", {"5xx": 10}, (3, 2), 1) + exposition(
        "inference_canary", "0", {}, (0, 0), 1
    )
    assert exporter_figures(text, BACKENDS, 5).errors == {"inference": 10, "inference_canary": 0}


def test_a_backend_the_exporter_does_not_list_is_refused_not_read_as_no_request() -> None:
    text = exposition("inference", "10", {"5xx": 1}, (0, 0), 1)
    with pytest.raises(ValueError, match="no haproxy_backend_sessions_total for backend inference_canary"):
        exporter_figures(text, BACKENDS, 5)


@pytest.mark.parametrize("value", ["NaN", "-1", "+Inf"])
def test_a_count_that_is_no_count_is_refused(value: str) -> None:
    text = exposition("inference", value, {}, (0, 0), 1) + exposition("inference_canary", "0", {}, (0, 0), 1)
    with pytest.raises(ValueError, match=re.escape(f"sessions_total of backend inference as {value}")):
        exporter_figures(text, BACKENDS, 5)
