"""`gpuplat serve`: registered model versions onto the stack's model servers, with a canary in between.

Where things live (local and on-premises stacks; roles/inference_server, roles/inference_gateway):
- each model-server node runs the stable replicas (<unit>@0..R-1) and has a canary slot (<unit>@canary),
  whose port the gateways' canary backend routes to;
- what a replica serves is the stack's model, or the registered version its version file names
  (/etc/gpuplat-inference/version-<replica>.env), which only this module writes: a converge keeps it;
- the gateways' version map gives the canary its share of the requests (gpuplat_gateway_canary.py);
- the registry's aliases say which version is which: `champion` the stable one, `challenger` the canary,
  `previous` the champion before the last promotion (what a rollback returns to).

A promotion never leaves the stable backend without a server and never sends every request to one slot:
the canary keeps its share while the stable replicas restart on its version one at a time, each drained on
every gateway first (the canary takes every request only while the last stable server up restarts); then
its share goes to 0 and each canary server is drained on every gateway before it stops.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from infra.errors import ExitCode, GpuPlatError, SpecError
from infra.nodes.inventory import container_name
from infra.nodes.reach import RunningInstance, host_addresses
from infra.nodes.role_templates import role_defaults, role_vars
from infra.platform.resolve import ResolvedPlatform
from infra.platform.serving_layout import CanaryGpus
from infra.serving import carry, stopped_mark
from infra.serving.analysis import Verdict
from infra.serving.canary import gate
from infra.serving.carry import PROMOTED, ROLLED_BACK
from infra.serving.counts import Counts, Histogram, Reading, Series
from infra.serving.engine_metrics import itl_histograms, latency_histogram
from infra.serving.golden import GOLDEN_FILE
from infra.serving.golden import PROBE as GOLDEN_PROBE
from infra.serving.golden import misses as golden_misses
from infra.serving.lock import LEASE_S, LockLost, ReleaseLock
from infra.serving.metrics_text import (
    METRICS_READ,
    GatewayFigures,
    answering_ports,
    parse_metrics,
    served_versions,
)
from infra.serving.prometheus import instant
from infra.serving.registry.mlflow import MlflowRegistry, ModelVersion, RegistryError
from infra.serving.version_record import VersionRecord
from infra.spec.models import Canary, Serving

CHAMPION, CHALLENGER, PREVIOUS = "champion", "challenger", "previous"
CANARY_SLOT = "canary"
# Where the roles put things (their defaults and vars: one source).
_SERVER, _GATEWAY = role_defaults("inference_server"), role_vars("inference_gateway")
_SERVER_VARS = role_vars("inference_server")
UNIT = str(_SERVER["inference_server_service"])
CONFIG_DIR = str(_SERVER["inference_server_config_dir"])
REPLICA_PORT, CANARY_PORT = (
    int(_SERVER["inference_server_port"]),
    int(_SERVER["inference_server_canary_port"]),
)
GATEWAY_PROGRAMS = str(_GATEWAY["__inference_gateway_targets_dir"])
TARGETS_UNIT = str(_GATEWAY["__inference_gateway_targets_unit"])
STABLE_BACKEND, CANARY_BACKEND = "inference", str(_GATEWAY["__inference_gateway_canary_backend"])
# The Prometheus jobs that scrape the stable replicas and the canary slots (roles/monitoring).
JOB_OF_BACKEND = {STABLE_BACKEND: "inference_server", CANARY_BACKEND: "inference_canary"}
VERSION_MARK = str(_SERVER_VARS["__inference_server_version_mark"])
"""a version file's first line: this, then the version it names"""
SOURCE_MARK = "# gpuplat source: "
"""an object-store version's file, second line: this, its URI, a space, where the node keeps its copy (the
boot of an aws inference node reads the same line: infra/backends/aws/node_join.py)"""
BORROW_MARK = str(_SERVER_VARS["__inference_server_loan_mark"])
"""a borrowing canary's version file: this line names the stable replica whose GPUs it runs on (which the
canary's stop gives back): the record outlives the command that borrowed it, and the role's converge leaves
that replica alone while it stands (roles/inference_server tasks/loan.yml)"""
KEEP = "keep"
"""`stop_canary`: a borrowed replica returns on the version its own file names"""
VERSIONS_DIR = f"{_SERVER['inference_server_model_dir']}/versions"
"""where a node keeps its copies of object-store versions"""
# The role's AWS CLI (roles/inference_server engine-vllm.yml installs it into its venv where the model is
# in the object store) and the copy, as the role copies the stack's own model.
AWS_CLI = f"{_SERVER['inference_server_install_dir']}/venv/bin/aws"
# A version gone from the bucket copies nothing and `aws s3 sync` still exits 0: an empty copy is a failure.
FETCH = '"$1" s3 sync --only-show-errors "$2" "$3" && [ -n "$(ls -A "$3" 2>/dev/null)" ]'
UNSAFE_IN_PATH = set(" \t\n\"'\\$`")
# The guard's record of each model's release on the first gateway's node (persistent: `serve status` reads
# it after the guard's command ended, or the node restarted), written whole (a temporary file renamed).
STATE_DIR = "/var/lib/gpuplat-serve"
STATE_WRITE = 'mkdir -p "$1" && printf %s "$3" > "$1/.$2.json" && mv "$1/.$2.json" "$1/$2.json"'


def servers_up(figures: GatewayFigures) -> tuple[int, int]:
    """The canary's servers and the stable's that every gateway counts up: what a share spreads over."""
    return figures.servers_up.get(CANARY_BACKEND, 0), figures.servers_up.get(STABLE_BACKEND, 0)


class ServeRefused(GpuPlatError):
    """A release the stack's rules or state do not allow (a gate missed, no canary to promote)."""

    exit_code = ExitCode.POLICY_VIOLATION


class Nodes(Protocol):
    def exec(self, node: str, *command: str, timeout: float = 120) -> str: ...


