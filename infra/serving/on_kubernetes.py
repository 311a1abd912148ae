"""`gpuplat serve` on a Kueue stack: the release's steps (infra/k8s/serving_steps.py) played through the
cluster's API (infra/k8s/serving_apply.py), under the model's Lease; the canary's analysis in the
foreground (`deploy --guard-s`, `guard`) is the nodes' loop (infra/serving/carry.py) on the pods' counters
(infra/serving/pod_readings.py), each share step, rollback and promotion played as the commands play them."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import Configuration
from kubernetes.config import ConfigException, new_client_from_config

from infra.errors import ExitCode, GpuPlatError, SpecError
from infra.k8s.facts import ClusterFacts, SharedVolume, host_path_facts
from infra.k8s.objects import serving_namespace
from infra.k8s.release_lock import lost_at_look, still_held
from infra.k8s.serving import MODEL_ENV, MODEL_SERVER, version_track_names
from infra.k8s.serving_apply import (
    FIELD_MANAGER,
    LEASE_DURATION_S,
    Clock,
    ClusterApi,
    ClusterError,
    ObjectRef,
    ReleaseDriver,
    ReleaseLock,
    RunningReplica,
    default_holder,
    read_record,
    running_replicas,
    workload_kind,
)
from infra.k8s.serving_steps import (
    ReleaseRefused,
    ReleaseStep,
    deploy_canary,
    finish_promotion,
    promote,
    rollback,
    take_over,
)
from infra.k8s.serving_versions import ServedVersion, ServingRelease
from infra.platform.resolve import ResolvedPlatform
from infra.serving import carry
from infra.serving.analysis import Verdict
from infra.serving.counts import Counts, Reading
from infra.serving.engine_metrics import itl_histograms, latency_histogram
from infra.serving.guard_job_start import read_guard_record as read_guard_record
from infra.serving.guard_job_start import settle_unstarted, start_guard_job
from infra.serving.pod_readings import pod_readings, pod_servers_up
from infra.serving.registry.locate import operator_credential
from infra.serving.registry.mlflow import MlflowRegistry
from infra.spec.models import Canary

GUARD_RECORD = "gpuplat-serve-guard"
"""the ConfigMap, beside the release record, that says what the canary's guard did last (`serve status`)"""
GUARD_RECORD_KEY = "guard"
LOOK_S = 5.0
"""how often the guard in the foreground reads the counters"""


def on_kubernetes(platform: ResolvedPlatform) -> bool:
    return platform.spec.scheduler.kind == "kueue"


def connect(platform: ResolvedPlatform) -> ClusterApi:
    """The cluster's API as the stack reaches it: kubernetes.kubeconfig and .context from the stack file,
    else $KUBECONFIG, else ~/.kube/config and its current context (the official client's own search,
    kubernetes/config/kube_config.py KUBE_CONFIG_DEFAULT_LOCATION)."""
    k8s = platform.spec.kubernetes
    # Read here, not left to the client: it reads $KUBECONFIG once, when kubernetes.config is imported
    # (kube_config.py, KUBE_CONFIG_DEFAULT_LOCATION at module level). A list of files is merged as kubectl
    # does (KubeConfigMerger).
    config_file = (k8s.kubeconfig if k8s is not None else None) or os.environ.get("KUBECONFIG") or None
    context = k8s.context if k8s is not None else None
    # urllib3's own retries off (the client hands `retries` to its pool: kubernetes/client/rest.py,
    # RESTClientObject, kubernetes 36.0.3): every call follows infra/k8s/api_retry.py's policy alone.
    configuration = Configuration()
    configuration.retries = False
    try:
        # persist_config off: a refreshed token is never written back into the user's kubeconfig.
        return ClusterApi(
            new_client_from_config(
                config_file=config_file,
                context=context,
                persist_config=False,
                client_configuration=configuration,
            )
        )
    except (ConfigException, OSError, TypeError, ValueError) as error:
        where = config_file or "$KUBECONFIG, else ~/.kube/config"
        raise ClusterError(
            f"stack '{platform.name}': no usable kubeconfig at {where} ({error}). On an EKS stack write one "
            "with `aws eks update-kubeconfig --name <cluster>` (or `pulumi stack output kubeconfig "
            "--show-secrets`); on an existing cluster set kubernetes.kubeconfig and kubernetes.context in "
            "the stack file"
        ) from None


