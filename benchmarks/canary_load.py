"""The canary analysis against per-server load (issue 48, item 4): a canary server busier or idler than
each stable server reads slower or faster for its load alone, not its version.

At a share s the canary's C servers take s of the requests and the stable's S servers the rest, so each
canary server takes r = s * S / ((1 - s) * C) times a stable server's load: `serving.canary.gpus: borrow`
on N nodes of R replicas runs C = 1 canary beside S = N * R - 1 stable servers (at 20 % on 8 replicas
r = 1.75, on 2 replicas 0.25); `spare` runs one canary slot per node beside its R stable replicas (C = N,
S = N * R, r = s * R / (1 - s)).

The load model (a model, not a measurement): the pool is sized so that each server is busy `--utilisation`
of the time when no release runs (rho0, default 0.5: a pool sized for twice its traffic; the requests
spread over every replica with borrow, over the stable ones with spare, whose canary GPUs idle between
releases). A server taking x times that load is busy rho = rho0 * x, and its latencies (the embedder's
whole answer, an LLM's time to the first token) are its version's at rho0 times (1 - rho0) / (1 - rho):
the mean time in an M/M/1 queue, E[S] / (1 - rho) (Kleinrock, Queueing Systems vol. 1, 1975, section
3.2). An LLM's token gaps rise with its batch: each decode step carries every running answer, so a step
takes longer with more of them; modelled as a gap (1 + k * b) / (1 + k * b0) times its gap at rho0, the
batch b = b0 * x by Little's law (b0 = 16 answers running at rho0, k = 1/32: a gap 1.5 x longer at 16
answers than at none). A server at rho >= `--overload` (0.95) is overloaded: its queue grows without
bound (the gateway answers 503 once max_queue is full), a capacity problem before an analysis one; such
steps are listed, not simulated.

"1.5x slower" is a canary whose latencies are 1.5 x the stable's at equal load. Traffic (no errors),
looks, the analysis and its defaults are benchmarks/canary_analysis.py's. A release goes through the
documented example's steps (5, 20, 50 %; the defaults have none: one analysis at 20 %), each one analysis
of its own as the guard runs it, and, unless `--load-blind`, the share the guard adds where both
versions' servers take equal load (infra/serving/load.py equal_load_percent); a step the plan refuses at
the rate (too few requests, serving.canary.expected_requests_per_s) or one overloading a server is left
out. A release is promote-ready once every step passed, ends at its first other verdict.

    nice -n 10 .venv/bin/python benchmarks/canary_load.py --runs 200

`--pools 2-48` instead: `borrow` on every pool of 2 to 48 replicas (1 canary server beside N - 1 stable) at
`--rate` requests/s (10), the embedder's latency, a release without steps (share_percent 20 %) and one
through 5, 20, 50 %, with the equal-load share as the guard carries it (the analysis it adds, with the
longer intervals of carry.step_rules), an identical canary and one 1.5 x slower at equal load; each row
says the shares analysed and their load ratios.

    nice -n 10 .venv/bin/python benchmarks/canary_load.py --pools 2-48 --runs 200
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.canary_analysis import (
    EMBEDDER,
    LLM_GAPS,
    LLM_TTFT,
    LOOK_S,
    Latency,
    TokenGaps,
    clopper_pearson,
    simulate,
)
from infra.serving.analysis import CONTINUE, PROMOTE_READY, ROLLBACK, Guard, RulesRead
from infra.serving.carry import EQUAL_LOAD_STEP, least_share, step_rules, steps_ahead, with_equal_load_step
from infra.serving.load import equal_load_percent, load_ratio
from infra.spec.models import Canary, CanaryStep

STEPS = (5, 20, 50)
BATCH_AT_EVEN = 16.0
GAP_PER_ANSWER = 1 / 32


@dataclass(frozen=True)
class Layout:
    name: str
    canary_servers: int
    stable_servers: int
    spare: bool = False
    """the canary's servers are GPUs kept free (spare), not a stable replica's (borrow)"""

    @property
    def serving_servers(self) -> int:
        """The servers the requests are spread over when no release runs: every replica with borrow (the
        canary's among them), the stable ones with spare."""
        return self.stable_servers if self.spare else self.stable_servers + self.canary_servers


LAYOUTS = (
    Layout("borrow, 1 node x 2 replicas", 1, 1),
    Layout("borrow, 2 x 2 replicas", 1, 3),
    Layout("borrow, 2 x 4 replicas", 1, 7),
    Layout("spare, 2 nodes x 1 stable", 2, 2, spare=True),
    Layout("spare, 2 nodes x 3 stable", 2, 6, spare=True),
)


def server_loads(layout: Layout, share: float) -> tuple[float, float]:
    """Each canary server's and each stable server's load, as a multiple of a server's without a release."""
    servers = layout.serving_servers
    return (
        share * servers / layout.canary_servers,
        (1 - share) * servers / layout.stable_servers,
    )


def queueing(utilisation: float, load: float) -> float:
    """A server's latency multiple at `load` x its load without a release, against that (M/M/1 mean)."""
    return (1 - utilisation) / (1 - utilisation * load)


def batching(load: float) -> float:
    """A token gap's multiple at `load` x its load without a release (a decode step of load x b0 answers)."""
    return (1 + GAP_PER_ANSWER * BATCH_AT_EVEN * load) / (1 + GAP_PER_ANSWER * BATCH_AT_EVEN)


@dataclass(frozen=True)
class Trial:
    """What one release is simulated with: its traffic, its servers, the canary's version."""

    latency: Latency
    gaps: TokenGaps | None
    rate: float
    layout: Layout
    slowdown: float
    """the canary's latencies over the stable's at equal load"""
    utilisation: float
    """rho0"""
    load_aware: bool
    """the analysis told each step's load ratio (False: as before 2026-12-07)"""


def run_once(
    rng: np.random.Generator, rules: Canary | RulesRead, trial: Trial, share: float
) -> tuple[str, float]:
    """One step's analysis: its verdict and when it came."""
    latency, gaps, rate, layout = trial.latency, trial.gaps, trial.rate, trial.layout
    slowdown, utilisation = trial.slowdown, trial.utilisation
    seconds = int(rules.analysis_s + 2 * LOOK_S)
    canary_load, stable_load = server_loads(layout, share)
    ones = np.ones(seconds + 1)
    stable = simulate(
        rng,
        rate * (1 - share),
        0.0,
        latency,
        ones * queueing(utilisation, stable_load),
        seconds,
        gaps,
        ones * batching(stable_load),
    )
    canary = simulate(
        rng,
        rate * share,
        0.0,
        latency,
        ones * slowdown * queueing(utilisation, canary_load),
        seconds,
        gaps,
        ones * slowdown * batching(canary_load),
    )
    bounds = latency.bounds
    ratio = (
        load_ratio(round(100 * share), layout.canary_servers, layout.stable_servers)
        if trial.load_aware
        else 1.0
    )
    guard = Guard(rules, 0.0, stable.at(0, bounds), canary.at(0, bounds), load_ratio=ratio)
    now, verdict = 0.0, CONTINUE
    while now < rules.analysis_s + LOOK_S:
        now += LOOK_S
        verdict = guard.look(now, stable.at(int(now), bounds), canary.at(int(now), bounds)).action
        if verdict != CONTINUE:
            break
    return verdict, now


def release_shares(
    steps: tuple[int, ...],
    layout: Layout,
    rate: float,
    rules: Canary,
    load_aware: bool,
    overload: float,
    rho0: float,
) -> tuple[list[int], list[str]]:
    """The shares a release goes through (`steps`, else share_percent; with `load_aware` and the
    equal-load share the guard adds), and the steps left out: refused by the plan for too few requests
    at `rate`, or overloading a server (a capacity problem, not simulated)."""
    ahead = steps_ahead([CanaryStep(percent=percent) for percent in steps], 0, False)
    share = 0 if steps else rules.share_percent
    if load_aware:
        ahead = with_equal_load_step(
            ahead, share, equal_load_percent(layout.canary_servers, layout.stable_servers)
        )
    ahead = ahead or [(1, CanaryStep(percent=share))]
    kept, left = [], []
    sized = rules.model_copy(update={"expected_requests_per_s": rate})
    for percent in (step.percent for _, step in ahead):
        if sized.traffic_problem(percent):
            left.append(f"{percent} % too few requests")
        elif max(server_loads(layout, percent / 100)) * rho0 >= overload:
            left.append(f"{percent} % overloads a server")
        else:
            kept.append(percent)
    return kept, left


def run_release(
    rng: np.random.Generator,
    rules: Canary,
    trial: Trial,
    shares: list[int],
    steps: tuple[int, ...] | None = None,
) -> tuple[str, int]:
    """The release's verdict (promote-ready once every step passed) and the share it ended at. With `steps`
    (the stack's: () for none) each share's analysis has the guard's settings (carry.step_rules: the one
    it adds below the smallest share has longer intervals); None: the stack's for every share."""
    least = least_share([CanaryStep(percent=p) for p in steps or ()], rules.share_percent)
    for percent in shares:
        number = EQUAL_LOAD_STEP if steps is not None and percent not in steps else 1
        servers = (trial.layout.canary_servers, trial.layout.stable_servers)
        step = step_rules(rules, number, percent, least, servers)
        verdict, _at = run_once(rng, step, trial, percent / 100)
        if verdict != PROMOTE_READY:
            return verdict, percent
    return PROMOTE_READY, shares[-1] if shares else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="releases per cell")
    parser.add_argument("--seed", type=int, default=48)
    parser.add_argument(
        "--utilisation", type=float, default=0.5, help="rho0: busy share of a server without a release"
    )
    parser.add_argument("--overload", type=float, default=0.95)
    parser.add_argument(
        "--load-blind",
        action="store_true",
        help="the analysis as before 2026-12-07: every load taken as equal",
    )
    parser.add_argument("--per-step", action="store_true", help="each share analysed as a release alone")
    parser.add_argument("--only", default="", help="the layouts whose name this regular expression finds")
    parser.add_argument(
        "--pools",
        default="",
        help="FIRST-LAST: borrow on each pool of FIRST to LAST replicas instead, at --rate",
    )
    parser.add_argument("--rate", type=float, default=10.0, help="--pools' requests/s")
    args = parser.parse_args(argv)
    rules = Canary()
    load_aware = not args.load_blind
    rng = np.random.default_rng(args.seed)
    if args.pools:
        return pools(args, rng, rules)
    print(
        f"{time.strftime('%Y-%m-%d')}, {args.runs} releases per cell, seed {args.seed}, rho0 "
        f"{args.utilisation}, steps {', '.join(map(str, STEPS))} % and none (share_percent "
        f"{rules.share_percent} %)"
        + (" (load-blind: as before 2026-12-07)" if args.load_blind else " and the equal-load share")
    )
    print(
        "| layout | latency | req/s | steps | shares analysed, in order (load ratio) | left out | identical: "
        "rolled back, blocked (95 % CI of both) | 1.5x slower: rolled back |"
    )
    print("|---|---|---|---|---|---|---|---|")
    workloads = [(EMBEDDER, None, rate) for rate in (2, 10, 50)] + [(LLM_TTFT, LLM_GAPS, 10)]
    for layout in (lay for lay in LAYOUTS if re.search(args.only, lay.name)):
        for latency, gaps, rate in workloads:
            for steps in (STEPS, ()):
                every, left = release_shares(
                    steps, layout, rate, rules, load_aware, args.overload, args.utilisation
                )
                if args.per_step and not steps:
                    continue  # share_percent is a step of STEPS
                for shares in [[p] for p in every] if args.per_step else [every]:
                    row(args, rng, rules, load_aware, layout, (latency, gaps, rate), steps, shares, left)
    return 0


