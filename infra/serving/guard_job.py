"""The guard Job on a Kueue stack: the canary's analysis carried through serving.canary.steps inside the
cluster, after the command that started it (`gpuplat serve deploy ... --detach`, `serve guard --detach`)
returned. The loop is the CLI's and the nodes' (infra/serving/carry.py); what it reads and changes is the
cluster, through the API with the pod's ServiceAccount (infra/serving/kube_http.py), under the model's
Lease, which the CLI handed to this Job's holder before it created the Job.

- Its plan (JobPlan, written by the CLI into a ConfigMap the pod mounts): the analysis' settings and the
  steps below 100 %, the pods' names and ports, and for each share a step may set (0 for a rollback) the
  objects to apply, pre-rendered by the CLI (the zip application carries neither the spec's models nor
  the templates): the gateways' ConfigMap and Deployment and the release record at that share.
- The counters: every look, the gateway and model-server pods listed through the API and read at their
  addresses (infra/serving/pod_counters.py), not through the API server's proxy.
- Its state: the guard's record (GUARD_RECORD, the ConfigMap `serve status` reads) rewritten whole after
  every look, its evidence (the analysis of the share the canary has, carry.Keeping) with it, through an
  update carrying the resourceVersion this guard last read or wrote: a 409 means another writer (a newer
  release's guard, an operator's command) and the guard stops. A pod restarted mid-release resumes from it:
  the counts since the canary's share last moved, the intervals judged.
- What it leaves to the operator, as the detached guard on the nodes does: the promotion (it ends at
  promote-ready, a manual gate or the step before 100 %) and, after a rollback, the canary's workload
  (the gateways take no request to it; `gpuplat serve rollback NAME` removes it).

The standard library only: the Job runs the model-server image's python3 on this package's modules,
bundled by the CLI into one zip application (infra/serving/detach.py) in a ConfigMap.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.errors import ExitCode, GpuPlatError
from infra.k8s.api_refs import ClusterError, Conflict, ObjectRef
from infra.k8s.release_lock import LEASE_DURATION_S, ReleaseLock, ReleaseLocked, lost_at_look, still_held
from infra.k8s.rollout import gateways_wait
from infra.serving import carry
from infra.serving.analysis import Canary, Guard, RulesRead, Verdict
from infra.serving.counts import Counts, Reading
from infra.serving.kube_http import KubeHttp, read_pod
from infra.serving.pod_counters import METRICS_PATH, PodCounters, PodNames

FIELD_MANAGER = "gpuplat-serve"
"""the CLI's field manager (infra/k8s/serving_apply.py): the Job's applies share the fields the CLI owns"""
GUARD_RECORD, GUARD_RECORD_KEY, EVIDENCE_KEY = "gpuplat-serve-guard", "guard", "evidence"
RELEASE_RECORD, RELEASE_RECORD_KEY = "gpuplat-serve-release", "release"
ENDED = ("promote-ready", "rollback", "rolled back", "inconclusive", "gated", "promoted", "gone", "stopped")
"""the record's phases after which a restarted pod has nothing left to do"""
POLL_S = 2.0
SUPERSEDED_EXIT = 10
INTERRUPTED = "interrupted"
"""the record's phase once a pod stopped on an error the Job retries (not ended: the next pod resumes)"""
"""the exit code of a guard another command or guard took the release from (its Lease, its records): the
Job's pod failure policy fails the Job on it rather than starting the pod again (as on a plan it cannot
read, exit 2); any other failure is retried up to the Job's backoffLimit"""


class Superseded(carry.Stopped):
    """Another command or guard carries the release now."""


@dataclass(frozen=True)
class StepRead:
    percent: int
    manual_gate: bool = False


@dataclass(frozen=True)
class JobRules(RulesRead):
    """serving.canary as the CLI read it (carry.Rules): the analysis' settings and the steps the Job
    carries."""

    steps: tuple[StepRead, ...] = ()