@dataclass(frozen=True)
class KubernetesStatus:
    release: ServingRelease | None
    replicas: list[RunningReplica]
    guard: dict[str, Any] | None = None
    """the guard's last record (GUARD_RECORD): its phase, detail, share, when and by whom"""

    def as_json(self, model: str) -> dict[str, Any]:
        release = self.release
        return {
            "model": model,
            "stable": release.stable.reference if release else "serving.model",
            "canary": release.canary.reference if release and release.canary else None,
            "canary_percent": release.canary_percent if release else 0,
            "retiring": release.retiring.reference if release and release.retiring else None,
            "replicas": [
                {"pod": r.pod, "version": r.version, "image": r.image, "model": r.model, "ready": r.ready}
                for r in self.replicas
            ],
            "guard": self.guard,
        }


@dataclass
class KubernetesServing:
    platform: ResolvedPlatform
    api: ClusterApi
    say: Callable[[str], None] = lambda _: None
    timeout_s: float = 1800.0
    clock: Clock = field(default_factory=Clock)

    @property
    def namespace(self) -> str:
        return serving_namespace(self.platform)

    def _stack_model(self) -> str:
        serving = self.platform.spec.serving
        if serving is None:
            raise SpecError(
                f"stack '{self.platform.name}' serves no model: add a serving section to its stack file"
            )
        return serving.model

    def _driver(self, model: str, lock: ReleaseLock, facts: ClusterFacts) -> ReleaseDriver:
        return ReleaseDriver(self.api, self.platform, facts, model, lock, self.timeout_s, say=self.say)

    def _facts(self, recorded_uri: str | None) -> ClusterFacts:
        """What serving_objects needs of the cluster. An existing cluster's nodes mount the shared filesystem
        (host_path_facts). On EKS the release applies no PersistentVolume (gpuplat up's) and reads where the
        stack's own files are (facts.model_uri) from its record, else from the stack's own model servers."""
        if self.platform.spec.backend != "aws":
            return host_path_facts(self.platform)
        uri = recorded_uri or self._stack_servers_model()
        fs = self.platform.spec.storage.parallel_fs
        # The FSx attributes go only into the PersistentVolume, which `gpuplat up` applied and no release
        # step applies (serving_apply skips it): the pods mount its claim by name.
        not_applied = dict.fromkeys(("file_system_id", "dns_name", "mount_name"), "")
        return ClusterFacts(
            SharedVolume("fsx-csi", fs.mount_path, fs.capacity_tib, not_applied),
            region=self.platform.spec.region,
            model_uri=uri,
            pod_identity=True,
        )

    def _workload(self, name: str) -> dict[str, Any] | None:
        return self.api.get(ObjectRef(*workload_kind(self.platform), name, self.namespace))

    def _stack_servers_model(self) -> str:
        live = self._workload(MODEL_SERVER)
        template = ((live or {}).get("spec") or {}).get("template") or {}
        if "leaderWorkerTemplate" in ((live or {}).get("spec") or {}):
            template = live["spec"]["leaderWorkerTemplate"]["leaderTemplate"]  # type: ignore[index]
        for container in (template.get("spec") or {}).get("containers") or []:
            for env in container.get("env") or []:
                if env.get("name") == MODEL_ENV and env.get("value"):
                    return str(env["value"])
        raise ClusterError(
            f"stack '{self.platform.name}': neither a release record nor the stack's own model servers "
            f"({MODEL_SERVER} in namespace {self.namespace}) say where the stack's model is read: run "
            "`gpuplat up` first"
        )

    def _replicas_of(self, name: str) -> int:
        live = self._workload(name) or {}
        spec, status = live.get("spec") or {}, live.get("status") or {}
        return int(spec.get("replicas") or status.get("replicas") or 1)

    @contextmanager
    def _release(self, model: str) -> Iterator[tuple[ServingRelease | None, ReleaseDriver]]:
        lock = ReleaseLock(self.api, self.namespace, model, default_holder(), now=self.api.server_now)
        # No call is retried past the Lease this command holds (infra/k8s/api_retry.py).
        self.api.retry.bound = lock.seconds_left
        settle_unstarted(self.api, self.namespace, model, self.say)
        lock.acquire()
        try:
            current, uri = read_record(self.api, self.namespace)
            if current is not None and current.stable.reference.partition("@")[0] != model:
                raise SpecError(
                    f"stack '{self.platform.name}' serves {current.stable.reference}: its model servers and "
                    f"gateways serve one model, not {model}"
                )
            driver = self._driver(model, lock, self._facts(uri))
            # Read again by the driver: the resourceVersion it reads guards this command's writes of it.
            current = driver.current()
            yield driver.resume(current), driver
        finally:
            # An API that stopped answering must not hide why the release stopped: the Lease then ends
            # by itself after its duration.
            with suppress(ClusterError):
                lock.release()

    def _play(self, driver: ReleaseDriver, steps: Callable[[], list[ReleaseStep]]) -> ServingRelease:
        try:
            planned = steps()
        except ReleaseRefused as refused:
            raise GpuPlatError(str(refused), exit_code=ExitCode.BAD_INPUT) from None
        ended = driver.play(planned)
        if ended is None:
            raise GpuPlatError("no step to take")
        return ended

    def deploy(self, version: ServedVersion, canary: int | None) -> ServingRelease:
        model = version.reference.partition("@")[0]
        with self._release(model) as (current, driver):
            return self._deploy(current, driver, version, canary)

    def _deploy(
        self,
        current: ServingRelease | None,
        driver: ReleaseDriver,
        version: ServedVersion,
        canary: int | None,
    ) -> ServingRelease:
        if current is None:
            if canary is not None:
                raise SpecError(
                    f"the stack's own model servers serve {self._stack_model()}: the first release takes "
                    f"over from them with those files registered (deploy NAME@VERSION without --canary), "
                    f"then a canary of {version.reference}"
                )
            replicas = self._replicas_of(MODEL_SERVER)
            return self._play(driver, lambda: take_over(self._stack_model(), version, replicas))
        if canary is None and current.stack_model != "gone":
            return self._play(driver, lambda: self._finish_take_over(current, version))
        if canary is None:
            raise SpecError(
                f"{current.stable.reference} serves: on Kubernetes a version takes over through a canary "
                f"(deploy {version.reference} --canary PERCENT, then `gpuplat serve promote "
                f"{driver.model}`)"
            )
        return self._play(driver, lambda: deploy_canary(current, version, canary))

    def _finish_take_over(self, current: ServingRelease, version: ServedVersion) -> list[ReleaseStep]:
        """A take-over stopped after its first step (killed, or out of time while the gateways rolled): the
        same deploy again plays it from the start (each step's objects applied again are no change)."""
        if version.reference != current.stable.reference:
            raise ReleaseRefused(
                f"the take-over by {current.stable.reference} from the stack's own model servers did not "
                f"end: deploy {current.stable.reference} again to finish it"
            )
        if current.stack_model == "retiring":
            return finish_promotion(current)
        return take_over(self._stack_model(), current.stable, current.stable_replicas or 1)

    def promote(self, model: str) -> ServingRelease:
        with self._release(model) as (current, driver):
            if current is None:
                raise SpecError(f"no release of {model} on stack '{self.platform.name}': nothing to promote")
            stable_workload, _ = version_track_names(current.stable)
            replicas = self._replicas_of(stable_workload)
            return self._play(driver, lambda: promote(current, replicas))

    def rollback(self, model: str) -> ServingRelease:
        with self._release(model) as (current, driver):
            if current is None:
                raise SpecError(
                    f"no release of {model} on stack '{self.platform.name}': nothing to roll back"
                )
            return self._play(driver, lambda: rollback(current))

    def status(self) -> KubernetesStatus:
        current, _ = read_record(self.api, self.namespace)
        guard = read_guard_record(self.api, self.namespace)
        model = str((guard or {}).get("model") or "")
        if (guard or {}).get("phase") == "starting" and model:
            # Best effort: status is a read, and an identity granted only reads is refused the Job's patch or
            # delete; what it answers is then the status as found, the settling left to a releasing command.
            try:
                settle_unstarted(self.api, self.namespace, model, self.say)
            except ClusterError as error:
                job = str((guard or {}).get("by") or "").removeprefix("job/")
                self.say(
                    f"the guard Job {job}, whose start a stopped command left half done, was not settled "
                    f"({error.message.rstrip('.')}): the next `serve deploy`, `guard`, `promote` or "
                    "`rollback` settles it"
                )
            guard = read_guard_record(self.api, self.namespace)
        by = str((guard or {}).get("by") or "")
        if guard is not None and by.startswith("job/"):
            guard = {**guard, "job_state": guard_job_state(self.api, self.namespace, by.removeprefix("job/"))}
        return KubernetesStatus(current, list(running_replicas(self.api, self.namespace)), guard)

    # The canary's guard in the foreground

    def deploy_and_guard(self, version: ServedVersion, canary: int, duration_s: float | None) -> Verdict:
        """`deploy` of a canary, then its guard (`guard`) under the same Lease: no other command comes
        between the share it was given and the analysis of it."""
        model = version.reference.partition("@")[0]
        with self._release(model) as (current, driver):
            deployed = self._deploy(current, driver, version, canary)
            self.say(f"{version.reference} is in canary with {deployed.canary_percent} % of the requests")
            return self._guard(driver, model, duration_s, past_gate=False)

    def guard(self, model: str, duration_s: float | None, past_gate: bool = False) -> Verdict:
        """The running canary's analysis, or its release through serving.canary.steps (carry.guard), on
        counts since this command's first look (or since a step moved the share)."""
        with self._release(model) as (current, driver):
            if current is None or current.canary is None:
                stable = current.stable.reference if current else "the stack's own model"
                raise SpecError(
                    f"no canary of {model} on stack '{self.platform.name}' ({stable} serves every request): "
                    f"`gpuplat serve deploy {model}@VERSION --canary PERCENT` starts one"
                )
            return self._guard(driver, model, duration_s, past_gate)

    # The guard Job (infra/serving/guard_job_start.py): the release carried on inside the cluster

    def deploy_and_detach(self, version: ServedVersion, canary: int, duration_s: float | None) -> str:
        """`deploy` of a canary, then its guard Job started and the Lease handed to it; the Job's name."""
        model = version.reference.partition("@")[0]
        with self._release(model) as (current, driver):
            deployed = self._deploy(current, driver, version, canary)
            self.say(f"{version.reference} is in canary with {deployed.canary_percent} % of the requests")
            return start_guard_job(driver, deployed, duration_s=duration_s)

    def detach_guard(self, model: str, duration_s: float | None, past_gate: bool = False) -> str:
        """The running canary's guard Job started (`serve guard --detach`); the Job's name."""
        with self._release(model) as (current, driver):
            if current is None or current.canary is None:
                raise SpecError(
                    f"no canary of {model} on stack '{self.platform.name}': `gpuplat serve deploy "
                    f"{model}@VERSION --canary PERCENT --detach` starts one with its guard"
                )
            return start_guard_job(driver, current, past_gate=past_gate, duration_s=duration_s)

    def _guard(self, driver: ReleaseDriver, model: str, duration_s: float | None, past_gate: bool) -> Verdict:
        carried = ClusterCarried(self, driver)
        return carry.guard(
            carried, model, duration_s, LOOK_S, self.clock.sleep, self.clock.monotonic, past_gate=past_gate
        )


