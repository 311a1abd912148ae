"""The canary analysis (infra/serving/analysis.py) against simulated traffic: how often it rolls back or
blocks an identical canary, how often and how soon it catches a bad one (issue 48's goals).

Traffic as production records it: Poisson arrivals split at the gateway by a per-request draw (the canary's
share, serving.canary.share_percent), Bernoulli errors, lognormal latencies; the gateway's counters read at
every look of the guard (every 5 s), and so the model servers' latency histograms (the real bucket
boundaries; Release.latency_histograms reads each server's /metrics at the look, both versions at the same
instant). Load bursts are shared: in the "bursts" cases both versions' latencies are 3 x for 20 s, twice, at
random times; in the "cold start" case the canary's first 20 s are 3 x slower. An LLM's answers also have
token gaps (vLLM's inter-token latency histogram, the analysis' second latency test): each answer 64 tokens,
its gaps lognormal around a median of its own (so one slow answer gives many slow gaps; the answers'
medians spread wider in the "spread wider" cases), all recorded in the second it arrived. The analysis is
the real one, fed through its Guard, with the spec's defaults; "fixed intervals" is the same analysis with
the sequential tests switched off. Each verdict's exit code is what `gpuplat serve guard` exits with on it
(infra/cli/commands/serve.py _guard).

    nice -n 10 .venv/bin/python benchmarks/canary_analysis.py --runs 2000
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import typer

from infra.cli.commands.serve import _guard
from infra.serving.analysis import CONTINUE, INCONCLUSIVE, PROMOTE_READY, ROLLBACK, Guard, Verdict
from infra.serving.counts import Counts, Histogram
from infra.spec.models import Canary

# roles/inference_server/files/cpu_reference_server.py LATENCY_BUCKETS, and +Inf.
CPU_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1,
    1.5,
    2,
    3,
    5,
    10,
    30,
    math.inf,
)
# vllm:time_to_first_token_seconds (vllm/v1/metrics/loggers.py, histogram_time_to_first_token), and +Inf.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0, math.inf,
)  # fmt: skip
# vllm:inter_token_latency_seconds (vllm/v1/metrics/loggers.py, histogram_inter_token_latency), and +Inf.
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    math.inf,
)  # fmt: skip
LOOK_S = 5.0


@dataclass(frozen=True)
class TokenGaps:
    """An LLM answer's gaps between tokens: `tokens` per answer, each answer's median lognormal around
    `median_s` (sigma `answer_sigma`), each gap lognormal around its answer's (sigma `gap_sigma`)."""

    median_s: float = 0.040
    answer_sigma: float = 0.3
    gap_sigma: float = 0.3
    tokens: int = 64
    bounds: tuple[float, ...] = ITL_BUCKETS


LLM_GAPS = TokenGaps()
WIDE_GAPS = TokenGaps(answer_sigma=0.6)


@dataclass(frozen=True)
class Latency:
    """Lognormal latencies: median and sigma of the log, over a histogram's bucket bounds."""

    name: str
    median_s: float
    sigma: float
    bounds: tuple[float, ...]


EMBEDDER = Latency("embedder", 0.020, 0.4, CPU_BUCKETS)  # the CPU reference server: ~20 ms
LLM_TTFT = Latency("vLLM TTFT", 0.150, 0.6, TTFT_BUCKETS)
NARROW = Latency("narrow, median at a bucket edge", 0.025, 0.2, CPU_BUCKETS)  # issue 48's attack, finding 3


@dataclass(frozen=True)
class Case:
    name: str
    rate: float
    stable_errors: float
    canary_errors: float
    latency: Latency
    slowdown: float
    expected: str
    """the right verdict: promote-ready, rollback or inconclusive"""
    deadline_s: float | None = None
    """a rollback counts only this soon (None: within the analysis)"""
    bursts: int = 0
    """shared load bursts: both versions 3 x slower for 20 s, this many times"""
    cold_start_s: int = 0
    """the canary 3 x slower for its first this many seconds"""
    initial_delay_s: int = 0
    """serving.canary.initial_delay_s"""
    gaps: TokenGaps | None = None
    """an LLM's token gaps (None: an answer in one piece)"""
    gap_slowdown: float = 1.0
    """the canary's token gaps' multiple (its time to the first token: `slowdown`)"""