@dataclass(frozen=True)
class JobPlan:
    model: str
    namespace: str
    holder: str
    """the Lease's holder the CLI handed the release to"""
    canary: str
    """the canary's reference (NAME@VERSION): a record that names another ends the guard"""
    stable_slug: str
    canary_slug: str
    rules: JobRules
    names: PodNames
    latency: str
    itl: tuple[str, ...]
    shares: dict[int, list[dict[str, Any]]]
    """share -> the objects that set it (the release record among them)"""
    gateway: str
    """the gateways' Deployment"""
    look_s: float = 5.0
    duration_s: float | None = None
    past_gate: bool = False
    rollout_s: float = 1800.0
    servers: tuple[int, int] = (0, 0)
    """the canary's servers and the stable's up when the CLI looked (carry.Carried.servers_up): the shares
    the Job may set are rendered beforehand, the equal-load one among them (infra/serving/load.py)"""
    back_to: int | None = None
    """the canary's share when the CLI looked, which a release without steps ends at after the equal-load
    analysis (carry.guard's `back_to`: a pod restarted in that analysis finds another share)"""
    added_interval_s: int | None = None
    """the intervals of the analysis the Job adds below the stack's smallest share (carry.step_rules: longer,
    for as many canary requests each as there); None where it adds none there"""

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["rules"] = {**self.rules.to_json(), "steps": [s.__dict__ for s in self.rules.steps]}
        data["names"] = self.names.to_json()
        data["itl"] = list(self.itl)
        data["shares"] = {str(share): objects for share, objects in self.shares.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobPlan:
        rules = dict(data["rules"])
        steps = tuple(StepRead(**step) for step in rules.pop("steps", []))
        return cls(
            **{
                **data,
                "rules": JobRules(**rules, steps=steps),
                "names": PodNames(**data["names"]),
                "itl": tuple(data["itl"]),
                "servers": tuple(data.get("servers", (0, 0))),
                "shares": {int(share): objects for share, objects in data["shares"].items()},
            }
        )


def _say(line: str) -> None:
    print(line, flush=True)


@dataclass
class JobCarried:
    """carry.Carried (and carry.Keeping) for the guard Job."""

    api: KubeHttp
    plan: JobPlan
    lock: ReleaseLock
    say: Callable[[str], None] = _say
    sleep: Callable[[float], None] = time.sleep
    read: Callable[[str, int, str], str] = read_pod
    canary_start: tuple[float, Counts | Reading, Counts | Reading] | None = None
    lease_s: float = LEASE_DURATION_S
    state: dict[str, Any] = field(default_factory=dict)
    state_version: str | None = None
    record_version: str | None = None
    servers_read: bool = False
    """whether `servers_up` gave the plan's count already (the guard's start): every later read is the
    gateway pods' count then"""

    @property
    def rules(self) -> JobRules:
        return self.plan.rules

    @property
    def namespace(self) -> str:
        return self.plan.namespace

    def now_s(self) -> float:
        """The API server's time in seconds: the analysis' clock survives a restart of the pod (on another
        node, another clock)."""
        return self.api.server_now().timestamp()

    # The release record and the guard's own state

    def _release(self) -> dict[str, Any]:
        live = self.api.get(ObjectRef("v1", "ConfigMap", RELEASE_RECORD, self.namespace))
        self.record_version = ((live or {}).get("metadata") or {}).get("resourceVersion")
        text = ((live or {}).get("data") or {}).get(RELEASE_RECORD_KEY)
        found = json.loads(text) if text else {}
        return found if isinstance(found, dict) else {}

    def load_state(self) -> dict[str, Any]:
        live = self.api.get(ObjectRef("v1", "ConfigMap", GUARD_RECORD, self.namespace))
        if live is None:
            raise ClusterError(
                f"the guard's record (ConfigMap {self.namespace}/{GUARD_RECORD}) is gone: the command that "
                "started this guard writes it first"
            )
        self.state_version = live["metadata"]["resourceVersion"]
        data = live.get("data") or {}
        self.state = {key: json.loads(data[key]) for key in (GUARD_RECORD_KEY, EVIDENCE_KEY) if data.get(key)}
        return self.state

    def _write_state(self) -> None:
        """The record whole, guarded by the resourceVersion this guard last read or wrote."""
        manifest = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": GUARD_RECORD,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER},
                "resourceVersion": self.state_version,
            },
            "data": {key: json.dumps(value) for key, value in self.state.items()},
        }
        try:
            answer = self.api.update(manifest)
        except Conflict:
            raise Superseded(
                f"the guard's record (ConfigMap {self.namespace}/{GUARD_RECORD}) was written by another "
                f"since this guard last wrote it: another command or guard carries the release of "
                f"{self.plan.model} now. This guard stopped (`gpuplat serve status {self.plan.model}`)"
            ) from None
        self.state_version = answer["metadata"]["resourceVersion"]

    # carry.Carried

    def has_canary(self, model: str) -> bool:
        canary = self._release().get("canary")
        return isinstance(canary, dict) and canary.get("reference") == self.plan.canary

    def share(self) -> int:
        return int(self._release().get("canary_percent") or 0)

    def servers_up(self) -> tuple[int, int]:
        """At the guard's start the plan's (the equal-load share the loop adds must be one the plan has the
        objects of); at each look after, the gateway pods' count now (PodCounters.servers_up), which the
        load ratio follows (carry.ServersUp). None counted where the CLI counted none (it could not read
        the gateway pods: no load is weighed)."""
        if not self.servers_read or self.plan.servers == (0, 0):
            self.servers_read = True
            return self.plan.servers
        return self._pod_counters().servers_up(self.namespace, self.say)

    def _pod_counters(self) -> PodCounters:
        pods = ObjectRef("v1", "Pod", "", self.namespace)
        names = self.plan.names
        return PodCounters(
            names,
            pods=lambda component: self.api.list(pods, f"{names.component_label}={component}"),
            read=lambda pod, port: self.read(str(pod["status"]["podIP"]), port, METRICS_PATH),
        )

    def counters(self) -> tuple[Reading, Reading]:
        return self._pod_counters().readings(
            self.namespace,
            self.plan.stable_slug,
            self.plan.canary_slug,
            self.share(),
            self.plan.latency,
            self.plan.itl,
            self.say,
        )

    def _set(self, percent: int) -> None:
        """The pre-rendered objects of `percent` applied (the release record guarded by the resourceVersion
        read just before), then the gateways' rollout awaited."""
        objects = self.plan.shares.get(percent)
        if objects is None:
            raise GpuPlatError(f"the guard's plan has no objects for a share of {percent} %")
        self._release()
        for manifest in objects:
            if manifest["kind"] == "ConfigMap" and manifest["metadata"]["name"] == RELEASE_RECORD:
                guarded = {**manifest["metadata"], "resourceVersion": self.record_version}
                manifest = {**manifest, "metadata": guarded}
            try:
                self.api.apply(manifest)
            except Conflict:
                raise Superseded(
                    f"the release record of {self.plan.model} changed since this guard read it: another "
                    "command carries the release now. This guard stopped"
                ) from None
        deadline = self.now_s() + self.plan.rollout_s
        while (left := gateways_wait(self.api, self.namespace, self.plan.gateway)) is not None:
            if self.now_s() >= deadline:
                raise ClusterError(
                    f"the gateways did not roll out within {self.plan.rollout_s:.0f} s: {left}"
                )
            self.lock.renew()
            self.sleep(POLL_S)

    def set_share(self, percent: int) -> None:
        self._still_held(f"moving the canary's share to {percent} %")
        self.state.pop(EVIDENCE_KEY, None)
        self._set(percent)
        self.canary_start = None

    def promote(self, model: str) -> carry.Promoted:
        raise GpuPlatError(
            f"the guard Job does not promote: `gpuplat serve promote {model}` does, once it ends "
            "promote-ready",
            exit_code=ExitCode.BAD_INPUT,
        )

    def rollback(self, model: str, reason: str = "asked for") -> object:
        self._still_held(f"rolling the canary back ({reason})")
        self.say(f"rolling {model}'s canary back: {reason}")
        self._set(0)
        return None

    def record(self, model: str, phase: str, detail: str, percent: int | None = None) -> None:
        self._still_held(f"recording '{phase}'")
        self.state[GUARD_RECORD_KEY] = {
            "model": model,
            "phase": phase,
            "detail": detail,
            "canary_percent": percent,
            "steps": [step.percent for step in self.rules.steps],
            "at": self.api.server_now().isoformat(timespec="seconds"),
            "by": self.lock.holder,
            "job": True,
        }
        self._write_state()

    def lock_lost(self, model: str) -> bool:
        return lost_at_look(self.lock, self.say, Superseded)

    def _still_held(self, before: str) -> None:
        still_held(self.lock, before, self.say, Superseded)

    # carry.Keeping

    def saved_watch(self, rules: Canary) -> Guard | None:
        saved = self.state.get(EVIDENCE_KEY)
        if not isinstance(saved, dict) or saved.get("share") != self.share():
            return None
        return Guard.from_json(rules, saved["watch"])

    def keep(self, watch: Guard, verdict: Verdict) -> None:
        evidence = {"share": self.share(), "watch": watch.to_json(), "verdict": verdict.action}
        self.state[EVIDENCE_KEY] = evidence
        self._write_state()


