"""What one version answered, as counters record it: the gateways' requests and error answers, and the
model servers' latency histograms (Prometheus bucket counts and _sum): the time to the first token, and
for an LLM engine the inter-token latency. Readings are cumulative since a
process started; the analysis works on differences since the canary started.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Histogram:
    """Observations per bucket (not cumulative), over upper bounds ending with +Inf, and their sum."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum_s: float = 0.0

    @classmethod
    def from_cumulative(cls, cumulative: dict[float, float], sum_s: float) -> Histogram:
        """From Prometheus' `le` series (each counts the observations at most its bound)."""
        bounds = tuple(sorted(cumulative))
        running = [round(cumulative[b]) for b in bounds]
        counts = tuple(running[i] - (running[i - 1] if i else 0) for i in range(len(bounds)))
        return cls(bounds, counts, sum_s)

    @property
    def count(self) -> int:
        return sum(self.counts)

    @property
    def mean_s(self) -> float | None:
        return self.sum_s / self.count if self.count else None

    def plus(self, other: Histogram) -> Histogram:
        self._same_bounds(other)
        return Histogram(
            self.bounds,
            tuple(a + b for a, b in zip(self.counts, other.counts, strict=True)),
            self.sum_s + other.sum_s,
        )

    def minus(self, earlier: Histogram) -> Histogram:
        self._same_bounds(earlier)
        return Histogram(
            self.bounds,
            tuple(a - b for a, b in zip(self.counts, earlier.counts, strict=True)),
            self.sum_s - earlier.sum_s,
        )

    def to_json(self) -> dict[str, Any]:
        """As JSON holds it (+Inf, which JSON has no number for, as null)."""
        bounds = [None if math.isinf(b) else b for b in self.bounds]
        return {"bounds": bounds, "counts": list(self.counts), "sum_s": self.sum_s}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Histogram:
        bounds = tuple(math.inf if b is None else float(b) for b in data["bounds"])
        return cls(bounds, tuple(int(c) for c in data["counts"]), float(data["sum_s"]))

    def _same_bounds(self, other: Histogram) -> None:
        if other.bounds != self.bounds:
            raise ValueError(f"histograms over different buckets: {self.bounds} and {other.bounds}")


@dataclass(frozen=True)
class Counts:
    """One version's requests, 5xx answers, latency histogram and inter-token latency histogram (None: no
    series seen; an engine that streams no tokens has no inter-token latency)."""

    requests: int = 0
    errors: int = 0
    latency: Histogram | None = None
    itl: Histogram | None = None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"requests": self.requests, "errors": self.errors}
        for name in ("latency", "itl"):
            histogram: Histogram | None = getattr(self, name)
            found[name] = None if histogram is None else histogram.to_json()
        return found

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Counts:
        latency, itl = data.get("latency"), data.get("itl")
        return cls(
            int(data["requests"]),
            int(data["errors"]),
            None if latency is None else Histogram.from_json(latency),
            None if itl is None else Histogram.from_json(itl),
        )

    def plus(self, other: Counts) -> Counts:
        return Counts(
            self.requests + other.requests,
            self.errors + other.errors,
            _add(self.latency, other.latency),
            _add(self.itl, other.itl),
        )

    def minus(self, earlier: Counts) -> Counts:
        return Counts(
            self.requests - earlier.requests,
            self.errors - earlier.errors,
            _minus(self.latency, earlier.latency),
            _minus(self.itl, earlier.itl),
        )

    def increase(self, earlier: Counts) -> Counts:
        """What was answered between two readings. A counter that went down restarted (an HAProxy reload, a
        model server's restart): it counts from zero, as Prometheus' increase() does."""
        requests, errors = self.requests - earlier.requests, self.errors - earlier.errors
        if requests < 0 or errors < 0:
            requests, errors = self.requests, self.errors
        return Counts(
            requests, errors, _increase(self.latency, earlier.latency), _increase(self.itl, earlier.itl)
        )


def _add(a: Histogram | None, b: Histogram | None) -> Histogram | None:
    if a is None or b is None:
        return a or b
    return a.plus(b)


def _minus(now: Histogram | None, earlier: Histogram | None) -> Histogram | None:
    return now if now is None or earlier is None else now.minus(earlier)


def _increase(now: Histogram | None, earlier: Histogram | None) -> Histogram | None:
    """A histogram's observations between two readings; all of `now` where a bucket went down (restarted)."""
    if now is None or earlier is None:
        return now
    step = now.minus(earlier)
    return now if min(step.counts) < 0 else step