def pools(args: argparse.Namespace, rng: np.random.Generator, rules: Canary) -> int:
    """The `--pools` table: each borrow pool's shares analysed (their load ratios), and how often an
    identical canary is rolled back or blocked and a 1.5 x slower one rolled back, without steps and
    through STEPS."""
    found = re.fullmatch(r"(\d+)-(\d+)", args.pools)
    if found is None or not 2 <= int(found[1]) <= int(found[2]):
        print(f"--pools takes FIRST-LAST, 2 <= FIRST <= LAST (2-48), not {args.pools!r}", file=sys.stderr)
        return 2
    print(
        f"{time.strftime('%Y-%m-%d')}, {args.runs} releases per cell, seed {args.seed}, rho0 "
        f"{args.utilisation}, borrow, {args.rate:g} requests/s, embedder; steps none (share_percent "
        f"{rules.share_percent} %) or {', '.join(map(str, STEPS))} %"
    )
    print(
        "| replicas | steps | shares analysed (load ratio; equal-load intervals) | left out | identical: "
        "rolled back, blocked (95 % CI of both) | 1.5x slower: rolled back (95 % CI) |"
    )
    print("|---|---|---|---|---|---|")
    for replicas in range(int(found[1]), int(found[2]) + 1):
        for steps in ((), STEPS):
            print(pool_row(args, rng, rules, replicas, steps), flush=True)
    return 0