@dataclass(frozen=True)
class ServingLayout:
    """The nodes and ports a release touches."""

    gateways: tuple[str, ...]
    servers: tuple[str, ...]
    addresses: dict[str, str]
    """node -> the address the other nodes reach it by: a model server's is the one the gateways know it by,
    a gateway's the one the detached guard's followers reach it at (infra/serving/guard_peers.py)"""
    engine: str
    health_timeout_s: float
    drain_s: float = 60.0
    """how long a server's requests in flight may take to end on a gateway before it stops: the gateway's
    own time limit for a request (serving.gateway_timeout_s) and a margin"""
    slots_follow_instances: bool = False
    """aws: the gateways' slots are filled from the running instances (gpuplat_gateway_targets.py), not
    fixed lines of haproxy.cfg"""
    versions_from_object_store: bool = False
    """aws: the model servers mount no shared filesystem; each copies a version from the object store"""
    canary_gpus: CanaryGpus = "beside"
    """where the canary runs (infra/platform/serving_layout.py): beside the replicas on every node (no GPU),
    on every node's spare GPU group (the role's replica-canary.env names it), or on one stable replica's
    GPUs it borrows on one node"""


def servable(platform: ResolvedPlatform) -> Serving:
    """The stack's serving section, or one paragraph saying why `gpuplat serve` cannot drive the stack
    (asked before the registry is: a registry would not help). A Kueue stack is driven through its
    cluster's API (infra/serving/on_kubernetes.py), not through the nodes this module reaches."""
    serving = platform.spec.serving
    if serving is None:
        raise SpecError(f"stack '{platform.name}' serves no model: add a serving section to its stack file")
    return serving


def serving_layout(
    platform: ResolvedPlatform, instances: Sequence[RunningInstance] | None = None
) -> ServingLayout:
    """The nodes a release touches: on an AWS stack the running `instances` of its serving and gateway pools
    (infra/nodes/reach.py stack_instances: an Auto Scaling group's instances come and go), elsewhere the
    stack file's nodes."""
    serving = servable(platform)
    if platform.spec.scheduler.kind == "kueue":
        raise SpecError(
            f"stack '{platform.name}' runs on Kubernetes (kueue): its model servers are the cluster's pods, "
            "which `gpuplat serve` drives through the cluster's API (infra/serving/on_kubernetes.py), not "
            "through nodes"
        )
    pool = platform.pool(serving.pool)
    layout = platform.serving_layout
    if platform.spec.backend == "aws":
        servers, gateways, addresses = _running_layout(platform, pool.name, instances)
    else:
        servers = tuple(pool.running_node_names())
        gateways = tuple(platform.gateway_pool.running_node_names())
        # The address each gateway's haproxy.cfg names the server by: its ansible_host in the inventory.
        if platform.spec.backend == "onprem":
            addresses = {node: host_addresses(platform)[node] for node in (*servers, *gateways)}
        else:
            addresses = {node: container_name(platform.name, node) for node in (*servers, *gateways)}
    return ServingLayout(
        gateways=gateways,
        servers=servers,
        addresses=addresses,
        engine=serving.engine,
        health_timeout_s=600.0,
        drain_s=serving.gateway_timeout_s + 10,
        slots_follow_instances=platform.spec.backend == "aws",
        versions_from_object_store=platform.spec.backend == "aws",
        canary_gpus=layout.canary if layout is not None else "beside",
    )


def _running_layout(
    platform: ResolvedPlatform, serving_pool: str, instances: Sequence[RunningInstance] | None
) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]:
    """An AWS stack's model-server and gateway nodes: its running instances of each pool, the servers by the
    private address the gateways' slots route to (gpuplat_gateway_targets.py)."""
    gateway_pool = platform.gateway_pool.name
    if instances is None:
        raise SpecError(f"stack '{platform.name}' is on aws: its serving nodes are its running instances")
    servers = tuple(i.node for i in instances if i.pool == serving_pool and i.address)
    gateways = tuple(i.node for i in instances if i.pool == gateway_pool)
    if not servers or not gateways:
        missing = f"pool '{serving_pool}'" if not servers else f"gateway pool '{gateway_pool}'"
        raise ServeRefused(
            f"stack '{platform.name}' has no running instance of its {missing} (tagged gpuplat:stack "
            f"{platform.name}, gpuplat:pool, state running, with a private address): `gpuplat up` it, or "
            "wait for the Auto Scaling group's instances to start, then serve"
        )
    reached = {*servers, *gateways}
    return servers, gateways, {i.node: i.address for i in instances if i.node in reached and i.address}


def version_environment(version: ModelVersion, engine: str, object_store: bool = False) -> str:
    """The version file of a replica that serves `version` (systemd EnvironmentFile syntax). With
    `object_store` (aws: the model servers mount no shared filesystem) the version is in the object store
    and each node copies it to its own disk first (`version_source`, the file's second line)."""
    location = version.location
    source = None
    if object_store:
        if not location.startswith("s3://"):
            raise ServeRefused(
                f"{version.reference} is at {location}: on aws the model servers mount no shared filesystem "
                "and copy a version from the object store; register it from the stack's models bucket "
                "(`gpuplat models register NAME s3://<models bucket>/...`)"
            )
        source, location = location.rstrip("/"), f"{VERSIONS_DIR}/{version.name}/{version.version}"
    elif not location.startswith("/"):
        raise ServeRefused(
            f"{version.reference} is at {location}: model servers read a version from the shared filesystem; "
            "copy it there and register that path (`gpuplat models register NAME /shared/...`)"
        )
    if UNSAFE_IN_PATH & set(source or location):
        raise ServeRefused(
            f"{version.reference}'s path '{source or location}' holds a space, quote or $: rename it"
        )
    head = VERSION_MARK + version.reference + "\n"
    if source is not None:
        head += f"{SOURCE_MARK}{source} {location}\n"
    if engine == "cpu-reference":
        value = f"--model-zip {location.rstrip('/')}/model.zip --model-version {version.reference}"
        return f'{head}GPUPLAT_MODEL_ARGS="{value}"\n'
    return f"{head}GPUPLAT_MODEL_PATH={location}\n"


def version_source(environment: str) -> tuple[str, str] | None:
    """An object-store version's source and the node's copy of it (its file's SOURCE_MARK line), or None."""
    for line in environment.splitlines():
        if line.startswith(SOURCE_MARK):
            source, _, local = line.removeprefix(SOURCE_MARK).partition(" ")
            return source, local
    return None


@dataclass(frozen=True)
class ReplicaServing:
    node: str
    slot: str
    """a stable replica's number, or the canary slot"""
    port: int
    answering: bool
    version: str | None
    """the registered version its server names, "" the stack's own model, None: it names none"""
    lent: bool = False
    """a stable replica stopped while a canary runs on its GPUs (serving.canary.gpus borrow)"""