@dataclass
class Version:
    """One version's cumulative counters, per second."""

    requests: np.ndarray
    errors: np.ndarray
    buckets: np.ndarray
    sums: np.ndarray
    gap_buckets: np.ndarray | None = None
    gap_sums: np.ndarray | None = None
    gap_bounds: tuple[float, ...] = ()

    def at(self, second: int, bounds: tuple[float, ...]) -> Counts:
        latency = Histogram(bounds, tuple(int(c) for c in self.buckets[second]), float(self.sums[second]))
        itl = None
        if self.gap_buckets is not None and self.gap_sums is not None:
            itl = Histogram(
                self.gap_bounds,
                tuple(int(c) for c in self.gap_buckets[second]),
                float(self.gap_sums[second]),
            )
        return Counts(int(self.requests[second]), int(self.errors[second]), latency, itl)


def _per_second(
    rng_values: np.ndarray, seconds_of: np.ndarray, bounds: tuple[float, ...], seconds: int
) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative bucket counts and sums per second of `rng_values` observed at `seconds_of`."""
    bucket = np.searchsorted(np.array(bounds), rng_values, side="left")  # le: at most the bound
    per_second = np.zeros((seconds + 1, len(bounds)), dtype=np.int64)
    np.add.at(per_second, (seconds_of, bucket), 1)
    sums = np.zeros(seconds + 1)
    np.add.at(sums, seconds_of, rng_values)
    return np.cumsum(per_second, axis=0), np.cumsum(sums)


def simulate(
    rng: np.random.Generator,
    rate: float,
    error_rate: float,
    latency: Latency,
    slowdown: np.ndarray,
    seconds: int,
    gaps: TokenGaps | None = None,
    gap_slowdown: np.ndarray | None = None,
) -> Version:
    """`slowdown`: each second's latency multiple; `gap_slowdown`: its token gaps' (with `gaps`)."""
    requests = rng.poisson(rate, seconds + 1)
    requests[0] = 0
    errors = rng.binomial(requests, error_rate)
    total = int(requests.sum())
    seconds_of = np.repeat(np.arange(seconds + 1), requests)
    values = latency.median_s * slowdown[seconds_of] * np.exp(latency.sigma * rng.standard_normal(total))
    buckets, sums = _per_second(values, seconds_of, latency.bounds, seconds)
    version = Version(np.cumsum(requests), np.cumsum(errors), buckets, sums)
    if gaps is not None and gap_slowdown is not None:
        answer = (
            gaps.median_s * gap_slowdown[seconds_of] * np.exp(gaps.answer_sigma * rng.standard_normal(total))
        )
        each = np.repeat(answer, gaps.tokens - 1)
        gap_values = each * np.exp(gaps.gap_sigma * rng.standard_normal(each.size))
        version.gap_buckets, version.gap_sums = _per_second(
            gap_values, np.repeat(seconds_of, gaps.tokens - 1), gaps.bounds, seconds
        )
        version.gap_bounds = gaps.bounds
    return version


def run_once(rng: np.random.Generator, case: Case, rules: Canary) -> tuple[str, float]:
    """The verdict and the seconds after the canary's start it came."""
    rules = rules.model_copy(update={"initial_delay_s": case.initial_delay_s})
    seconds = int(rules.initial_delay_s + rules.analysis_s + 2 * LOOK_S)
    share = rules.share_percent / 100
    load = np.ones(seconds + 1)
    for _ in range(case.bursts):
        start = int(rng.uniform(0, seconds - 20))
        load[start : start + 20] = 3.0
    slower = load * case.slowdown
    slower[: case.cold_start_s + 1] *= 3.0
    slower_gaps = load * case.gap_slowdown
    slower_gaps[: case.cold_start_s + 1] *= 3.0
    stable = simulate(
        rng, case.rate * (1 - share), case.stable_errors, case.latency, load, seconds, case.gaps, load
    )
    canary = simulate(
        rng, case.rate * share, case.canary_errors, case.latency, slower, seconds, case.gaps, slower_gaps
    )
    bounds = case.latency.bounds
    guard = Guard(rules, 0.0, stable.at(0, bounds), canary.at(0, bounds))
    now = 0.0
    verdict = CONTINUE
    while now < rules.initial_delay_s + rules.analysis_s + LOOK_S:
        now += LOOK_S
        second = int(now)
        verdict = guard.look(now, stable.at(second, bounds), canary.at(second, bounds)).action
        if verdict != CONTINUE:
            return verdict, now
    return verdict, now