def pool_row(
    args: argparse.Namespace, rng: np.random.Generator, rules: Canary, replicas: int, steps: tuple[int, ...]
) -> str:
    layout = Layout(f"borrow, {replicas} replicas", 1, replicas - 1)
    load_aware = not args.load_blind
    shares, left = release_shares(
        steps, layout, args.rate, rules, load_aware, args.overload, args.utilisation
    )
    tally: dict[float, dict[str, int]] = {1.0: {}, 1.5: {}}
    for slowdown, outcomes in tally.items():
        trial = Trial(EMBEDDER, None, args.rate, layout, slowdown, args.utilisation, load_aware)
        for _ in range(args.runs):
            verdict, _ended = run_release(rng, rules, trial, shares, steps)
            outcomes[verdict] = outcomes.get(verdict, 0) + 1
    same, slow = tally[1.0], tally[1.5]
    wrong = args.runs - same.get(PROMOTE_READY, 0)
    low, high = clopper_pearson(wrong, args.runs)
    caught = slow.get(ROLLBACK, 0)
    caught_low, caught_high = clopper_pearson(caught, args.runs)
    least = least_share([CanaryStep(percent=p) for p in steps], rules.share_percent)
    analysed = []
    for percent in shares:
        ratio = f"{percent} ({load_ratio(percent, 1, replicas - 1):.2f}"
        if percent not in steps:
            added = step_rules(rules, EQUAL_LOAD_STEP, percent, least, (1, replicas - 1))
            ratio += f"; {added.interval_s} s"
        analysed.append(ratio + ")")
    return (
        f"| {replicas} | {', '.join(map(str, steps)) or 'none'} | {', '.join(analysed)} | "
        f"{'; '.join(left) or '-'} | {same.get(ROLLBACK, 0)}, {wrong - same.get(ROLLBACK, 0)} "
        f"({low:.1%}-{high:.1%}) | {caught}/{args.runs} ({caught_low:.1%}-{caught_high:.1%}) |"
    )