@dataclass
class ClusterCarried:
    """carry.Carried on a Kueue stack: the counters read from the pods, each share, promotion and rollback
    played as `serve deploy`, `promote` and `rollback` play theirs, under the Lease the command holds."""

    serving: KubernetesServing
    driver: ReleaseDriver
    canary_start: tuple[float, Counts | Reading, Counts | Reading] | None = None
    lease_s: float = LEASE_DURATION_S

    @property
    def rules(self) -> Canary:
        serving = self.serving.platform.spec.serving
        return (serving.canary if serving is not None else None) or Canary()

    def say(self, line: str) -> None:
        self.serving.say(line)

    def _current(self) -> ServingRelease:
        current = self.driver.current()
        if current is None:
            raise ClusterError(
                f"the release record ({self.serving.namespace}) is gone: no release of {self.driver.model}"
            )
        return current

    def has_canary(self, model: str) -> bool:
        current = self.driver.current()
        return current is not None and current.canary is not None

    def share(self) -> int:
        return self._current().canary_percent

    def servers_up(self) -> tuple[int, int]:
        """As the gateway pods' exporters count them (HAProxy's active servers of each backend)."""
        return pod_servers_up(self.serving.api, self.serving.namespace, self.say)

    def counters(self) -> tuple[Reading, Reading]:
        serving = self.serving.platform.spec.serving
        engine = serving.engine if serving is not None else "cpu-reference"
        return pod_readings(
            self.serving.api,
            self.serving.namespace,
            self._current(),
            latency_histogram(engine),
            itl_histograms(engine),
            self.say,
        )

    def set_share(self, percent: int) -> None:
        self._still_held(f"moving the canary's share to {percent} %")
        current = self._current()
        canary = current.canary
        if canary is None:
            raise ClusterError(f"no canary of {self.driver.model} any more: its share cannot move")
        self.serving._play(self.driver, lambda: deploy_canary(current, canary, percent))
        # The share rolled the gateway pods, whose counters start again under new names, and the rollout
        # took its time: the step's analysis counts from its first look after it, not from before.
        self.canary_start = None

    def promote(self, model: str) -> ServedVersion:
        self._still_held("promoting the canary")
        current = self._current()
        replicas = self.serving._replicas_of(version_track_names(current.stable)[0])
        return self.serving._play(self.driver, lambda: promote(current, replicas)).stable

    def rollback(self, model: str, reason: str = "asked for") -> ServingRelease:
        self._still_held(f"rolling the canary back ({reason})")
        current = self._current()
        self.say(f"rolling {model}'s canary back: {reason}")
        return self.serving._play(self.driver, lambda: rollback(current))

    def record(self, model: str, phase: str, detail: str, percent: int | None = None) -> None:
        """What the guard did last, in GUARD_RECORD (applied whole), by the API server's clock; a record
        that is not written is said, and the release goes on (only its record is behind)."""
        self._still_held(f"recording '{phase}'")
        state = {
            "model": model,
            "phase": phase,
            "detail": detail,
            "canary_percent": percent,
            "steps": [step.percent for step in self.rules.steps],
            "at": self.serving.api.server_now().isoformat(timespec="seconds"),
            "by": self.driver.lock.holder,
        }
        try:
            self.serving.api.apply(guard_record_manifest(self.serving.namespace, state))
        except ClusterError as error:
            self.say(f"the guard's record was not written ({phase}): {error.message}")

    def _still_held(self, before: str) -> None:
        """Before a change: the Lease read again and renewed (release_lock.still_held)."""
        still_held(self.driver.lock, before, self.say)

    def lock_lost(self, model: str) -> bool:
        """The Lease read and renewed at every look, a GET and a PUT each `LOOK_S`
        (release_lock.lost_at_look)."""
        return lost_at_look(self.driver.lock, self.say)


