"""The tests a canary analysis runs: pure functions of counts, no I/O, standard library only.

- `rate_upper_bound`: an upper confidence bound of the stable version's error rate (or share of slow
  answers) that holds at every look at once (a confidence sequence, from the same mixture of Wald's
  likelihood ratios as `log_evidence`, over rates below the bound): the canary is compared with it, not
  with the stable's observed rate, which may be low by chance;
- `error_rate_p`: an exact one-sided binomial test of "the canary's error rate is at most that bound plus
  a margin" (its size at most alpha for every count, however small);
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


def _log_pmf(k: int, n: int, p: float) -> float:
    return (
        math.lgamma(n + 1)
        - math.lgamma(k + 1)
        - math.lgamma(n - k + 1)
        + k * math.log(p)
        + (n - k) * math.log1p(-p)
    )


def binomial_sf(events: int, trials: int, p: float) -> float:
    """P(X >= events) for X binomial(trials, p), summed from its pmf (the shorter tail, from the mode out,
    until the terms no longer count)."""
    if events <= 0:
        return 1.0
    if events > trials or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    upper = events > trials * p
    ks = range(events, trials + 1) if upper else range(events - 1, -1, -1)
    total = 0.0
    for k in ks:
        term = math.exp(_log_pmf(k, trials, p))
        total += term
        if term < total * 1e-17:
            break
    return min(1.0, total) if upper else max(0.0, 1.0 - total)


def error_rate_p(canary_errors: int, canary_requests: int, p0: float) -> float:
    """One-sided exact binomial p-value of "the canary's error rate is at most p0": P(X >= canary_errors),
    X binomial(canary_requests, p0). Its size is at most alpha at every count (no normal approximation)."""
    if canary_requests == 0:
        return 1.0
    return binomial_sf(canary_errors, canary_requests, min(1.0, p0))


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


def _log_mean(ratios: Sequence[float]) -> float:
    top = max(ratios)
    return top + math.log(sum(math.exp(r - top) for r in ratios) / len(ratios))


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
    return _log_mean([log_likelihood_ratio(events, trials, p0, p1) for p1 in alternatives(p0)])


def log_evidence_below(events: int, trials: int, p: float) -> float:
    """log of the mean likelihood ratio of the rates p * k / 9 (k = 1..8) against p: the evidence that the
    rate is below p. Against a rate at least p it is a nonnegative supermartingale (a draw's expected ratio
    r*q/p + (1-r)*(1-q)/(1-p) is at most 1 for q < p <= r), and it grows with p at any count (each ratio's
    derivative in p, (trials - events) * (1/(1-p) - c/(1-c*p)) with q = c*p, is not negative)."""
    if p <= 0.0:
        return -math.inf
    if p >= 1.0:
        return math.inf if events < trials else -math.inf
    return _log_mean([log_likelihood_ratio(events, trials, p, q) for q in (p * k / 9 for k in range(1, 9))])


def rate_upper_bound(events: int, trials: int, alpha: float) -> float:
    """The least rate p whose `log_evidence_below` reaches log(1/alpha) (bisection; 1 if none): an upper
    confidence bound on the rate that holds at every look at once with probability at least 1 - alpha
    (Ville's inequality on the martingale at the true rate; Howard, Ramdas, McAuliffe and Sekhon 2021,
    "Time-uniform, nonparametric, nonasymptotic confidence sequences", Ann. Statist. 49(2):1055-1080,
    confidence sequences by inverting such tests)."""
    boundary = rollback_boundary(alpha)
    low, high = events / trials if trials else 0.0, 1.0
    if trials == 0 or events >= trials:
        return 1.0
    for _ in range(40):
        middle = (low + high) / 2
        if log_evidence_below(events, trials, middle) >= boundary:
            high = middle
        else:
            low = middle
    return high


def rollback_boundary(alpha: float) -> float:
    """The log evidence at which the sequential test rolls back: log(1 / alpha)."""
    return -math.log(alpha)