def row(
    args: argparse.Namespace,
    rng: np.random.Generator,
    rules: Canary,
    load_aware: bool,
    layout: Layout,
    workload: tuple[Latency, TokenGaps | None, float],
    steps: tuple[int, ...],
    shares: list[int],
    left: list[str],
) -> None:
    """One table row: `args.runs` releases through `shares` of an identical canary, and of a slower one."""
    latency, gaps, rate = workload
    tally: dict[float, dict[str, int]] = {1.0: {}, 1.5: {}}
    for slowdown, outcomes in tally.items():
        for _ in range(args.runs):
            trial = Trial(latency, gaps, rate, layout, slowdown, args.utilisation, load_aware)
            verdict, _ended = run_release(rng, rules, trial, shares)
            outcomes[verdict] = outcomes.get(verdict, 0) + 1
    same, slow = tally[1.0], tally[1.5]
    rolled, blocked = (
        same.get(ROLLBACK, 0),
        args.runs - same.get(PROMOTE_READY, 0) - same.get(ROLLBACK, 0),
    )
    low, high = clopper_pearson(rolled + blocked, args.runs)
    ratios = ", ".join(
        f"{p} ({load_ratio(p, layout.canary_servers, layout.stable_servers):.2f})" for p in shares
    )
    print(
        f"| {layout.name} | {'TTFT + ITL' if gaps else latency.name} | {rate:g} | "
        f"{', '.join(map(str, steps)) or 'none'} | {ratios} | "
        f"{'; '.join(left) or '-'} | {rolled}, {blocked} ({low:.1%}-{high:.1%}) | "
        f"{slow.get(ROLLBACK, 0)}/{args.runs} |",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