class Release:
    """One stack's serving, as the registry, the gateways and the model-server nodes hold it."""

    lease_s = LEASE_S
    """the release lock's lease (infra/serving/lock.py)"""
    version_record: VersionRecord | None = None
    """an AWS stack's record of the stable version, which instances booted later serve (None elsewhere)"""
    relist: Callable[[], Sequence[RunningInstance]] | None = None
    """an AWS stack's running instances listed again (and made reachable): a roll takes every instance
    running once the record is written, not only those of the command's start (None elsewhere)"""

    def __init__(
        self,
        platform: ResolvedPlatform,
        registry: MlflowRegistry,
        nodes: Nodes,
        say: Callable[[str], None] = lambda _: None,
        prometheus_url: str | None = None,
        instances: Sequence[RunningInstance] | None = None,
        version_record: VersionRecord | None = None,
        relist: Callable[[], Sequence[RunningInstance]] | None = None,
    ) -> None:
        self.platform = platform
        self.registry = registry
        self.nodes = nodes
        self.say = say
        self.prometheus_url = prometheus_url
        self.layout = serving_layout(platform, instances)
        self.version_record = version_record
        self.relist = relist
        serving = platform.spec.serving
        assert serving is not None
        self.rules = serving.canary or Canary()
        self.canary_start: tuple[float, Counts | Reading, Counts | Reading] | None = None
        """when `deploy` gave the canary its share, and the counters just before"""

    # One release at a time per model

    @contextmanager
    def exclusive(self, model: str, what: str) -> Iterator[None]:
        """Hold `model`'s release lock (infra/serving/lock.py: a lease on the first gateway's node, renewed
        while `what` runs): a second deploy, promote, rollback or guard of the model meets it and is refused,
        saying who holds it. A lock whose holder's lease ended, or whose holder was a process of this host
        that is gone, is taken over."""
        held: dict[str, ReleaseLock] = self.__dict__.setdefault("_held", {})
        if model in held:
            yield
            return
        lock = ReleaseLock(self.nodes, self.layout.gateways[0], model, what, self.say, self.lease_s)
        lock.take()
        held[model] = lock
        try:
            yield
        finally:
            held.pop(model, None)
            lock.release()

    def hand_over(self, model: str, to: str) -> None:
        """Give `model`'s release lock, which `exclusive` holds, to the process that takes it under the name
        `to` (ReleaseLock.hand_over): it stays held until that one has it."""
        self._fence("handing the release lock over")
        self.__dict__["_held"][model].hand_over(to)

    def lock_lost(self, model: str) -> bool:
        """Whether this command held `model`'s release lock and lost it (its lease ended unrenewed)."""
        lock = self.__dict__.get("_held", {}).get(model)
        return lock is not None and not lock.held()

    def _fence(self, step: str) -> None:
        """Refuse `step`, a change to the nodes or the registry, once this command lost a release lock it
        holds: a holder stopped past its lease (SIGSTOP, the node out of reach) and resumed must not carry
        on beside the command that took the lock over (two promotes interleaved, replica by replica)."""
        held: dict[str, ReleaseLock] = self.__dict__.get("_held", {})
        for model, lock in held.items():
            if not lock.held():
                raise LockLost(
                    f"this command lost the release lock of '{model}' (its lease was not renewed within "
                    f"{lock.lease_s} s) and stopped before {step}: another command may carry the release "
                    f"now. `gpuplat serve status {model}` shows where it stands; `gpuplat serve rollback "
                    f"{model}` puts every replica back on the stable version"
                )

    # The guard's record

    def record(self, model: str, phase: str, detail: str, percent: int | None = None) -> None:
        """What the release of `model` is doing (phase: analysing, gated, promoted, rolled back, ...)."""
        self._fence(f"writing the release's record ({phase})")
        state = {
            "phase": phase,
            "detail": detail,
            "canary_percent": percent,
            "steps": [step.percent for step in self.rules.steps],
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "by": f"pid {os.getpid()} on {socket.gethostname()}",
        }
        try:
            self.nodes.exec(
                self.layout.gateways[0], "sh", "-c", STATE_WRITE, "state", STATE_DIR, model, json.dumps(state)
            )
        except GpuPlatError as error:  # the release goes on; only its record is behind
            self.say(f"the release's record was not written ({phase}): {error.message}")

    def recorded(self, model: str) -> dict[str, Any] | None:
        """The last record of `model`'s release (None: none yet)."""
        path = f"{STATE_DIR}/{model}.json"
        text = self.nodes.exec(self.layout.gateways[0], "sh", "-c", f'cat "{path}" 2>/dev/null || true')
        try:
            found: dict[str, Any] = json.loads(text)
        except ValueError:
            return None
        return found

    # What is served

    def aliased(self, model: str, alias: str) -> ModelVersion | None:
        try:
            return self.registry.by_alias(model, alias)
        except RegistryError as error:
            if "not found" in error.message or "RESOURCE_DOES_NOT_EXIST" in error.message:
                return None
            raise

    def booted_version(self) -> str | None:
        """What an instance the serving pool starts now serves: the version its stack's record names, "" the
        stack's own model; None where instances do not come and go (local, on-premises)."""
        if self.version_record is None:
            return None
        text = self.version_record.read()
        if not text:
            return ""
        first = text.splitlines()[0]
        return first.removeprefix(VERSION_MARK) if first.startswith(VERSION_MARK) else f"?: {first[:80]}"

    def gateway_figures(self, gateway: str) -> GatewayFigures:
        answer = self.nodes.exec(gateway, "python3", f"{GATEWAY_PROGRAMS}/gpuplat_gateway_canary.py", "show")
        try:
            return GatewayFigures.from_show(json.loads(answer))
        except (ValueError, KeyError, TypeError) as error:
            raise GpuPlatError(
                f"{gateway}'s gateway answered `gpuplat_gateway_canary.py show` with something else than "
                f"its figures ({type(error).__name__}: {error}; {answer[:120]!r}): `gpuplat up` installs "
                "the program"
            ) from None

    def figures(self) -> GatewayFigures:
        """Every gateway's figures: requests and errors summed, the servers up on every gateway (the least
        any counts), the largest canary share any gives."""
        each = [self.gateway_figures(gateway) for gateway in self.layout.gateways]
        backends = each[0].requests
        return GatewayFigures(
            canary_percent=max(f.canary_percent for f in each),
            requests={b: sum(f.requests.get(b, 0) for f in each) for b in backends},
            errors={b: sum(f.errors.get(b, 0) for f in each) for b in backends},
            servers_up={b: min(f.servers_up.get(b, 0) for f in each) for b in backends},
        )

    def latency_p95(self, window_s: int) -> dict[str, float | None]:
        """p95 of each version's requests at its model servers over the last `window_s` (Prometheus);
        None where no request was answered in it or no Prometheus answers."""
        found: dict[str, float | None] = dict.fromkeys(JOB_OF_BACKEND)
        if self.prometheus_url is None:
            return found
        histogram = role_vars("monitoring")["__monitoring_engine_metrics"][self.layout.engine][
            "latency_histogram"
        ]
        jobs = "|".join(JOB_OF_BACKEND.values())
        expression = (
            f'histogram_quantile(0.95, sum by (job, le) (rate({{__name__=~"{histogram}_bucket", '
            f'job=~"{jobs}"}}[{window_s}s])))'
        )
        by_job = {labels.get("job"): value for labels, value in instant(self.prometheus_url, expression)}
        return {backend: by_job.get(job) for backend, job in JOB_OF_BACKEND.items()}

    def latency_histogram_name(self) -> str:
        return latency_histogram(self.layout.engine)

    def itl_histogram_names(self) -> tuple[str, ...]:
        return itl_histograms(self.layout.engine)

    def latency_histograms(self) -> dict[str, Series | None]:
        """`histograms`' time to the first token alone."""
        return self.histograms()[0]

    def histograms(self) -> tuple[dict[str, Series | None], dict[str, Series | None]]:
        """Each version's latency and inter-token latency histograms, cumulative, by model server
        (node:port), read from the servers' own /metrics at this instant: the time to the first token (for
        the CPU reference server the whole answer, its only token), and the gaps between an answer's tokens
        (an LLM engine's). Both versions at the same instant, as the gateway's counters are: a Prometheus
        scrape of each at its own phase would compare windows that differ by up to a scrape interval, load
        bursts in one and not the other. Each server on its own, so that a restart or a missed read of one
        is told from the others (counts.SinceStart). None where no server answered."""
        histogram, itl_names = self.latency_histogram_name(), self.itl_histogram_names()
        found: dict[str, dict[str, Histogram]] = {backend: {} for backend in JOB_OF_BACKEND}
        gaps: dict[str, dict[str, Histogram]] = {backend: {} for backend in JOB_OF_BACKEND}
        for node in self.layout.servers:
            ports = {REPLICA_PORT + replica: STABLE_BACKEND for replica in self._replicas(node)}
            ports[CANARY_PORT] = CANARY_BACKEND
            answer = self.nodes.exec(
                node, "python3", "-c", METRICS_READ, "127.0.0.1", *map(str, ports), timeout=30
            )
            server = self.layout.addresses.get(node, node)
            for port, read in parse_metrics(answer, histogram).items():
                if port in ports:
                    found[ports[port]][f"{server}:{port}"] = read
            for name in itl_names:
                for port, read in parse_metrics(answer, name).items():
                    if port in ports:
                        gaps[ports[port]].setdefault(f"{server}:{port}", read)
        return (
            {backend: series or None for backend, series in found.items()},
            {backend: series or None for backend, series in gaps.items()},
        )

    def replicas_serving(self) -> list[ReplicaServing]:
        """What each replica (and canary slot) of each node serves now, as its own server says: the version
        its /metrics names, "" for the stack's own model, None where it does not answer or names none."""
        found: list[ReplicaServing] = []
        lent = {node: str(replica) for node, replica in self.borrowed_replicas().items()}
        for node in self.layout.servers:
            slots = {str(replica): REPLICA_PORT + replica for replica in self._replicas(node)}
            slots[CANARY_SLOT] = CANARY_PORT
            answer = self.nodes.exec(
                node, "python3", "-c", METRICS_READ, "127.0.0.1", *map(str, slots.values()), timeout=30
            )
            versions, up = served_versions(answer), answering_ports(answer)
            found += [
                ReplicaServing(node, slot, port, port in up, versions.get(port), lent.get(node) == slot)
                for slot, port in slots.items()
            ]
        return found

    def _replicas(self, node: str) -> list[int]:
        """`stable_replicas`, read once per node and release."""
        known: dict[str, list[int]] = self.__dict__.setdefault("_replicas_of", {})
        if node not in known:
            known[node] = self.stable_replicas(node)
        return known[node]

    def readings(self, latency: bool = True) -> tuple[Reading, Reading]:
        """The stable's and the canary's counters now: every gateway's requests and errors, and (with
        `latency`) the latency histograms. A gateway that does not answer is left out of this look (its
        counters count at its next); none answering fails the look."""
        by_gateway: dict[str, GatewayFigures] = {}
        failures: list[str] = []
        for gateway in self.layout.gateways:
            try:
                by_gateway[gateway] = self.gateway_figures(gateway)
            except GpuPlatError as error:
                failures.append(f"{gateway}: {error.message}")
        if not by_gateway:
            raise GpuPlatError("no gateway answered: " + "; ".join(failures))
        for failure in failures:
            self.say(f"left out of this look: {failure}")
        none: dict[str, Series | None] = dict.fromkeys(JOB_OF_BACKEND)
        histograms, gaps = self.histograms() if latency else (none, none)
        stable, canary = (
            Reading.of_gateways(
                {
                    gateway: Counts(figures.requests[backend], figures.errors[backend])
                    for gateway, figures in by_gateway.items()
                },
                histograms[backend],
                gaps[backend],
            )
            for backend in (STABLE_BACKEND, CANARY_BACKEND)
        )
        return stable, canary

    def counters(self) -> tuple[Reading, Reading]:
        """`readings`, without the latencies where Prometheus does not answer (saying so)."""
        try:
            return self.readings()
        except GpuPlatError as error:
            self.say(f"no latencies this look: {error.message}")
            return self.readings(latency=False)

    def set_share(self, percent: int) -> None:
        self._fence(f"setting the canary's share to {percent} %")
        for gateway in self.layout.gateways:
            self.nodes.exec(
                gateway, "python3", f"{GATEWAY_PROGRAMS}/gpuplat_gateway_canary.py", "share", str(percent)
            )

    # Steps on the nodes

    def _write_version(
        self,
        node: str,
        slot: str,
        version: ModelVersion | None,
        borrowed: tuple[str, int, str] | None = None,
    ) -> None:
        """The slot's version file (None: none, the stack's own model); a canary's on `borrowed` (node,
        replica, its GPUs) names the replica and runs on its GPUs."""
        self._fence(f"writing the version of slot {slot} on {node}")
        path = f"{CONFIG_DIR}/version-{slot}.env"
        if version is None:
            self.nodes.exec(node, "rm", "-f", path)
            return
        text = version_environment(version, self.layout.engine, self.layout.versions_from_object_store)
        source = version_source(text)
        if source is not None:  # a no-op where this node has the copy already (another slot's)
            try:
                self.nodes.exec(node, "sh", "-c", FETCH, "fetch", AWS_CLI, *source, timeout=3600)
            except GpuPlatError as error:
                raise GpuPlatError(
                    f"{node} could not copy {version.reference} from {source[0]} ({error.message}): the "
                    "inference nodes' role reads the stack's models bucket only; nothing was restarted on it"
                ) from None
        if borrowed is not None:
            text += f"{BORROW_MARK}{borrowed[1]}\nCUDA_VISIBLE_DEVICES={borrowed[2]}\n"
        script = 'printf %s "$1" > "$2.tmp" && mv "$2.tmp" "$2"'
        self.nodes.exec(node, "sh", "-c", script, "sh", text, path)

    def _version_file(self, node: str, slot: str) -> str:
        """The slot's version file as written ("" where there is none)."""
        path = f"{CONFIG_DIR}/version-{slot}.env"
        return self.nodes.exec(node, "sh", "-c", 'cat "$1" 2>/dev/null || true', "sh", path).strip()

    def _wait_healthy(self, node: str, port: int) -> None:
        probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/health', timeout=5)"
        loop = f"until python3 -c {shlex.quote(probe)} 2>/dev/null; do sleep 1; done"
        try:
            self.nodes.exec(
                node,
                "timeout",
                str(int(self.layout.health_timeout_s)),
                "sh",
                "-c",
                loop,
                timeout=self.layout.health_timeout_s + 30,
            )
        except GpuPlatError as error:
            raise GpuPlatError(
                f"the model server on {node}:{port} did not answer /health within "
                f"{self.layout.health_timeout_s:.0f} s: `journalctl -u {UNIT}@*` on {node} says why "
                f"({error.message})"
            ) from None

    def _on_gateways(self, command: str, backend: str, target: str) -> None:
        """gpuplat_gateway_targets.py `command` for `target` on every gateway (drain: no new request, and
        wait for those in flight to end; ready: out of drain, and wait until the gateway's checks count it
        up)."""
        self._fence(f"{command} of {target} on the gateways")
        for gateway in self.layout.gateways:
            self.nodes.exec(
                gateway,
                "python3",
                f"{GATEWAY_PROGRAMS}/gpuplat_gateway_targets.py",
                "--backend",
                backend,
                command,
                target,
                "--wait-s",
                str(int(self.layout.drain_s)),
                timeout=self.layout.drain_s + 30,
            )

    def _canary_target(self, node: str) -> str:
        return f"{self.layout.addresses[node]}:{CANARY_PORT}"

    def start_canary(self, version: ModelVersion) -> None:
        """The canary slot on `version`: on every node (beside the replicas, or on each node's spare GPUs),
        or on one node on the GPUs of a stable replica it borrows (`_borrow`)."""
        if self.layout.canary_gpus != "borrow":
            self._no_loan(version)
        borrowed = self._lender() if self.layout.canary_gpus == "borrow" else None
        nodes = self.layout.servers if borrowed is None else (borrowed[0],)
        try:
            if borrowed is not None:
                self._borrow(version, borrowed)
            else:
                for node in nodes:
                    self._write_version(node, CANARY_SLOT, version)
            for node in nodes:
                self.nodes.exec(node, "systemctl", "restart", f"{UNIT}@{CANARY_SLOT}.service")
            for node in nodes:
                self._wait_healthy(node, CANARY_PORT)
            self._fill_slots()
            for node in nodes:
                # The last canary's stop left its server drained on the gateways.
                self._on_gateways("ready", CANARY_BACKEND, self._canary_target(node))
            self._wait_canary_up(len(nodes))
        except GpuPlatError:
            if borrowed is not None:  # the replica's GPUs go back to it, on its own version
                self.say(
                    f"the canary did not come up: replica {borrowed[1]} on {borrowed[0]} takes its GPUs back"
                )
                self.stop_canary()
            raise

    def canary_nodes(self) -> tuple[str, ...]:
        """The nodes whose canary slot runs the canary: every server, or the one whose replica it borrows."""
        if self.layout.canary_gpus != "borrow":
            return self.layout.servers
        return tuple(self.borrowed_replicas())

    def borrowed_replicas(self) -> dict[str, int]:
        """node -> the stable replica whose GPUs its canary runs on (the canary's version file says so).
        Read whatever serving.canary.gpus says now: a stack switched from borrow to spare during a release
        still has its loan to end (`stop_canary` gives the replica back; the role refuses the switch until
        then)."""
        found: dict[str, int] = {}
        for node in self.layout.servers:
            for line in self._version_file(node, CANARY_SLOT).splitlines():
                number = line.removeprefix(BORROW_MARK).strip()  # an editor's trailing blank or CR
                if line.startswith(BORROW_MARK) and number.isdigit():
                    found[node] = int(number)
        return found

    def _no_loan(self, version: ModelVersion) -> None:
        """A canary that runs on every node (serving.canary.gpus spare, or beside) starts only where no loan
        is recorded: one made while the stack said borrow would be overwritten (its record gone, the replica
        left masked and stopped) and the canary started on GPUs the stack now gives a replica."""
        for node, replica in self.borrowed_replicas().items():
            record = self._version_file(node, CANARY_SLOT).partition("\n")[0]
            lender = (
                record.removeprefix(VERSION_MARK).partition("@")[0] if record.startswith(VERSION_MARK) else ""
            )
            raise ServeRefused(
                f"replica {replica} on {node} is lent to a canary started while the stack said "
                f"serving.canary.gpus borrow (its record: {CONFIG_DIR}/version-{CANARY_SLOT}.env), and the "
                "stack now runs the canary on every node: "
                f"`gpuplat serve rollback {lender or version.name}` gives the replica back first (it reads "
                "the loan whatever the stack says), then `gpuplat up` applies the new layout and `deploy` "
                "starts the canary on it. Nothing was changed"
            )

    def _lender(self) -> tuple[str, int, str]:
        """The stable replica a borrowing canary takes, before any change: the one a loan's record names
        already (a deploy after a golden set refused, a rollback's, a command killed mid-way), else the last
        replica of the last node (the one a promote rolls last), refused where the gateways count fewer
        than 2 stable servers up. Its node, number and CUDA_VISIBLE_DEVICES."""
        for node, replica in self.borrowed_replicas().items():
            return node, replica, self._replica_devices(node, replica)
        node = self.layout.servers[-1]
        replica = self.stable_replicas(node)[-1]
        up = self.figures().servers_up.get(STABLE_BACKEND, 0)
        if up < 2:
            raise ServeRefused(
                f"the canary borrows the GPUs of a stable replica (serving.canary.gpus borrow), but the "
                f"gateways count {up} stable server(s) up: borrowing replica {replica} on {node} would leave "
                "the stable version none. Wait for the pool's replicas to come up (`gpuplat serve status`), "
                "or give the pool more nodes"
            )
        return node, replica, self._replica_devices(node, replica)

    def _borrow(self, version: ModelVersion, borrowed: tuple[str, int, str]) -> None:
        """Take the `borrowed` replica (node, number, GPUs) out of service for the canary on `version`, as a
        rolling update with maxSurge 0 does. The loan's record (the canary's version file) first: a command
        killed at any later step leaves it named, for `status` to show and the next deploy or rollback to
        finish. Then the replica drained on every gateway (its requests in flight answered), masked until
        the canary gives its GPUs back (a converge must not start it on GPUs the canary holds) and stopped,
        each step again where a record named the loan already: a reboot since then lifted the runtime
        mask and started the replica on its GPUs. Then the mark that the platform stopped it on purpose."""
        node, replica, devices = borrowed
        self._write_version(node, CANARY_SLOT, version, borrowed)
        self.say(
            f"the canary borrows replica {replica} on {node} (GPUs {devices}): drained on every gateway, "
            "then stopped while the canary runs"
        )
        self._on_gateways("drain", STABLE_BACKEND, f"{self.layout.addresses[node]}:{REPLICA_PORT + replica}")
        self._fence(f"stopping replica {replica} on {node} for the canary")
        # Until the next boot (--runtime: a symlink to /dev/null in /run/systemd/system), which only
        # `unmask --runtime` removes (`_give_back`). Masked
        # before the stop, so that nothing starts it in between.
        self.nodes.exec(node, "systemctl", "mask", "--runtime", f"{UNIT}@{replica}.service")
        self.nodes.exec(node, "systemctl", "stop", f"{UNIT}@{replica}.service")
        # Stopped on purpose: no page for it (infra/serving/stopped_mark.py). Only once it stopped: a command
        # killed before the stop leaves the replica running unmarked, paged for if it dies (a kill between
        # the stop and the mark pages for the lent replica, until the next deploy or rollback marks it).
        self.nodes.exec(node, *stopped_mark.write_command(replica, "loan"))

    def _replica_devices(self, node: str, replica: int) -> str:
        """The replica's CUDA_VISIBLE_DEVICES, as the role wrote them (replica-<i>.env)."""
        path = f"{CONFIG_DIR}/replica-{replica}.env"
        text = self.nodes.exec(node, "sh", "-c", 'cat "$1"', "sh", path)
        for line in text.splitlines():
            if line.startswith("CUDA_VISIBLE_DEVICES="):
                return line.partition("=")[2].strip()
        raise GpuPlatError(
            f"{node}'s {path} names no CUDA_VISIBLE_DEVICES: the canary cannot take replica {replica}'s "
            "GPUs. `gpuplat up` writes each vLLM replica's GPUs there"
        )

    def _give_back(self, node: str, replica: int, version: ModelVersion | str | None) -> None:
        """The borrowed replica started again on its GPUs (on `version`, or KEEP: its own file's) and put
        back in service on every gateway once they count it up."""
        if version != KEEP:
            assert not isinstance(version, str)
            self._write_version(node, str(replica), version)
        target = f"{self.layout.addresses[node]}:{REPLICA_PORT + replica}"
        # Restarted, not started: a replica found running (its node rebooted, which lifted the runtime mask;
        # a give-back killed after its start) would keep what it serves on `systemctl start`. Drained first
        # where a gateway's reload put it back in service meanwhile.
        self._on_gateways("drain", STABLE_BACKEND, target)
        self._fence(f"starting replica {replica} on {node} again")
        # --runtime: a plain unmask removes masks in /etc only and leaves this one (the replica then fails
        # to start: "Unit ... is masked", measured on Debian 12's systemd 252). systemd 239 alone refused
        # `unmask --runtime` and removed both; systemd 240 restored it (systemd/systemd pull request
        # 10892, reverting 4910b35, "A `systemctl --runtime unmask` should undo a `systemctl --runtime
        # mask` action"). Debian 12 ships systemd 252, Debian 13 257.
        self.nodes.exec(node, "systemctl", "unmask", "--runtime", f"{UNIT}@{replica}.service")
        self.nodes.exec(node, "systemctl", "restart", f"{UNIT}@{replica}.service")
        # The mark goes once the replica answers, or once it has failed to: either way it pages again if it
        # dies, and a give-back killed before the gateways' ready leaves no running replica silenced.
        try:
            self._wait_healthy(node, REPLICA_PORT + replica)
        finally:
            self.nodes.exec(node, *stopped_mark.remove_command(replica))
        self._on_gateways("ready", STABLE_BACKEND, target)
        self.say(f"replica {replica} on {node} has its GPUs back and serves again")

    def _fill_slots(self) -> None:
        """On aws the gateways' slots follow the instances (gpuplat_gateway_targets.py, on a timer): a canary
        slot leaves maintenance once its canary answers, here at once (one pass of the unit on each gateway)
        rather than at the timer's next pass. Elsewhere the servers are fixed lines of haproxy.cfg."""
        if not self.layout.slots_follow_instances:
            return
        for gateway in self.layout.gateways:
            self.nodes.exec(gateway, "systemctl", "start", f"{TARGETS_UNIT}.service", timeout=120)

    def _wait_canary_up(self, wanted: int) -> None:
        deadline = time.monotonic() + 120
        while self.figures().servers_up.get(CANARY_BACKEND, 0) < wanted:
            if time.monotonic() > deadline:
                raise GpuPlatError(
                    f"the gateway's health checks did not count the {wanted} canary server(s) up within "
                    "120 s: `gpuplat serve status` shows what it sees"
                )
            time.sleep(1)

    def probe_golden(self, version: ModelVersion) -> None:
        """Ask each canary server `version`'s golden set (infra/serving/golden.py) while its share is 0: a
        wrong answer stops the canary before it took any request and refuses the version."""
        source = version_source(
            version_environment(version, self.layout.engine, self.layout.versions_from_object_store)
        )
        path = f"{(source[1] if source else version.location).rstrip('/')}/{GOLDEN_FILE}"
        canaries = self.canary_nodes()
        for node in canaries:
            try:
                answer = self.nodes.exec(
                    node, "python3", "-c", GOLDEN_PROBE, path, str(CANARY_PORT), timeout=600
                )
            except GpuPlatError:
                # Not asked, not passed: the canary does not stay up untested (its GPUs held) for a next try.
                self.stop_canary()
                raise
            found = golden_misses(answer)
            if found is None:
                self.say(f"{version.reference} has no golden set ({path}): no answer checked before traffic")
                return
            if found:
                self.stop_canary()
                wrong = "; ".join(f"case {miss.case}: {miss.why}" for miss in found[:3])
                raise ServeRefused(
                    f"{version.reference} answered {len(found)} case(s) of its golden set ({path}) wrongly "
                    f"on {node}: {wrong}. Its canary is stopped and took no request; fix the version or its "
                    f"{GOLDEN_FILE}"
                )
        self.say(f"{version.reference} answered its golden set as expected on {', '.join(canaries)}")

    def stop_canary(self, returning: ModelVersion | str | None = KEEP) -> None:
        """Share 0, then each canary server drained on every gateway (its requests in flight answered)
        before it stops: nothing it was answering is cut. A replica the canary borrowed gets its GPUs back
        and starts again, on `returning` (None: the stack's own model; KEEP: its own file's version), and
        only then is the canary's version file, the record of the loan, removed."""
        self.set_share(0)
        borrowed = self.borrowed_replicas()
        for node in self.layout.servers:
            self._on_gateways("drain", CANARY_BACKEND, self._canary_target(node))
            self.nodes.exec(node, "systemctl", "stop", f"{UNIT}@{CANARY_SLOT}.service")
            if node in borrowed:
                self._give_back(node, borrowed[node], returning)
            self.nodes.exec(node, "rm", "-f", f"{CONFIG_DIR}/version-{CANARY_SLOT}.env")

    def stable_replicas(self, node: str) -> list[int]:
        """The node's stable replicas, as the role configured them (replica-<i>.env)."""
        files = self.nodes.exec(node, "ls", CONFIG_DIR).split()
        return sorted(int(f[8:-4]) for f in files if f.startswith("replica-") and f[8:-4].isdigit())

    def roll_stable(self, version: ModelVersion | None, share: int, only_off: bool = False) -> None:
        """Every stable replica onto `version` (None: the stack's own model), one at a time, each drained
        on every gateway first, the canary keeping `share` meanwhile: the other stable replicas take the
        stable's draws. Only where the replica is the last stable server up on a gateway does the canary
        take every request while it restarts (no other server could). With `only_off`, the replicas whose
        version file already names `version` stay as they are (taken out of drain where a promote cut short
        left one drained)."""
        environment = (
            None
            if version is None
            else version_environment(version, self.layout.engine, self.layout.versions_from_object_store)
        )
        wanted = (environment or "").strip()
        if self.version_record is not None:
            self._fence("writing the stack's version record")
            self.version_record.write(environment)
        if self.relist is not None:
            # The Auto Scaling group may have started instances since this command listed them (a guard
            # carries a release through steps for many minutes): each booted on the record of its boot, so
            # every instance running now is rolled; one started from here on boots on the record just written.
            self.layout = serving_layout(self.platform, self.relist())
        # A replica the canary borrowed is the canary's until `stop_canary` gives it back, on its version.
        lent = self.borrowed_replicas()
        replicas = {
            node: [replica for replica in self.stable_replicas(node) if lent.get(node) != replica]
            for node in self.layout.servers
        }
        drained = only_off and self.figures().servers_up.get(STABLE_BACKEND, 0) < sum(
            map(len, replicas.values())
        )
        for node, numbers in replicas.items():
            for replica in numbers:
                target = f"{self.layout.addresses[node]}:{REPLICA_PORT + replica}"
                if only_off and self._version_file(node, str(replica)) == wanted:
                    if drained:
                        self._on_gateways("ready", STABLE_BACKEND, target)
                    continue
                alone = self.figures().servers_up.get(STABLE_BACKEND, 0) <= 1
                if alone and share < 100:
                    self.say(
                        f"replica {replica} on {node} is the last stable server up: the canary takes "
                        "every request while it restarts"
                    )
                    self.set_share(100)
                self._on_gateways("drain", STABLE_BACKEND, target)
                self._write_version(node, str(replica), version)
                self.nodes.exec(node, "systemctl", "restart", f"{UNIT}@{replica}.service")
                self._wait_healthy(node, REPLICA_PORT + replica)
                self._on_gateways("ready", STABLE_BACKEND, target)
                if alone and share < 100:
                    self.set_share(share)
                serves = "the stack's own model" if version is None else version.reference
                self.say(f"replica {replica} on {node} serves {serves}")

    # The commands

    def deploy(self, reference: str, canary_percent: int | None) -> ModelVersion:
        candidate = self.registry.resolve(reference)
        stable = self.aliased(candidate.name, CHAMPION)
        if stable is not None and stable.version == candidate.version:
            raise ServeRefused(f"{candidate.reference} is already the stable version ({CHAMPION})")
        running = self.aliased(candidate.name, CHALLENGER)
        if running is not None and self.figures().canary_percent > 0:
            raise ServeRefused(
                f"{running.reference} is in canary now: `gpuplat serve promote` or `gpuplat serve rollback` "
                "first"
            )
        refusal = gate(candidate, stable, self.rules) or (
            None if canary_percent is None else self.rules.traffic_problem(canary_percent)
        )
        if refusal is not None:
            raise ServeRefused(refusal)
        # Refuses a location the servers cannot read, before any change.
        version_environment(candidate, self.layout.engine, self.layout.versions_from_object_store)
        where = "one node, on a stable replica's GPUs" if self.layout.canary_gpus == "borrow" else None
        self.say(
            f"starting {candidate.reference} in the canary slot of {where or ', '.join(self.layout.servers)}"
        )
        self.start_canary(candidate)
        self.probe_golden(candidate)
        self._fence("moving the registry's aliases")
        self.registry.set_alias(candidate.name, CHALLENGER, candidate.version)
        if canary_percent is None:
            self.promote(candidate.name)
            return candidate
        self.canary_start = (time.monotonic(), *self.counters())
        self.set_share(canary_percent)
        self.say(f"{candidate.reference} takes {canary_percent} % of the requests")
        return candidate

    def promote(self, model: str) -> ModelVersion:
        candidate = self.aliased(model, CHALLENGER)
        if candidate is None:
            raise ServeRefused(
                f"'{model}' has no version in canary ({CHALLENGER}): `gpuplat serve deploy` one"
            )
        stable = self.aliased(model, CHAMPION)
        share = self.figures().canary_percent
        self.say(
            f"{candidate.reference} keeps its {share} % while the stable replicas restart on it one at a time"
            if share
            else f"the stable replicas restart on {candidate.reference} one at a time"
        )
        self.roll_stable(candidate, share)
        # A replica the canary borrowed is the last the roll reaches: it starts on the candidate once the
        # canary stopped.
        self.stop_canary(candidate)
        self._fence("moving the registry's aliases")
        if stable is not None:
            self.registry.set_alias(model, PREVIOUS, stable.version)
        self.registry.set_alias(model, CHAMPION, candidate.version)
        self.registry.delete_alias(model, CHALLENGER)
        self.say(f"{candidate.reference} is the stable version")
        self.record(model, PROMOTED, f"{candidate.reference} is the stable version on every replica")
        return candidate

    def rollback(self, model: str, reason: str = "asked for") -> ModelVersion | None:
        """Take the canary out; with none, put the previous stable version back. What now serves (None:
        the stack's own model)."""
        candidate = self.aliased(model, CHALLENGER)
        if candidate is not None:
            # A promote cut short (killed, a replica that did not come up) left some stable replicas on the
            # candidate: they go back to the champion, the canary at share 0 first.
            self.set_share(0)
            champion = self.aliased(model, CHAMPION)
            self.roll_stable(champion, 0, only_off=True)
            self.stop_canary(champion)
            self._fence("moving the registry's aliases")
            self.registry.delete_alias(model, CHALLENGER)
            self.say(
                f"{candidate.reference} rolled back ({reason}); every request goes to the stable version"
            )
            self.record(model, ROLLED_BACK, f"{candidate.reference} taken out: {reason}")
            return self.aliased(model, CHAMPION)
        lent = {
            node: replica
            for node, replica in self.borrowed_replicas().items()
            if self._version_file(node, CANARY_SLOT).startswith(f"{VERSION_MARK}{model}@")
        }
        if lent:
            # A deploy killed after its borrow but before the challenger alias moved (the golden probe, the
            # wait for the gateways' checks) left the loan's record and no alias: the rollback ends that
            # canary and gives the replica back, whatever serving.canary.gpus says now (the refusals of a
            # deploy and of the role's converge during a loan send the operator here). The stable replicas
            # were not rolled (no promote without the alias): they stay on the champion.
            champion = self.aliased(model, CHAMPION)
            self.set_share(0)
            self.stop_canary(champion)
            where = ", ".join(f"replica {replica} on {node}" for node, replica in lent.items())
            self.say(
                f"the canary of a deploy cut short is stopped and {where} serves the stable version again"
            )
            self.record(model, ROLLED_BACK, f"the canary of a deploy cut short taken out: {reason}")
            return champion
        previous = self.aliased(model, PREVIOUS)
        if previous is None:
            raise ServeRefused(f"'{model}' has no canary and no {PREVIOUS} version to roll back to")
        self.start_canary(previous)
        self._fence("moving the registry's aliases")
        self.registry.set_alias(model, CHALLENGER, previous.version)
        self.roll_stable(previous, 0)
        self.stop_canary(previous)
        self._fence("moving the registry's aliases")
        self.registry.set_alias(model, CHAMPION, previous.version)
        self.registry.delete_alias(model, CHALLENGER)
        self.registry.delete_alias(model, PREVIOUS)
        self.say(f"{previous.reference} is the stable version again")
        self.record(model, ROLLED_BACK, f"{previous.reference} is the stable version again: {reason}")
        return previous

    # The guard in the foreground (infra/serving/carry.py: one loop for every backend)

    def has_canary(self, model: str) -> bool:
        return self.aliased(model, CHALLENGER) is not None

    def share(self) -> int:
        return self.figures().canary_percent

    def servers_up(self) -> tuple[int, int]:
        return servers_up(self.figures())

    def guard(
        self,
        model: str,
        duration_s: float | None = None,
        look_s: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        past_gate: bool = False,
    ) -> Verdict:
        """carry.guard: the canary's analysis, or the release through serving.canary.steps."""
        return carry.guard(self, model, duration_s, look_s, sleep, clock, past_gate)

    def analyse(
        self,
        model: str,
        duration_s: float | None = None,
        look_s: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        weighing: carry.Weighing | None = None,
        rules: Canary | None = None,
    ) -> Verdict:
        """carry.analyse: the running canary's analysis until a verdict or `duration_s`, its latency
        judged where each canary server takes no more than a stable server's load (`weighing`: the share
        and the servers up, read at each look; load.load_at)."""
        return carry.analyse(self, model, duration_s, look_s, sleep, clock, weighing, rules)
