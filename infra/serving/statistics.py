"""The tests a canary analysis runs: pure functions of counts, no I/O, standard library only.

- `rate_upper_bound`: an upper confidence bound of the stable version's error rate that holds at every
  look at once (a confidence sequence from a mixture of Wald's likelihood ratios over rates below the
  bound): an interval's test compares the canary with it, not with the stable's observed rate, which may
  be low by chance;
- `error_rate_p`: an exact one-sided binomial test of "the canary's error rate is at most that bound plus
  a margin" (its size at most alpha for every count, however small);
- `slower_p`: is the canary slower (one-sided Mann-Whitney U on histogram bucket counts, each bucket one
  ordinal value, with the tie correction and a continuity correction)?
- `log_evidence_above`: the sequential tests' evidence against "the canary's rate is at most the stable's
  plus a margin" from both versions' counts since the canary started, checked after every look.
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


def mann_whitney_u(canary: Sequence[float], stable: Sequence[float]) -> tuple[float, float]:
    """U of the canary against the stable (bucket counts over the same boundaries, fastest first: a tie
    counts one half) and its variance under "same distribution", corrected for ties."""
    if len(canary) != len(stable):
        raise ValueError(f"histograms over different buckets ({len(canary)} and {len(stable)})")
    n1, n2 = sum(canary), sum(stable)
    below = 0.0
    u = 0.0
    ties = 0.0
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


def slower_p(canary: Sequence[float], stable: Sequence[float]) -> float:
    """One-sided p-value of "the canary is not slower than the stable" (normal approximation of U)."""
    u, variance = mann_whitney_u(canary, stable)
    if variance <= 0.0:
        return 1.0
    mean = sum(canary) * sum(stable) / 2
    return normal_sf((u - mean - 0.5) / math.sqrt(variance))


def log_likelihood_ratio(events: int, trials: int, p0: float, p1: float) -> float:
    """log of P(count | p1) / P(count | p0), `events` in `trials` Bernoulli draws (Wald 1945, section 3.1)."""
    return events * math.log(p1 / p0) + (trials - events) * math.log((1 - p1) / (1 - p0))


def _log_mean(ratios: Sequence[float]) -> float:
    top = max(ratios)
    return top + math.log(sum(math.exp(r - top) for r in ratios) / len(ratios))


def log_evidence_below(events: int, trials: int, p: float) -> float:
    """log of the mean likelihood ratio of the rates p * k / 9 (k = 1..8) against p: the evidence that the
    rate is below p. Against a rate at least p it is a nonnegative supermartingale (a draw's expected ratio
    r*q/p + (1-r)*(1-q)/(1-p) is at most 1 for q < p <= r; by Ville's inequality it ever reaches 1/alpha
    with probability at most alpha, however often it is looked at), and it grows with p at any count (each
    ratio's derivative in p, (trials - events) * (1/(1-p) - c/(1-c*p)) with q = c*p, is not negative)."""
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


JEFFREYS = 0.5
"""The mixture's prior on each version's rate: Beta(1/2, 1/2), weighted towards rates near 0 and 1 (a stable
version failing nothing, a canary failing everything), where a canary's first answers must decide."""


def _log_likelihood(events: int, trials: int, p: float) -> float:
    """log P(these `events` in `trials` Bernoulli draws at rate p, in their order); 0 log 0 is 0."""
    total = 0.0
    if events:
        total += events * math.log(p) if p > 0.0 else -math.inf
    if trials - events:
        total += (trials - events) * math.log1p(-p) if p < 1.0 else -math.inf
    return total


def _log_marginal(events: int, trials: int) -> float:
    """log of the likelihood averaged over the prior Beta(a, a), a = JEFFREYS: B(k+a, n-k+a) / B(a, a)."""

    def log_beta(a: float, b: float) -> float:
        return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)

    return log_beta(events + JEFFREYS, trials - events + JEFFREYS) - log_beta(JEFFREYS, JEFFREYS)


def _log_null_maximum(
    canary_events: int, canary_trials: int, stable_events: int, stable_trials: int, margin: float
) -> float:
    """The largest log likelihood of both counts with the canary's rate at most the stable's plus `margin`.
    Unless the observed rates already meet that, the maximum lies on the boundary (canary = stable +
    margin), where the log likelihood is concave in the stable's rate x on [0, 1 - margin]: its derivative
    is found zero by bisection, and the ends are candidates too."""
    canary_rate = canary_events / canary_trials if canary_trials else 0.0
    stable_rate = stable_events / stable_trials if stable_trials else 0.0
    if canary_rate <= stable_rate + margin:
        return _log_likelihood(canary_events, canary_trials, canary_rate) + _log_likelihood(
            stable_events, stable_trials, stable_rate
        )

    def on_boundary(x: float) -> float:
        return _log_likelihood(canary_events, canary_trials, x + margin) + _log_likelihood(
            stable_events, stable_trials, x
        )

    def slope(x: float) -> float:
        canary_ok, stable_ok = canary_trials - canary_events, stable_trials - stable_events
        return (
            (canary_events / (x + margin) if canary_events else 0.0)
            - (canary_ok / (1 - x - margin) if canary_ok else 0.0)
            + (stable_events / x if stable_events else 0.0)
            - (stable_ok / (1 - x) if stable_ok else 0.0)
        )

    low, high = 0.0, 1.0 - margin
    for _ in range(50):
        middle = (low + high) / 2
        if slope(middle) > 0:
            low = middle
        else:
            high = middle
    return max(on_boundary((low + high) / 2), on_boundary(0.0), on_boundary(1.0 - margin))


def log_evidence_above(
    canary_events: int, canary_trials: int, stable_events: int, stable_trials: int, margin: float
) -> float:
    """log of the evidence that the canary's rate is above the stable's plus `margin` (margin < 1): the
    likelihood of both counts averaged over independent Beta(1/2, 1/2) priors on the two rates, over its
    largest value with the canary's rate at most the stable's plus `margin` (universal inference: Wasserman,
    Ramdas and Balakrishnan 2020, "Universal inference", PNAS 117(29):16880-16890).

    For any pair of rates that meets the null hypothesis this is at most the mixture's likelihood ratio
    against that pair, a nonnegative martingale of mean 1 under it as requests come in (in any split
    between the versions, drawn independently of the answers); by Ville's inequality it ever reaches
    1/alpha with probability at most alpha, however often it is looked at. One test, not a bound on the
    stable's rate and a test against it each at half the level: a canary failing its first 4 answers
    against a stable that failed none of its 48 is evidence 2339, past 1/alpha at the default 0.002."""
    return (
        _log_marginal(canary_events, canary_trials)
        + _log_marginal(stable_events, stable_trials)
        - _log_null_maximum(canary_events, canary_trials, stable_events, stable_trials, margin)
    )