class Answered:
    """A release whose guard answers one verdict: what `gpuplat serve guard` exits with on it."""

    def __init__(self, action: str) -> None:
        self.action = action

    def guard(self, model: str, duration_s: float | None, past_gate: bool = False) -> Verdict:
        return Verdict(self.action, "simulated")


def exit_code(action: str) -> int:
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            _guard(Answered(action), "model", None)  # type: ignore[arg-type]
    except typer.Exit as ended:
        return int(ended.exit_code)
    return 0


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial confidence interval for k of n (bisection on the binomial distribution)."""

    def at_most(j: int, p: float) -> float:
        if p <= 0.0:
            return 1.0
        if p >= 1.0:
            return 1.0 if j >= n else 0.0
        return sum(
            math.exp(
                math.lgamma(n + 1)
                - math.lgamma(i + 1)
                - math.lgamma(n - i + 1)
                + i * math.log(p)
                + (n - i) * math.log1p(-p)
            )
            for i in range(j + 1)
        )

    def solve(falls: bool, value_of: float, target: float) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if (at_most(int(value_of), mid) > target) == falls:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    tail = (1 - level) / 2
    lower = 0.0 if k == 0 else solve(True, k - 1, 1 - tail)  # P(X >= k) = tail
    upper = 1.0 if k == n else solve(True, k, tail)  # P(X <= k) = tail
    return lower, upper


def cases() -> list[Case]:
    found = [
        Case(
            f"identical, {rate:g} req/s, {errors:.0%} errors",
            rate,
            errors,
            errors,
            EMBEDDER,
            1.0,
            expected=PROMOTE_READY,
        )
        for rate in (2, 10, 50)
        for errors in (0.0, 0.01, 0.02)
    ]
    found += [
        Case(
            "identical LLM (TTFT + ITL), 2 req/s, 1% errors",
            2,
            0.01,
            0.01,
            LLM_TTFT,
            1.0,
            expected=PROMOTE_READY,
            gaps=LLM_GAPS,
        ),
        Case(
            "identical, 50 req/s, 1% errors, shared bursts",
            50,
            0.01,
            0.01,
            EMBEDDER,
            1.0,
            expected=PROMOTE_READY,
            bursts=2,
        ),
        Case(
            "identical LLM (TTFT + ITL), 10 req/s, shared bursts",
            10,
            0.01,
            0.01,
            LLM_TTFT,
            1.0,
            expected=PROMOTE_READY,
            bursts=2,
            gaps=LLM_GAPS,
        ),
        Case("1.1x slower (within 1.2), 50 req/s", 50, 0.0, 0.0, EMBEDDER, 1.1, expected=PROMOTE_READY),
        Case(
            "1.1x slower (within 1.2), narrow at a bucket edge, 50 req/s",
            50,
            0.0,
            0.0,
            NARROW,
            1.1,
            expected=PROMOTE_READY,
        ),
        Case(
            "identical, cold start (3x for 20 s), 10 req/s",
            10,
            0.01,
            0.01,
            EMBEDDER,
            1.0,
            expected=PROMOTE_READY,
            cold_start_s=20,
        ),
        Case(
            "identical, cold start (3x for 20 s), 10 req/s, initial_delay_s 30",
            10,
            0.01,
            0.01,
            EMBEDDER,
            1.0,
            expected=PROMOTE_READY,
            cold_start_s=20,
            initial_delay_s=30,
        ),
        Case("1.5x slower, 10 req/s, no errors", 10, 0.0, 0.0, EMBEDDER, 1.5, expected=ROLLBACK),
        Case(
            "1.5x slower TTFT (LLM), 10 req/s", 10, 0.0, 0.0, LLM_TTFT, 1.5, expected=ROLLBACK, gaps=LLM_GAPS
        ),
        Case(
            "1.5x slower ITL, same TTFT (LLM), 10 req/s",
            10,
            0.0,
            0.0,
            LLM_TTFT,
            1.0,
            expected=ROLLBACK,
            gaps=LLM_GAPS,
            gap_slowdown=1.5,
        ),
        Case(
            "1.1x slower ITL (within 1.2), LLM, 10 req/s",
            10,
            0.0,
            0.0,
            LLM_TTFT,
            1.0,
            expected=PROMOTE_READY,
            gaps=LLM_GAPS,
            gap_slowdown=1.1,
        ),
        Case("failing every request, 1 req/s", 1, 0.0, 1.0, EMBEDDER, 1.0, expected=ROLLBACK, deadline_s=60),
        Case(
            "failing every request, 1 req/s, 2% base",
            1,
            0.02,
            1.0,
            EMBEDDER,
            1.0,
            expected=ROLLBACK,
            deadline_s=60,
        ),
        Case(
            "identical, 0.3 req/s: too little traffic", 0.3, 0.01, 0.01, EMBEDDER, 1.0, expected=INCONCLUSIVE
        ),
    ]
    # Answers whose gaps differ more from one answer to the next (batch load, context length): the
    # inter-token latency test must weigh an answer's gaps as one observation (they are alike).
    by_name = {case.name: case for case in found}
    found += [
        replace(by_name[f"{name}{at}"], name=f"{name}, answers' gaps spread wider{at}", gaps=WIDE_GAPS)
        for name, at in (
            ("identical LLM (TTFT + ITL)", ", 2 req/s, 1% errors"),
            ("1.5x slower ITL, same TTFT (LLM)", ", 10 req/s"),
        )
    ]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="runs per case")
    parser.add_argument("--seed", type=int, default=48)
    parser.add_argument("--only", default="", help="the cases whose name this regular expression finds")
    args = parser.parse_args(argv)
    rules = Canary()
    fixed = Canary(sequential_alpha=1e-300)
    rng = np.random.default_rng(args.seed)
    print(
        f"{time.strftime('%Y-%m-%d')}, {args.runs} runs per case; serving.canary defaults: share "
        f"{rules.share_percent} %, {rules.intervals} x {rules.interval_s} s, failure_limit "
        f"{rules.failure_limit}, "
        f"inconclusive_limit {rules.inconclusive_limit}, alpha {rules.alpha}, sequential_alpha "
        f"{rules.sequential_alpha}, min_requests {rules.min_requests}"
    )
    print(
        "| case | wrong verdicts (95 % CI) | rolled back | blocked | median s to rollback (fixed intervals) "
        "| exit codes |"
    )
    print("|---|---|---|---|---|---|")
    codes = {action: exit_code(action) for action in (PROMOTE_READY, ROLLBACK, INCONCLUSIVE, CONTINUE)}
    assert codes[PROMOTE_READY] == 0 and all(codes[a] for a in codes if a != PROMOTE_READY), codes
    for case in (c for c in cases() if re.search(args.only, c.name)):
        outcomes: dict[str, int] = {}
        times: list[float] = []
        fixed_times: list[float] = []
        wrong = 0
        for _ in range(args.runs):
            verdict, at = run_once(rng, case, rules)
            outcomes[verdict] = outcomes.get(verdict, 0) + 1
            if case.expected == ROLLBACK:
                caught = verdict == ROLLBACK and (case.deadline_s is None or at <= case.deadline_s)
                wrong += not caught
                if verdict == ROLLBACK:
                    times.append(at)
                fixed_verdict, fixed_at = run_once(rng, case, fixed)
                if fixed_verdict == ROLLBACK:
                    fixed_times.append(fixed_at)
            else:
                wrong += verdict != case.expected
        low, high = clopper_pearson(wrong, args.runs)
        blocked = args.runs - outcomes.get(ROLLBACK, 0) - outcomes.get("promote-ready", 0)
        timing = "-"
        if case.expected == ROLLBACK:
            fixed_median = f"{float(np.median(fixed_times)):.0f}" if fixed_times else "never"
            timing = f"{float(np.median(times)):.0f} ({fixed_median})" if times else "never"
        exits: dict[int, int] = {}
        for action, runs in outcomes.items():
            exits[codes[action]] = exits.get(codes[action], 0) + runs
        print(
            f"| {case.name} | {wrong}/{args.runs} = {wrong / args.runs:.2%} ({low:.2%}-{high:.2%}) | "
            f"{outcomes.get(ROLLBACK, 0)} | {blocked} | {timing} | "
            + ", ".join(f"{code}: {runs}" for code, runs in sorted(exits.items()))
            + " |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
