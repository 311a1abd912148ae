"""A canary carried by a command in the foreground (`serve deploy --guard-s`, `serve guard`): its analysis
(infra/serving/analysis.py Guard) fed with the counters every few seconds, rolled back on a rollback
verdict, or carried through serving.canary.steps. One loop for every backend: what differs (where the
counters are read, how a share is set, promoted, rolled back and recorded) is the `Carried` it drives: the
nodes' Release (infra/serving/release.py), a Kueue stack's cluster from the operator's machine
(infra/serving/on_kubernetes.py) or from the guard Job inside it (infra/serving/guard_job.py). The standard
library only, as the Job's zip application carries it: the settings it reads are any object with the
analysis' fields and `steps` (the spec's serving.canary, or the values the CLI wrote for the Job).

Each server's load (infra/serving/load.py): where the canary's share does not load its servers as the
stable's, the loop adds an analysis at the share that does (`with_equal_load_step`), and judges the
canary's latency only where its servers are not busier than a stable one; the servers up it weighs the
load by are the `Carried`'s (`servers_up`), for every backend alike, read again at every look
(`ServersUp`): a replica down or autoscaling moves the load ratio at a fixed share, and where it moves
beyond what load.same_load pools, the latency evidence read at the other ratio is dropped
(analysis.Analysis.reweigh); in the analysis the loop added, the share follows the servers to the one
that loads them alike now.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

from infra.errors import ExitCode, GpuPlatError
from infra.serving.analysis import CONTINUE, PROMOTE_READY, ROLLBACK, Canary, Guard, RulesRead, Verdict
from infra.serving.counts import Counts, Reading
from infra.serving.load import (
    both_serving,
    describe,
    equal_load_percent,
    lengthened_interval_s,
    load_at,
    same_load,
)
from infra.serving.load import equal as equal_loads

PROMOTED, GATED = "promoted", "gated"
"""a stepped release's ends besides the analysis' verdicts: its last step (100 %) promoted the canary; a step
with a manual gate passed, the release held there"""
ROLLED_BACK = "rolled back"
"""the record's phase once a rollback (the guard's or an operator's) took the canary out"""
LOOK_TRIES = 3
"""looks in a row the guard may fail to read the counters (or add them) before it gives up, exit 5"""


class Stopped(GpuPlatError):
    """An error that ends the guard at once (another command carries the release now): never counted as a
    failed look."""


class Step(Protocol):
    """One of serving.canary.steps (infra/spec/models.py CanaryStep) as the loop reads it."""

    @property
    def percent(self) -> int: ...
    @property
    def manual_gate(self) -> bool: ...


class Rules(Canary, Protocol):
    """serving.canary as the loop reads it: the analysis' settings and the steps."""

    @property
    def steps(self) -> Sequence[Step]: ...


class Promoted(Protocol):
    @property
    def reference(self) -> str: ...


class Carried(Protocol):
    """A backend's release as the guard drives it."""

    @property
    def rules(self) -> Rules: ...
    @property
    def lease_s(self) -> float: ...

    canary_start: tuple[float, Counts | Reading, Counts | Reading] | None
    """when the canary's share last moved, and the counters just before (None: count from the first look)"""

    def say(self, line: str) -> None: ...
    def has_canary(self, model: str) -> bool: ...
    def share(self) -> int: ...
    def servers_up(self) -> tuple[int, int]:
        """The canary's servers and the stable's up, as the gateways count them: what a share spreads
        over (infra/serving/load.py); (0, 0) where none is counted, and no load is weighed."""
        ...

    def counters(self) -> tuple[Reading, Reading]: ...
    def set_share(self, percent: int) -> None: ...
    def promote(self, model: str) -> Promoted: ...
    def rollback(self, model: str, reason: str = "asked for") -> object: ...
    def record(self, model: str, phase: str, detail: str, percent: int | None = None) -> None: ...
    def lock_lost(self, model: str) -> bool: ...


S = TypeVar("S", bound=Step)


@runtime_checkable
class Keeping(Protocol):
    """A Carried that keeps the analysis' evidence where a restart of the process finds it (the guard Job:
    a pod restarted mid-release resumes its counts instead of starting over)."""

    def saved_watch(self, rules: Canary) -> Guard | None:
        """The analysis of the share the canary has now, as last kept, under `rules` (its step's:
        `step_rules`); None: start one."""
        ...

    def keep(self, watch: Guard, verdict: Verdict) -> None:
        """After each look: the analysis and its verdict so far, kept whole."""
        ...