Series = Mapping[str, Histogram]
"""One version's latency histograms as read, cumulative, by series (a model server's instance)."""


@dataclass(frozen=True)
class Reading:
    """One version's counters as read: the gateways' requests and errors (their sums), each gateway's own
    (None: the sums are one gateway's), and each of its model servers' latency and inter-token latency
    histograms (None: none read this time)."""

    requests: int = 0
    errors: int = 0
    latency: Series | None = None
    gateways: Mapping[str, Counts] | None = None
    itl: Series | None = None

    @classmethod
    def of_gateways(
        cls, gateways: Mapping[str, Counts], latency: Series | None, itl: Series | None = None
    ) -> Reading:
        return cls(
            sum(c.requests for c in gateways.values()),
            sum(c.errors for c in gateways.values()),
            latency,
            gateways,
            itl,
        )

    def by_gateway(self) -> dict[str, Counts]:
        if self.gateways is None:
            return {"": Counts(self.requests, self.errors)}
        return dict(self.gateways)

    @classmethod
    def of(cls, counts: Counts | Reading) -> Reading:
        """A reading; each of Counts' histograms as one series."""
        if isinstance(counts, Reading):
            return counts
        return cls(
            counts.requests,
            counts.errors,
            None if counts.latency is None else {"": counts.latency},
            itl=None if counts.itl is None else {"": counts.itl},
        )


class SinceStart:
    """A version's counts since the first reading (the canary's start), through counter restarts.

    Gateway by gateway and latencies series by series, as Prometheus' increase() does on each series before
    a sum: a counter that went down restarted (one gateway's reload) and counts from zero; one missing from
    a reading (a gateway or replica that did not answer) is no reading, its last value kept; one first seen
    after the start counts from then."""

    def __init__(self, first: Counts | Reading) -> None:
        first = Reading.of(first)
        self._gateways = first.by_gateway()
        self._series: dict[str, Histogram] = dict(first.latency or {})
        self._itl_series: dict[str, Histogram] = dict(first.itl or {})
        self.total = Counts()

    def to_json(self) -> dict[str, Any]:
        """Everything it holds (the last counters seen, the total since the start): `from_json` of it goes
        on counting where this one stood."""
        return {
            "gateways": {name: counts.to_json() for name, counts in self._gateways.items()},
            "series": {name: histogram.to_json() for name, histogram in self._series.items()},
            "itl_series": {name: histogram.to_json() for name, histogram in self._itl_series.items()},
            "total": self.total.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SinceStart:
        since = cls(Counts())
        since._gateways = {name: Counts.from_json(c) for name, c in data["gateways"].items()}
        since._series = {name: Histogram.from_json(h) for name, h in data["series"].items()}
        since._itl_series = {name: Histogram.from_json(h) for name, h in data.get("itl_series", {}).items()}
        since.total = Counts.from_json(data["total"])
        return since

    def add(self, reading: Counts | Reading) -> Counts:
        """The total after `reading`."""
        reading = Reading.of(reading)
        gateways = dict(self._gateways)
        requests = errors = 0
        for name, counters in reading.by_gateway().items():
            before = gateways.get(name)
            gateways[name] = counters
            if before is not None:
                step = counters.increase(before)
                # A gateway counts a failed answer under each of its status and its abort (a 5xx cut off is
                # both): between two readings never more failures than answers.
                requests, errors = requests + step.requests, errors + min(step.errors, step.requests)
        latency, series = _series_increase(self._series, reading.latency)
        itl, itl_series = _series_increase(self._itl_series, reading.itl)
        total = self.total.plus(Counts(requests, errors, latency, itl))
        self._gateways, self._series, self._itl_series, self.total = gateways, series, itl_series, total
        return total


def _series_increase(
    last_seen: dict[str, Histogram], read: Series | None
) -> tuple[Histogram | None, dict[str, Histogram]]:
    """The observations of every series since its last reading (one first seen counts from then; one that
    restarted, from zero), and the series as last seen now."""
    increase: Histogram | None = None
    series = dict(last_seen)
    for name, histogram in (read or {}).items():
        last = series.get(name)
        series[name] = histogram
        if last is None:
            continue
        if histogram.bounds != last.bounds:  # restarted with other buckets: counts from zero
            increase = _add(increase, histogram)
            continue
        increase = _add(increase, _increase(histogram, last))
    return increase, series
