"""The tests a canary analysis runs: pure functions of counts, no I/O, standard library only.

- `error_rate_p`: is the canary's error rate above the stable's plus a margin (one-sided two-proportion z
  test, its variance taken at the null's boundary, as Farrington and Manning's score test does)?
- `slower_p`: is the canary slower (one-sided Mann-Whitney U on histogram bucket counts, each bucket one
  ordinal value, with the tie correction and a continuity correction)?
- `log_evidence`: the sequential test's evidence against "at most p0" from a Bernoulli count (a mixture of
  Wald's likelihood ratios over alternatives above p0), checked after every look.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def error_rate_p(
    canary_errors: int, canary_requests: int, stable_errors: int, stable_requests: int, margin: float
) -> float:
    """One-sided p-value of "the canary's error rate is at most the stable's plus `margin`"."""
    if canary_requests == 0:
        return 1.0
    stable_rate = stable_errors / stable_requests if stable_requests else 0.0
    bound = min(1.0, stable_rate + margin)
    excess = canary_errors / canary_requests - bound
    variance = bound * (1 - bound) / canary_requests + (
        stable_rate * (1 - stable_rate) / stable_requests if stable_requests else 0.0
    )
    if variance == 0.0:
        return 0.0 if excess > 0 else 1.0
    return normal_sf(excess / math.sqrt(variance))


def mann_whitney_u(canary: Sequence[int], stable: Sequence[int]) -> tuple[float, float]:
    """U of the canary against the stable (bucket counts over the same boundaries, fastest first: a tie
    counts one half) and its variance under "same distribution", corrected for ties."""
    if len(canary) != len(stable):
        raise ValueError(f"histograms over different buckets ({len(canary)} and {len(stable)})")
    n1, n2 = sum(canary), sum(stable)
    below = 0
    u = 0.0
    ties = 0
    for c, s in zip(canary, stable, strict=True):
        u += c * (below + s / 2)
        below += s
        t = c + s
        ties += t**3 - t
    n = n1 + n2
    if n < 2:
        return u, 0.0
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    return u, variance


def slower_p(canary: Sequence[int], stable: Sequence[int]) -> float:
    """One-sided p-value of "the canary is not slower than the stable" (normal approximation of U)."""
    u, variance = mann_whitney_u(canary, stable)
    if variance <= 0.0:
        return 1.0
    mean = sum(canary) * sum(stable) / 2
    return normal_sf((u - mean - 0.5) / math.sqrt(variance))


def log_likelihood_ratio(events: int, trials: int, p0: float, p1: float) -> float:
    """log of P(count | p1) / P(count | p0), `events` in `trials` Bernoulli draws (Wald 1945, section 3.1)."""
    return events * math.log(p1 / p0) + (trials - events) * math.log((1 - p1) / (1 - p0))


def alternatives(p0: float, count: int = 8) -> tuple[float, ...]:
    """Evenly spaced rates between p0 and 1 (both left out): the mixture's components."""
    return tuple(p0 + (1 - p0) * k / (count + 1) for k in range(1, count + 1))


def log_evidence(events: int, trials: int, p0: float) -> float:
    """log of the mean likelihood ratio over `alternatives(p0)`.

    Against a rate at most p0 each ratio is a nonnegative supermartingale with mean at most 1 (for p1 > p0
    a draw's expected ratio p*p1/p0 + (1-p)*(1-p1)/(1-p0) is at most 1 when p <= p0), and so is their
    mean; by Ville's inequality it ever reaches 1/alpha with probability at most alpha, however often it is
    looked at (Robbins 1970, "Statistical methods related to the law of the iterated logarithm", Ann. Math.
    Statist. 41(5):1397-1409, the mixture's boundary-crossing bound). Wald's upper boundary A <= (1 - beta)
    / alpha (Wald 1945, "Sequential tests of statistical hypotheses", Ann. Math. Statist. 16(2):117-186,
    section 3.2) with beta = 0 is this one: a test that never accepts, only rejects."""
    if p0 >= 1.0:
        return -math.inf
    p0 = max(p0, 1e-9)
    ratios = [log_likelihood_ratio(events, trials, p0, p1) for p1 in alternatives(p0)]
    top = max(ratios)
    return top + math.log(sum(math.exp(r - top) for r in ratios) / len(ratios))


def rollback_boundary(alpha: float) -> float:
    """The log evidence at which the sequential test rolls back: log(1 / alpha)."""
    return -math.log(alpha)