def steps_ahead(steps: Sequence[S], share: int, past_gate: bool) -> list[tuple[int, S]]:
    """The steps (numbered from 1) a release at `share` goes through: from the first at or above it (above
    it with `past_gate`: the gate the last step held at opened)."""
    return [
        (number, step)
        for number, step in enumerate(steps, 1)
        if step.percent > share or (step.percent == share and not past_gate)
    ]


class ServersUp:
    """The servers up (`Carried.servers_up`), read again at each look. A read that fails keeps the last count
    for that one look: the servers up come from the same gateways as the counters, whose one failed read a
    look survives too (LOOK_TRIES), and a count one look old pools at most one look's latencies (5 s of an
    interval of 60) read at a ratio that may have moved; a second failure in a row fails the look, which
    then counts towards LOOK_TRIES, rather than weighing the load by a count that may be long gone."""

    def __init__(self, release: Carried, first: tuple[int, int]) -> None:
        self.release = release
        self.last = first
        self.missed = False

    def read(self) -> tuple[int, int]:
        try:
            up = self.release.servers_up()
        except Stopped:
            raise
        except (GpuPlatError, ValueError, KeyError) as error:
            if self.missed:
                raise
            self.missed = True
            reason = error.message if isinstance(error, GpuPlatError) else f"{type(error).__name__}: {error}"
            self.release.say(
                f"the servers up not read this look ({reason}): the load weighed by the last count, "
                f"{self.last[0]} canary and {self.last[1]} stable"
            )
            return self.last
        self.missed = False
        if not both_serving(up) and both_serving(self.last):
            # A version with no server up (its one server restarting) takes no load: the count before it
            # goes on weighing the load, and the next step starts from it (not from load.load_at's 1.00 x).
            return self.last
        self.last = up
        return up


@dataclass
class Weighing:
    """What a step's analysis weighs each server's load by: the canary's `share`, the servers up read again
    at each look, and whether the share follows them to the one that loads both versions' servers alike
    (`follows`: the analysis the loop added, EQUAL_LOAD_STEP); `share` is the one it ends at."""

    share: int
    servers: ServersUp
    follows: bool = False


EQUAL_LOAD_STEP = 0
"""The number of the step `with_equal_load_step` adds (the stack's steps are numbered from 1)."""


@dataclass(frozen=True)
class AddedStep:
    """A Step the loop adds (EQUAL_LOAD_STEP): an analysis at `percent`, no gate."""

    percent: int
    manual_gate: bool = False


def equal_load_share(servers: tuple[int, int]) -> int | None:
    """The share that loads the canary's servers as the stable's (load.equal_load_percent) over `servers`
    (the canary's and the stable's up); None where a version has none counted up, or no share does."""
    return equal_load_percent(*servers) if both_serving(servers) else None


def with_equal_load_step(
    ahead: Sequence[tuple[int, Step]], share: int, equal: int | None
) -> list[tuple[int, Step]]:
    """A release's steps ahead (numbered, rising) with an analysis at `equal`, the share that loads both
    versions' servers alike: the only analysis whose latency test both catches a slower canary and clears
    an identical one. It comes before the first step above it, but after the step the canary is at now
    (`share`: its analysis goes on from the counts it has), and last where no step reaches it. Unchanged
    where a step ahead is at `equal`, or there is no such share (None). Without steps (`ahead` empty) the
    release is one analysis at `share` (none at 0), then the equal-load one; the guard puts the share back
    to `share` once both passed."""
    if (
        equal is None
        or any(step.percent == equal for _, step in ahead)
        or (not ahead and share in (0, equal))
    ):
        return list(ahead)
    steps: list[tuple[int, Step]] = list(ahead) or [(EQUAL_LOAD_STEP, AddedStep(share))]
    at = next((index for index, (_, step) in enumerate(steps) if step.percent > equal), len(steps))
    if steps[0][1].percent == share:
        at = max(at, 1)
    return [*steps[:at], (EQUAL_LOAD_STEP, AddedStep(equal)), *steps[at:]]


def releases_steps(
    steps: Sequence[Step], share: int, asked: int, past_gate: bool, equal: int | None
) -> list[tuple[int, Step]]:
    """The steps `guard` carries a release at `share` through (`steps_ahead`, `with_equal_load_step`):
    without steps, where the share is not `asked` (a guard Job's pod restarted in the equal-load
    analysis), the analysis at the share it has and the share goes back to `asked` after it."""
    ahead = with_equal_load_step(steps_ahead(steps, share if steps else 0, past_gate), asked, equal)
    if not steps and share != asked:
        ahead = [(number, step) for number, step in ahead if step.percent == share] or ahead
    return ahead