def guard_record_manifest(namespace: str, state: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": GUARD_RECORD,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER},
        },
        "data": {GUARD_RECORD_KEY: json.dumps(state)},
    }


def guard_job_state(api: ClusterApi, namespace: str, name: str) -> str:
    """What the guard Job the record names is now, which its record cannot say once its pod is gone: failed
    (the reason of its Failed condition: DeadlineExceeded, BackoffLimitExceeded, PodFailurePolicy), gone
    (deleted, or removed after its TTL), complete, suspended or running; unread where this identity may not
    get Jobs."""
    try:
        job = api.get(ObjectRef("batch/v1", "Job", name, namespace))
    except ClusterError as error:
        return f"unread ({error.message})"
    if job is None:
        return "gone"
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Failed":
            said = f": {condition['message']}" if condition.get("message") else ""
            return f"failed ({condition.get('reason') or 'no reason given'}{said})"
        if condition.get("type") == "Complete":
            return "complete"
    return "suspended" if (job.get("spec") or {}).get("suspend") else "running"


def kubernetes_registry(platform: ResolvedPlatform, url: str | None) -> MlflowRegistry:
    """The registry a Kueue stack's versions come from: the platform deploys none on Kubernetes yet
    (infra/spec/cross_checks.py refuses serving.registry there), so one the operator runs, by its URL."""
    if not url:
        raise SpecError(
            f"stack '{platform.name}' runs on Kubernetes, where the platform deploys no model registry yet: "
            "give the MLflow registry the version is registered in with --registry-url or "
            "GPUPLAT_REGISTRY_URL (its source an s3:// URI the model servers read, or a path on the shared "
            "filesystem)"
        )
    return MlflowRegistry(url, credential=operator_credential(platform, url))
