"""Each canary server's load against each stable server's, at a share of the requests.

The gateway sends the canary `percent` of the requests, spread over its `canary` servers, and the rest over
the stable version's `stable` servers (least connections within each backend), so a canary server takes

    ratio = (percent / canary) / ((100 - percent) / stable)

times a stable server's requests: with serving.canary.gpus borrow on 8 replicas (1 canary, 7 stable) at
20 %, 0.20 / (0.80 / 7) = 1.75; on 2 replicas 0.25. A server's latency grows with its load (its queue, an
LLM engine's batch), so a busier canary reads slower than an identical stable server, and an idler one
faster. The analysis judges latency only where the canary is not busier than `LOAD_TOLERANCE` allows
(a slower reading then is the version's, not its load's), and a release judges it once at the share that
gives both versions' servers the same load (`equal_load_percent`) before it is promote-ready.
"""

from __future__ import annotations

import math

LOAD_TOLERANCE = 0.05
"""A canary server's load may exceed a stable server's by this share (0.05: 5 %) and its latency still be
judged: a share is a whole percent, and the one nearest equal load may load the canary a little more (8 %
beside 12 stable servers, 1.043 x); at a server busy half the time that reads 1.05 x slower in an M/M/1
queue, against max_latency_ratio's default 1.2 (benchmarks/canary_load.py)."""


def load_ratio(percent: int, canary: int, stable: int) -> float:
    """Each canary server's requests over each stable server's at `percent` (inf: the stable version has
    no requests or no server; 0: the canary none)."""
    if canary < 1 or not 0 <= percent <= 100:
        raise ValueError(
            f"a share of 0 to 100 % over at least one canary server, not {percent} % over {canary}"
        )
    if percent == 100 or stable < 1:
        return math.inf
    return (percent / canary) / ((100 - percent) / stable)


def both_serving(servers: tuple[int, int]) -> bool:
    """Whether each version (the canary's and the stable's servers up) has a server to take load: a version
    with none (its one server restarting) takes no load, and there is no ratio to weigh."""
    return min(servers) >= 1


def load_at(percent: int, servers: tuple[int, int] | None) -> float:
    """`load_ratio` at `percent` over `servers` (the canary's and the stable's up), 1 where a version has
    none counted up (nothing to weigh) or the canary has every request."""
    if servers is None or not both_serving(servers) or percent >= 100:
        return 1.0
    return load_ratio(percent, *servers)


def busier(ratio: float) -> bool:
    """Whether a canary server at `ratio` x a stable server's load is too busy to judge its latency by."""
    return ratio > 1 + LOAD_TOLERANCE


def equal(ratio: float) -> bool:
    """Whether both versions' servers take the same load, within LOAD_TOLERANCE either way."""
    return 1 / (1 + LOAD_TOLERANCE) <= ratio <= 1 + LOAD_TOLERANCE


def same_load(ratio: float, before: float) -> bool:
    """Whether latencies read at `ratio` may be pooled with ones read at `before` (each a canary server's
    load over a stable server's): within LOAD_TOLERANCE of each other either way, as `equal` weighs a share
    against equal load. A replica down, or autoscaling, moves the ratio at a fixed share (1 canary beside 7
    stable servers at 12 %: 0.955 x; beside 9: 1.23 x), and latencies read at one ratio are not evidence of
    the version at another."""
    if ratio == before:
        return True
    return 0 < ratio < math.inf and 0 < before < math.inf and equal(ratio / before)


def equal_load_percent(canary: int, stable: int) -> int | None:
    """The whole percent, 1 to 99, that loads the canary's servers most nearly as the stable's, `equal`
    within LOAD_TOLERANCE: the largest at which they are not busier where one is (12 % on 1 canary and 7
    stable servers, 0.955 x; 13 % would be 1.046 x), for a canary judged at a load a little under the
    stable's reads no slower for it, else the nearest. Where no whole percent is within LOAD_TOLERANCE
    (the gap between two whole percents passes 10 % of the load from about 10 stable servers per canary
    server: on 14, 6 % loads it 0.89 x and 7 % 1.05 x; on 40, 2 % 0.82 x and 3 % 1.24 x) the largest at
    which the canary is not busier: a slower canary judged at a little less load is still slower, if less
    surely caught, and without it a release whose shares all load the canary more never judges latency.
    None where even 1 % loads the canary more (more than about 100 stable servers per canary server)."""
    ratios = {p: load_ratio(p, canary, stable) for p in range(1, 100)}
    idler = [p for p, ratio in ratios.items() if ratio <= 1 and equal(ratio)]
    if idler:
        return max(idler)
    best = min(ratios, key=lambda p: abs(math.log(ratios[p])))
    if equal(ratios[best]):
        return best
    below = [p for p, ratio in ratios.items() if ratio <= 1]
    return max(below) if below else None


SPARSE_FACTOR = 2
"""How much longer still the intervals of the analysis the guard adds are where no whole percent loads the
canary's servers within LOAD_TOLERANCE of equal load, and it is analysed at the largest share that loads
them less (equal_load_percent): there a slower canary reads less slow (1.5 x at 0.83 x the load reads
about 1.28 x in an M/M/1 queue busy half the time, against max_latency_ratio 1.2) from fewer answers, and
borrow on 21 replicas at 10 requests/s through steps 5, 20, 50 % caught a 1.5 x slower canary in 194 of
200 releases (4 %, intervals of 75 s), and on 27 in 174 of 200 (3 %, 0.80 x, 100 s); with twice the answers
per interval, 200 and 193 of 200 (benchmarks/canary_load.py --pools, docs/serving.md). Length helps
little below about 0.8 x (2 % on 35 to 39 replicas, 38 to 184 of 200): there a 1.5 x slower canary reads
about max_latency_ratio or under in that model; that needs a finer share than a whole percent."""


def lengthened_interval_s(interval_s: int, percent: int, least: int, sparse: bool = False) -> int:
    """The interval of the analysis at `percent` that `with_equal_load_step` (infra/serving/carry.py) adds
    below `least`, the smallest share the stack sends the canary (its first step, or the share it was
    deployed with), which the plan checked against min_requests: longer by least / percent, so the canary
    answers as many requests per interval there as at `least` (3600 s at most, interval_s's bound). Without
    it, 6 % on 16 replicas at 2 requests/s (20 % accepted) answered about 7 of the 10 an interval needs:
    every release of an identical canary ended inconclusive (benchmarks, adversarial review 2026-12-07).
    `sparse`: the share is the one below equal load that whole percents leave (SPARSE_FACTOR longer
    still, above `least` too)."""
    factor = least / percent if 0 < percent < least else 1.0
    if sparse:
        factor *= SPARSE_FACTOR
    if factor == 1:
        return interval_s
    return min(3600, math.ceil(interval_s * factor))


def describe(percent: int, canary: int, stable: int) -> str:
    """The arithmetic of a share's load ratio, for a verdict's or a refusal's reason."""
    ratio = load_ratio(percent, canary, stable)
    return (
        f"at {percent} % each of the {canary} canary server(s) takes {percent / canary:.3g} % of the "
        f"requests and each of the {stable} stable server(s) {(100 - percent) / stable:.3g} %: "
        f"{ratio:.2f} x the load"
    )