def least_share(steps: Sequence[Step], asked: int) -> int:
    """The smallest share the stack sends the canary: its first step's, or the share it was deployed with
    (`asked`), which the plan checked against min_requests (infra/spec/models.py traffic_problem)."""
    return min((step.percent for step in steps), default=asked)


def step_rules(
    rules: Canary, number: int, percent: int, least: int, servers: tuple[int, int] = (0, 0)
) -> Canary:
    """The analysis' settings of step `number` at `percent`: the stack's, but for the analysis the loop
    adds (EQUAL_LOAD_STEP) below `least` (`least_share`), whose intervals are longer by least / percent
    (load.lengthened_interval_s) so that the canary answers as many requests in each as at `least`; and
    longer still (load.SPARSE_FACTOR) where it is the share below equal load that whole percents leave on
    `servers` (the canary's and the stable's up)."""
    if number != EQUAL_LOAD_STEP:
        return rules
    sparse = percent == equal_load_share(servers) and not equal_loads(load_at(percent, servers))
    interval_s = lengthened_interval_s(rules.interval_s, percent, least, sparse)
    if interval_s == rules.interval_s:
        return rules
    return RulesRead.of(rules).with_interval(interval_s)


def added_interval_s(
    rules: Rules, ahead: Sequence[tuple[int, Step]], asked: int, servers: tuple[int, int] = (0, 0)
) -> int | None:
    """The lengthened interval of the analysis the loop adds among the steps `ahead` (`releases_steps`) on
    `servers`, None where it lengthens none (`step_rules`)."""
    least = least_share(rules.steps, asked)
    lengthened = (step_rules(rules, number, step.percent, least, servers) for number, step in ahead)
    return next((each.interval_s for each in lengthened if each is not rules), None)


def _label(
    number: int, percent: int, steps_in_all: int, equal_share: int | None, servers: tuple[int, int]
) -> str:
    if number != EQUAL_LOAD_STEP:
        return f"step {number} of {steps_in_all} ({percent} %)"
    # Where no share is within the tolerance of equal load (load.equal_load_percent), the added analysis is
    # at the largest share at which the canary is not busier: not an equal-load one.
    if percent == equal_share and equal_loads(load_at(percent, servers)):
        return f"the equal-load analysis ({percent} %)"
    return f"the analysis at {percent} %"


def _phase(verdict: Verdict) -> str:
    """The release record's phase after a verdict: the verdict, or ROLLED_BACK once it rolled back."""
    return ROLLED_BACK if verdict.action == ROLLBACK else verdict.action