def run(api: KubeHttp, plan: JobPlan, **options: Any) -> int:
    """The guard's whole life in its pod; the exit code the Job's pod failure policy reads."""
    lock = ReleaseLock(api, plan.namespace, plan.model, plan.holder, now=api.server_now)
    # No call is retried past the Lease: a guard whose Lease may have passed to another stops (api_retry).
    api.retry.bound = lock.seconds_left
    carried = JobCarried(api, plan, lock, **options)
    try:
        # Handed over by the CLI: a Lease gone means the release is no longer the Job's (exit 10).
        lock.acquire(may_create=False)
        state = carried.load_state().get(GUARD_RECORD_KEY) or {}
        if state.get("phase") in ENDED:
            carried.say(f"the release ended already ({state.get('phase')}: {state.get('detail')})")
            return 0
        verdict = carry.guard(
            carried,
            plan.model,
            plan.duration_s,
            plan.look_s,
            carried.sleep,
            carried.now_s,
            past_gate=plan.past_gate,
            back_to=plan.back_to,
        )
    except GpuPlatError as error:
        carried.say(error.message)
        if isinstance(error, ReleaseLocked | Superseded):
            return SUPERSEDED_EXIT
        _record_interrupted(carried, plan, error)
        return int(error.exit_code)
    carried.say(f"{verdict.action}: {verdict.reason}")
    # Let go at once, so that the operator's `promote` or `rollback` need not wait for it to expire.
    with contextlib.suppress(ClusterError):
        lock.release()
    return 0


def _record_interrupted(carried: JobCarried, plan: JobPlan, error: GpuPlatError) -> None:
    """Best effort, where this pod read the record and still holds the Lease: the record says why the pod
    stopped (`serve status` shows it). Not an ended phase: the Job's next pod, if any, resumes."""
    if carried.state_version is None:
        return
    last = carried.state.get(GUARD_RECORD_KEY) or {}
    detail = f"the guard's pod stopped ({error.message}); the Job starts another up to its backoffLimit"
    with contextlib.suppress(GpuPlatError):
        carried.record(plan.model, INTERRUPTED, detail, last.get("canary_percent"))


def main(argv: list[str] | None = None) -> int:
    """`python3 guard.pyz job PLAN_FILE`: the plan the CLI wrote, mounted from its ConfigMap."""
    args = sys.argv[1:] if argv is None else argv
    try:
        plan = JobPlan.from_json(json.loads(Path(args[-1]).read_text()))
        api = KubeHttp.in_cluster(FIELD_MANAGER)
    except (OSError, ValueError, KeyError, TypeError, IndexError, GpuPlatError) as error:
        print(f"the guard's plan could not be read ({type(error).__name__}: {error})", flush=True)
        return int(ExitCode.BAD_INPUT)
    return run(api, plan)