def guard(
    release: Carried,
    model: str,
    duration_s: float | None = None,
    look_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    past_gate: bool = False,
    back_to: int | None = None,
) -> Verdict:
    """The canary's analysis (`analyse`), or with serving.canary.steps the release through its steps:
    from the first step at or above the canary's share (above it with `past_gate`: an operator opens the
    gate the last step held at), each step's share set and held for one analysis of its own (counts from
    just before the share moved); a step at 100 % promotes. Any verdict but promote-ready ends it; so
    does a passed step with a manual gate (GATED), the share left at that step. Where the canary's servers
    do not take a stable server's load at its share, an analysis at the share that loads them alike is
    added (`with_equal_load_step`); without steps the share goes back once both analyses passed, to
    `back_to` (None: the share now; a guard Job's pod restarted in the equal-load analysis finds the canary
    at that share, and goes on with it: the analysis at `back_to` passed before the share moved)."""
    steps = release.rules.steps
    if steps and not release.has_canary(model):
        return Verdict("gone", f"'{model}' has no canary: `gpuplat serve deploy NAME@VERSION --canary P` one")
    share = release.share()
    asked = share if back_to is None else back_to
    servers = release.servers_up()
    equal_share = equal_load_share(servers)
    ahead = releases_steps(steps, share, asked, past_gate, equal_share)
    if equal_share is not None and not steps and ahead:
        release.say(
            f"{describe(share, *servers)}: after its analysis at {share} % the canary's latency is judged at "
            f"{equal_share} %, where its servers take {load_at(equal_share, servers):.2f} x a stable "
            f"server's load; then its share goes back to {share} %"
        )
    if not ahead:
        # No share on the record where the canary has none (0: a false 0 % beside a release's record).
        release.record(model, "analysing", "the canary's analysis", share or None)
        weighing = Weighing(share, ServersUp(release, servers))
        verdict = analyse(release, model, duration_s, look_s, sleep, clock, weighing)
        release.record(
            model, _phase(verdict), verdict.reason, None if verdict.action == ROLLBACK else share or None
        )
        return verdict
    verdict = Verdict(CONTINUE, "no step analysed")
    least = least_share(steps, asked)
    for number, step in ahead:
        label = _label(number, step.percent, len(steps), equal_share, servers)
        if step.percent == 100:
            release.record(model, "promoting", label, share)
            version = release.promote(model)
            verdict = Verdict(PROMOTED, f"{len(steps) - 1} step(s) passed: {version.reference} promoted")
            release.record(model, PROMOTED, verdict.reason, 100)
            return verdict
        if step.percent != share:
            try:
                release.canary_start = (clock(), *release.counters())
            except (GpuPlatError, ValueError, KeyError) as error:
                # Nothing moved yet: the step counts from its first look after the share moved instead.
                release.canary_start = None
                reason = (
                    error.message if isinstance(error, GpuPlatError) else f"{type(error).__name__}: {error}"
                )
                release.say(f"{label}: the counters were not read before the share moved ({reason})")
            release.set_share(step.percent)
            share = step.percent
            release.say(f"{label}: the canary takes {step.percent} % of the requests")
        release.record(model, "analysing", label, share)
        rules = step_rules(release.rules, number, step.percent, least, servers)
        if rules is not release.rules:
            release.say(
                f"{label}: intervals of {rules.interval_s} s, for as many canary requests each as at "
                f"{least} %"
            )
        # The analysis the loop added at the equal-load share follows the servers (not the one at the
        # canary's own share a release without steps begins with, numbered alike).
        follows = number == EQUAL_LOAD_STEP and step.percent == equal_share
        weighing = Weighing(share, ServersUp(release, servers), follows=follows)
        verdict = analyse(release, model, duration_s, look_s, sleep, clock, weighing, rules)
        share, servers = weighing.share, weighing.servers.last
        release.canary_start = None
        if verdict.action != PROMOTE_READY:
            release.record(
                model,
                _phase(verdict),
                f"{label}: {verdict.reason}",
                None if verdict.action == ROLLBACK else share,
            )
            return verdict
        release.say(f"{label} passed: {verdict.reason}")
        if step.manual_gate and EQUAL_LOAD_STEP < number < len(steps):
            release.record(model, GATED, f"{label} passed; its manual gate holds the release", share)
            return Verdict(
                GATED,
                f"{label} passed and its manual gate holds the release at {step.percent} %: `gpuplat "
                f"serve guard {model} --past-gate` goes on to step {number + 1} "
                f"({steps[number].percent} %), `gpuplat serve rollback {model}` takes the canary out",
            )
    if not steps and share != asked:
        # Without steps the release ends at the share it was deployed with (with_equal_load_step).
        release.set_share(asked)
        release.say(f"both analyses passed: the canary's share goes back to {asked} %")
        share = asked
    release.record(model, verdict.action, verdict.reason, share)
    return verdict


def analyse(
    release: Carried,
    model: str,
    duration_s: float | None = None,
    look_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    weighing: Weighing | None = None,
    rules: Canary | None = None,
) -> Verdict:
    """Analyse the running canary (infra/serving/analysis.py) on counts since its share last moved (this
    command's `deploy` or step), or since this call's first look, every `look_s`, until a verdict or
    `duration_s` (default: the whole analysis and one look more, and the intervals it adds where it drops
    its latency evidence) ends it; roll it back on 'rollback'. Ending without a verdict returns 'continue'.
    `weighing`: the share and the servers up, read again at each look, that give each canary server's load
    over each stable server's (load.load_at), above which its latency is not judged (None: equal load).
    `rules`: the analysis' settings (None: the release's; `step_rules`)."""
    rules = rules or release.rules
    lengthens = duration_s is None
    if duration_s is None:
        duration_s = rules.initial_delay_s + rules.analysis_s + look_s
    load = 1.0 if weighing is None else load_at(weighing.share, weighing.servers.last)
    # Counting from this call's first look: that first reading is a look too, under the three-failed-looks
    # rule (a share step's gateways just rolled, an API that did not answer once), the analysis' start and
    # its end moved to the first reading that came.
    watch = None if release.canary_start is None else Guard(rules, *release.canary_start, load_ratio=load)
    keeping = release if isinstance(release, Keeping) else None
    saved = keeping.saved_watch(rules) if keeping is not None else None
    if saved is not None:
        watch = saved
    started = clock() if watch is None else watch.started_s
    verdict = Verdict(CONTINUE, "no look yet")
    failed = 0
    first = watch is None
    # Resumed (a restarted guard Job's pod), the evidence is judged at least once more, even where the
    # analysis' time ran out while no guard looked.
    resumed = saved is not None
    while first or resumed or clock() - started < duration_s + _added_s(watch, lengthens):
        if not first:
            sleep(look_s)
            if release.lock_lost(model):
                raise GpuPlatError(
                    f"the guard of '{model}' lost its release lock (not renewed within its "
                    f"{release.lease_s:.0f} s lease, or found another command's): it stopped, leaving the "
                    f"release to whichever command holds it now (`gpuplat serve status {model}`)",
                    exit_code=ExitCode.NO_VERDICT,
                )
        first = resumed = False
        try:
            if watch is None:
                at = clock()
                watch = Guard(rules, at, *release.counters(), load_ratio=load)
                started = at
                failed = 0
                if keeping is not None:
                    keeping.keep(watch, verdict)
                continue
            if not release.has_canary(model):
                return Verdict("gone", f"'{model}' has no canary any more")
            ratio = None if weighing is None else _weigh(release, model, weighing)
            dropped = len(watch.analysis.restarts)
            verdict = watch.look(clock(), *release.counters(), load_ratio=ratio)
            if len(watch.analysis.restarts) > dropped:
                release.say(watch.analysis.restarts[-1])
        except Stopped:
            raise
        except (GpuPlatError, ValueError, KeyError) as error:
            failed += 1
            reason = error.message if isinstance(error, GpuPlatError) else f"{type(error).__name__}: {error}"
            if failed >= LOOK_TRIES:
                raise GpuPlatError(
                    f"the guard could not look at '{model}''s canary {failed} times in a row ({reason}): "
                    "it stopped, and the canary keeps its share unwatched. Fix what the message names, "
                    f"then `gpuplat serve guard {model}` again (it counts from its own first look), or "
                    f"`gpuplat serve rollback {model}`",
                    exit_code=ExitCode.NO_VERDICT,
                ) from None
            release.say(f"look failed ({failed} of {LOOK_TRIES} in a row allowed): {reason}")
            continue
        failed = 0
        if keeping is not None:
            keeping.keep(watch, verdict)
        if verdict.action == ROLLBACK:
            release.rollback(model, verdict.reason)
        if verdict.action != CONTINUE:
            return verdict
    return verdict


def _added_s(watch: Guard | None, lengthens: bool) -> float:
    """The time the intervals an analysis added (its latency evidence dropped: Analysis.reweigh) take, where
    the analysis' length is its own (`lengthens`: no duration asked for)."""
    if watch is None or not lengthens:
        return 0.0
    return watch.analysis.added_s


def _weigh(release: Carried, model: str, weighing: Weighing) -> float | None:
    """The load ratio at this look from the servers up read again; in the analysis the loop added
    (`weighing.follows`), the share first moved to the one that loads both versions' servers alike on
    them now, where the share it has no longer does (load.same_load against equal load). A share that
    cannot be set (the guard Job sets only those its plan renders) is said, and kept."""
    servers = weighing.servers.read()
    if not both_serving(servers):
        # A version with no server up (its one server restarting) takes no load: load.load_at's 1.00 x for
        # it is no ratio to weigh the evidence by, which stays as it was.
        return None
    if weighing.follows:
        wanted = equal_load_share(servers)
        now = load_at(weighing.share, servers)
        if wanted is not None and wanted != weighing.share and not same_load(now, load_at(wanted, servers)):
            try:
                release.set_share(wanted)
            except Stopped:
                raise
            except GpuPlatError as error:
                release.say(
                    f"the servers up moved to {servers[0]} canary and {servers[1]} stable, which {wanted} % "
                    f"loads alike; the share stays at {weighing.share} % ({error.message})"
                )
            else:
                release.say(
                    f"the servers up moved to {servers[0]} canary and {servers[1]} stable: "
                    f"{describe(weighing.share, *servers)}; the canary takes {wanted} % now, "
                    f"{load_at(wanted, servers):.2f} x"
                )
                weighing.share = wanted
                release.record(model, "analysing", f"the analysis at {wanted} %", wanted)
    return load_at(weighing.share, servers)
