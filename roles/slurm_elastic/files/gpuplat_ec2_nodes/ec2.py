"""EC2's side: the stack's instances (found by their tags), launched, tagged and terminated, and the
boto3 clients that ask EC2."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from .holds import CAPACITY_ERROR_CODES
from .logs import LOG
from .settings import Pool

TAG_STACK = "gpuplat:stack"
TAG_POOL = "gpuplat:pool"
TAG_NODE = "gpuplat:node"
TAG_ROLE = "gpuplat:role"
# The role tag of the instances Slurm launches: the training pools' launch templates carry it
# (infra/backends/aws/tags.py pool_tags) and the resume program asks for it at launch. The stack's
# controllers and inference nodes carry other roles.
FLEET_ROLE = "train"
# The fleet's stop (gpuplat down, teardown.py): a tag on the stack's training launch templates that the
# resume program reads before it launches, and on which the controllers' IAM policy denies every launch
# (infra/backends/aws/iam.py, cluster_manager_statements). The controllers may not remove it (they tag
# instances only). ParallelCluster's counterpart is the compute fleet status STOP_REQUESTED/STOPPED,
# under which its resume launches nothing.
TAG_FLEET = "gpuplat:fleet"
FLEET_STOPPED = "stopped"
LIVE_STATES = ("pending", "running")
TERMINABLE_STATES = ("pending", "running", "stopping", "stopped")
NOT_TERMINATED_STATES = (*TERMINABLE_STATES, "shutting-down")
# EC2 accepts at most 200 values per describe filter, 1000 instance IDs per TerminateInstances and 100
# per DescribeInstanceStatus (EC2 API Reference, DescribeInstanceStatus, InstanceId.N).
FILTER_VALUES_MAX = 200
TERMINATE_MAX = 1000
STATUS_IDS_MAX = 100
# A scheduled event that is over stays listed, its description starting so (EC2 User Guide, "Scheduled
# events for your instances": "[Completed]", "[Canceled]").
EVENT_OVER_PREFIXES = ("[Completed]", "[Canceled]")

# Names launched per request: ParallelCluster's launch_max_batch_size (aws-parallelcluster-node v3.11.0,
# src/slurm_plugin/resume.py:35 DEFAULTS), within an instant fleet's MinTargetCapacity ("Maximum value
# of 1000": botocore 1.44.18, data/ec2/2016-11-15/service-2.json, OnDemandOptionsRequest).
LAUNCH_BATCH_MAX = 500
# An instant fleet's allocation strategy by the pool's capacity (Ec2Nodes.fleet_request).
FLEET_ALLOCATION = {"spot": "capacity-optimized", "on-demand": "lowest-price"}

ADDRESS_WAIT_S = 60.0
ADDRESS_POLL_S = 2.0
IMDS_TIMEOUT_S = 2

ErrorTypes = (ClientError, BotoCoreError)

T = TypeVar("T")

# Asked again, with back-off, where botocore's standard retry mode would not:
# - RunInstances is asked once by botocore (ec2_nodes), so its throttling is retried here. Throttling
#   codes as botocore's standard mode has them (botocore 1.44.18, botocore/retries/standard.py:507
#   ThrottledRetryableChecker; EC2 answers RequestLimitExceeded); capacity errors are not among them.
# - CreateTags on an instance RunInstances has just returned may fail InvalidInstanceID.NotFound: EC2
#   is eventually consistent and asks for exponential back-off (EC2 API Reference, "Eventual
#   consistency in the Amazon EC2 API"); botocore retries no 4xx code but throttling.
THROTTLING_CODES = frozenset(
    {"RequestLimitExceeded", "Throttling", "ThrottlingException", "EC2ThrottledException"}
)
NOT_YET_VISIBLE_CODES = frozenset({"InvalidInstanceID.NotFound"})
# Attempts in all (ec2_client's standard mode: 6), and the steps of botocore's back-off
# (retries/standard.py:344 ExponentialBackoff: min(base_scale * 2**i, 20 s), base_scale 1 s for
# throttling), drawn as equal jitter (half the step plus a random half) instead of botocore's full
# jitter, so an eventually consistent answer gets time even on an unlucky draw.
RETRY_ATTEMPTS = 6
RETRY_BASE_S = 1.0
RETRY_MAX_S = 20.0


def retried(call: Callable[..., T], codes: frozenset[str], what: str, **request: Any) -> T:
    """call(**request), asked again on these EC2 error codes (logged), at most RETRY_ATTEMPTS times in all."""
    for attempt in range(1, RETRY_ATTEMPTS + 1):
        try:
            return call(**request)
        except ClientError as err:
            if error_code(err) not in codes or attempt == RETRY_ATTEMPTS:
                raise
            step = min(RETRY_BASE_S * 2 ** (attempt - 1), RETRY_MAX_S)
            delay = step / 2 + random.random() * step / 2
            LOG.warning("%s: %s; asking again in %.1f s (attempt %d of %d)", what, error_code(err), delay,
                        attempt + 1, RETRY_ATTEMPTS)  # fmt: skip
            time.sleep(delay)
    raise AssertionError("unreachable")


def fleet_error(response: dict[str, Any]) -> str:
    """The code an instant fleet that started nothing gives: a capacity error if any of its errors is
    one (each override fails on its own: one type may be unsupported in a zone while the others are
    out of capacity; the capacity error holds the pool, holds.py), else its first error's."""
    codes = [str(error.get("ErrorCode")) for error in response.get("Errors", []) if error.get("ErrorCode")]
    return next(
        (code for code in codes if code in CAPACITY_ERROR_CODES), codes[0] if codes else "NoInstanceStarted"
    )


def fleet_subnet(entry: dict[str, Any]) -> str | None:
    """The subnet an instant fleet's instances went to, from the override that launched them."""
    overrides = entry.get("LaunchTemplateAndOverrides", {}).get("Overrides", {})
    return str(overrides["SubnetId"]) if overrides.get("SubnetId") else None


def error_code(err: Exception) -> str:
    if isinstance(err, ClientError):
        return str(err.response.get("Error", {}).get("Code", "ClientError"))
    return type(err).__name__


def chunks(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def tag_value(instance: dict[str, Any], key: str) -> str | None:
    return next((tag["Value"] for tag in instance.get("Tags", []) if tag["Key"] == key), None)


def launch_time(instance: dict[str, Any]) -> float:
    return float(instance["LaunchTime"].timestamp())


def describe_label(instance: dict[str, Any]) -> str:
    node = tag_value(instance, TAG_NODE) or "no gpuplat:node tag"
    return f"{instance['InstanceId']} ({node}, {instance['State']['Name']})"


class Ec2Nodes:
    """The stack's instances. `launch_client` asks RunInstances and CreateFleet once (ec2_nodes);
    `client` the rest."""

    def __init__(self, client: Any, stack: str, launch_client: Any = None) -> None:
        self.client = client
        self.launch_client = launch_client if launch_client is not None else client
        self.stack = stack

    def describe(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        paginator = self.client.get_paginator("describe_instances")
        found: list[dict[str, Any]] = []
        for page in paginator.paginate(
            Filters=[{"Name": f"tag:{TAG_STACK}", "Values": [self.stack]}, *filters]
        ):
            for reservation in page["Reservations"]:
                found.extend(reservation["Instances"])
        return found

    def instances_of(self, names: Sequence[str], states: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """Instances of this stack tagged with the node names, by name."""
        found: dict[str, list[dict[str, Any]]] = {}
        for batch in chunks(names, FILTER_VALUES_MAX):
            filters = [
                {"Name": f"tag:{TAG_NODE}", "Values": batch},
                {"Name": "instance-state-name", "Values": list(states)},
            ]
            for instance in self.describe(filters):
                found.setdefault(str(tag_value(instance, TAG_NODE)), []).append(instance)
        return found

    def fleet_instances(self, states: Sequence[str]) -> list[dict[str, Any]]:
        """Every instance Slurm launched for this stack, by its tags alone: configured pools or not
        (a pool removed or renamed leaves instances no configuration names; ParallelCluster terminates
        an inactive partition's: aws-parallelcluster-node v3.11.0, src/slurm_plugin/clustermgtd.py:595
        _clean_up_inactive_partition), tagged with a node name or not."""
        filters = [
            {"Name": f"tag:{TAG_ROLE}", "Values": [FLEET_ROLE]},
            {"Name": "instance-state-name", "Values": list(states)},
        ]
        return self.describe(filters)

    def fleet_templates(self) -> list[str]:
        """The stack's training launch templates (tagged gpuplat:stack and gpuplat:role train by
        `pulumi up`), configured pools or not."""
        paginator = self.client.get_paginator("describe_launch_templates")
        filters = [
            {"Name": f"tag:{TAG_STACK}", "Values": [self.stack]},
            {"Name": f"tag:{TAG_ROLE}", "Values": [FLEET_ROLE]},
        ]
        return [
            str(template["LaunchTemplateId"])
            for page in paginator.paginate(Filters=filters)
            for template in page["LaunchTemplates"]
        ]

    def stop_fleet(self) -> list[str]:
        """Tag every training launch template of the stack stopped; the templates tagged."""
        templates = self.fleet_templates()
        if templates:
            self.client.create_tags(Resources=templates, Tags=[{"Key": TAG_FLEET, "Value": FLEET_STOPPED}])
        return templates

    def start_fleet(self) -> list[str]:
        """Remove the fleet's stop from every training launch template of the stack (`gpuplat up`: a
        `down` that failed or was cut short after stop_fleet leaves it, and a stack brought back up
        would launch nothing); the templates. DeleteTags with the value removes the tag only where it
        has that value (EC2 API Reference, DeleteTags, "Tag.N")."""
        templates = self.fleet_templates()
        if templates:
            self.client.delete_tags(Resources=templates, Tags=[{"Key": TAG_FLEET, "Value": FLEET_STOPPED}])
        return templates

    def stopped_templates(self, template_ids: Sequence[str]) -> set[str]:
        """Which of the launch templates carry the fleet's stop. DescribeTags, not
        DescribeLaunchTemplates: both answer a template's tags on EC2, but the emulator the tests run
        (moto 5.2.6) shows in DescribeLaunchTemplates only the tags given at its creation."""
        stopped: set[str] = set()
        paginator = self.client.get_paginator("describe_tags")
        for batch in chunks(template_ids, FILTER_VALUES_MAX):
            filters = [
                {"Name": "resource-id", "Values": batch},
                {"Name": "key", "Values": [TAG_FLEET]},
                {"Name": "value", "Values": [FLEET_STOPPED]},
            ]
            for page in paginator.paginate(Filters=filters):
                stopped.update(str(tag["ResourceId"]) for tag in page["Tags"])
        return stopped

    def template_user_data(self, template_id: str, versions: Sequence[str]) -> tuple[str, dict[str, str]]:
        """The launch template's latest version number and the user data of it and of `versions`."""
        response = self.client.describe_launch_template_versions(
            LaunchTemplateId=template_id, Versions=[*versions, "$Latest"]
        )
        by_version: dict[str, str] = {}
        latest = 0
        for entry in response["LaunchTemplateVersions"]:
            number = int(entry["VersionNumber"])
            by_version[str(number)] = str(entry.get("LaunchTemplateData", {}).get("UserData", ""))
            latest = max(latest, number)
        return str(latest), by_version

    def launch(
        self, pool: Pool, names: Sequence[str], all_or_nothing: bool = False
    ) -> tuple[dict[str, dict[str, Any]], str | None]:
        """Launch one instance per name, in batches of LAUNCH_BATCH_MAX; the instances by name and the
        error code of those missing. The first batch that fails ends the launch (the names after it
        get its code): all or nothing, the caller releases what the earlier batches started. All or
        nothing, the batches after the first go to its subnet: a job's nodes in one zone."""
        launched: dict[str, dict[str, Any]] = {}
        subnet: str | None = None
        for batch in chunks(names, LAUNCH_BATCH_MAX):
            got, code = self.launch_batch(pool, batch, all_or_nothing, subnet)
            launched.update(got)
            if code:
                return launched, code
            if all_or_nothing and subnet is None:
                subnet = next((str(i["SubnetId"]) for i in got.values() if i.get("SubnetId")), None)
        return launched, None

    def launch_batch(
        self, pool: Pool, names: Sequence[str], all_or_nothing: bool, subnet: str | None = None
    ) -> tuple[dict[str, dict[str, Any]], str | None]:
        """All or nothing: EC2 starts all of the names or none (RunInstances with MinCount the number of
        names: "If Amazon EC2 cannot launch the minimum number of instances you request, no instances
        will be launched", EC2 API Reference, RunInstances, MinCount; CreateFleet: MinTargetCapacity,
        fleet_request). Otherwise at least one: after a partial launch (EC2 may start fewer than
        asked) the rest is asked for again, which either starts more (each round at least one, so this
        ends) or fails with EC2's error code."""
        launched: dict[str, dict[str, Any]] = {}
        remaining = list(names)
        while remaining:
            instances, code = self.start(pool, remaining, all_or_nothing, subnet)
            if code:
                return launched, code
            if len(instances) < len(remaining):
                LOG.warning(
                    "resume: pool %s: EC2 started %d of %d instances",
                    pool.name,
                    len(instances),
                    len(remaining),
                )
            batch, remaining = remaining[: len(instances)], remaining[len(instances) :]
            for name, instance in zip(batch, instances, strict=True):
                if self.tag_node(name, instance):
                    launched[name] = instance
        return launched, None if len(launched) == len(names) else "TaggingFailed"

    def start(
        self, pool: Pool, names: Sequence[str], all_or_nothing: bool, subnet: str | None = None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Start instances for these names (as many as EC2 gives, at least one); the instances, or the
        error code when none started. One launch choice: RunInstances, as before; several (instance
        types, subnets): an instant CreateFleet over them."""
        fleet = len(pool.launch_choices) > 1
        call = self.launch_client.create_fleet if fleet else self.launch_client.run_instances
        what = "create_fleet" if fleet else "run_instances"
        request = (
            self.fleet_request(pool, len(names), all_or_nothing, subnet)
            if fleet
            else self.launch_request(pool, len(names), all_or_nothing)
        )
        try:
            response = retried(call, THROTTLING_CODES, f"resume: pool {pool.name}: {what}", **request)
        except ErrorTypes as err:
            LOG.error("resume: pool %s: %s for %s failed: %s", pool.name, what, ",".join(names), err)
            return [], error_code(err)
        instances = (
            self.fleet_instances_of(pool, response, len(names), all_or_nothing)
            if fleet
            else response["Instances"]
        )
        if not instances:
            return [], fleet_error(response) if fleet else "NoInstanceStarted"
        return instances, None

    def launch_request(self, pool: Pool, count: int, all_or_nothing: bool = False) -> dict[str, Any]:
        request: dict[str, Any] = {
            "LaunchTemplate": {"LaunchTemplateId": pool.launch_template_id, "Version": "$Latest"},
            "MinCount": count if all_or_nothing else 1,
            "MaxCount": count,
            "TagSpecifications": [{"ResourceType": "instance", "Tags": self.launch_tags(pool)}],
        }
        if pool.subnet_id:
            request["SubnetId"] = pool.subnet_id
        return request

    def launch_tags(self, pool: Pool) -> list[dict[str, str]]:
        return [
            {"Key": TAG_STACK, "Value": self.stack},
            {"Key": TAG_POOL, "Value": pool.name},
            {"Key": TAG_ROLE, "Value": FLEET_ROLE},
        ]

    def fleet_request(
        self, pool: Pool, count: int, all_or_nothing: bool = False, subnet: str | None = None
    ) -> dict[str, Any]:
        """An instant EC2 Fleet over the pool's instance types and subnets (EC2 API Reference,
        CreateFleet; the field rules quoted from botocore 1.44.18's EC2 model, data/ec2/2016-11-15/
        service-2.json, as ParallelCluster builds it: aws-parallelcluster-node v3.11.0,
        src/slurm_plugin/fleet_manager.py:287 _evaluate_template_overrides, :315 _evaluate_launch_params):

        - one override per (instance type, subnet): "A request of type instant can have only one
          subnet ID" per override (FleetLaunchTemplateOverridesRequest.SubnetId);
        - SingleAvailabilityZone: every instance of one fleet in one zone. A job's nodes need it (EFA
          and cluster placement groups work within one zone), and MinTargetCapacity needs it or
          SingleInstanceType ("At least one of the following must be specified"). ParallelCluster sets
          it only with one subnet and so loses all or nothing across zones (fleet_manager.py:333);
          here all or nothing holds with any number of zones, each job in one of them;
        - MinTargetCapacity: "If this minimum capacity isn't reached, no instances are launched"
          (at most 1000: batches are LAUNCH_BATCH_MAX), the job's count all or nothing, else 1;
        - allocation: spot capacity-optimized (the pools least likely to be interrupted: a training
          job loses its progress since the last checkpoint on each interruption), on-demand
          lowest-price (EC2's default; the alternates are the same GPU shape, infra/spec);
        - `subnet`: only that subnet's overrides (a job's later batches, in the zone of its first);
        - the pool's template, a spot pool's market options included (aws-parallelcluster v3.11.0,
          cli/src/pcluster/templates/queues_stack.py:218, in the templates its CreateFleet launches
          from too); with several subnets its interfaces name none and the overrides do, as
          ParallelCluster's CreateFleet templates (queues_stack.py:161 names a subnet only for the
          RunInstances compute resources; aws/aws-parallelcluster#4521; infra/backends/aws/node_pool.py);
        - tags on the instances and on the fleet at launch: "If the fleet type is instant, specify a
          resource type of fleet to tag the fleet, instance to tag the instances at launch"
          (CreateFleetRequest.TagSpecifications); the controllers' IAM policy asks for them.
        """
        overrides = [
            {**({"InstanceType": kind} if kind else {}), **({"SubnetId": where} if where else {})}
            for kind, where in pool.launch_choices
            if subnet is None or where in (None, subnet)  # None: the template's one subnet
        ]
        options = {
            "AllocationStrategy": FLEET_ALLOCATION[pool.capacity],
            "SingleAvailabilityZone": True,
            "MinTargetCapacity": count if all_or_nothing else 1,
        }
        tags = self.launch_tags(pool)
        return {
            "Type": "instant",
            "LaunchTemplateConfigs": [
                {
                    "LaunchTemplateSpecification": {
                        "LaunchTemplateId": pool.launch_template_id,
                        "Version": "$Latest",
                    },
                    "Overrides": overrides,
                }
            ],
            "TargetCapacitySpecification": {
                "TotalTargetCapacity": count,
                "DefaultTargetCapacityType": pool.capacity,
            },
            "SpotOptions" if pool.capacity == "spot" else "OnDemandOptions": options,
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "fleet", "Tags": tags},
            ],
        }

    def fleet_instances_of(
        self, pool: Pool, response: dict[str, Any], count: int, all_or_nothing: bool
    ) -> list[dict[str, Any]]:
        """The instances an instant fleet started (its answer names IDs only), its errors logged. An
        instant fleet answers capacity errors in its Errors array, not as an API error
        (CreateFleetResult.Errors: "the instances that could not be launched"). All or nothing and
        short (MinTargetCapacity should prevent it): what started is terminated, none is used."""
        ids = [i for entry in response.get("Instances", []) for i in entry.get("InstanceIds", [])]
        for error in response.get("Errors", []):
            LOG.warning(
                "resume: pool %s: create_fleet: %s: %s (%s in %s)",
                pool.name,
                error.get("ErrorCode"),
                error.get("ErrorMessage"),
                error.get("LaunchTemplateAndOverrides", {})
                .get("Overrides", {})
                .get("InstanceType", "its type"),
                error.get("LaunchTemplateAndOverrides", {})
                .get("Overrides", {})
                .get("SubnetId", "its subnet"),
            )
        if all_or_nothing and 0 < len(ids) < count:
            LOG.error(
                "resume: pool %s: the fleet started %d of %d instances, all or nothing: terminating %s",
                pool.name, len(ids), count, ",".join(ids),
            )  # fmt: skip
            self.terminate(ids)
            return []
        return [
            {"InstanceId": instance_id, "SubnetId": subnet}
            for entry in response.get("Instances", [])
            for subnet in [entry.get("SubnetId") or fleet_subnet(entry)]
            for instance_id in entry.get("InstanceIds", [])
        ]

    def tag_node(self, name: str, instance: dict[str, Any]) -> bool:
        """Tag a new instance with its node name; an instance that cannot be tagged is terminated."""
        instance_id = instance["InstanceId"]
        tags = [{"Key": TAG_NODE, "Value": name}, {"Key": "Name", "Value": f"{self.stack}-{name}"}]
        try:
            retried(
                self.client.create_tags,
                NOT_YET_VISIBLE_CODES,
                f"resume: tagging {instance_id} as {name}",
                Resources=[instance_id],
                Tags=tags,
            )
        except ErrorTypes as err:
            LOG.error("resume: cannot tag %s as %s (%s); terminating it", instance_id, name, err)
            self.terminate([instance_id])
            return False
        LOG.info("resume: launched %s for %s", instance_id, name)
        return True

    def private_addresses(self, instances: dict[str, dict[str, Any]]) -> dict[str, str]:
        """Private IPv4 address by node name, polling (bounded) for instances that have none yet."""
        addresses = {
            name: i["PrivateIpAddress"] for name, i in instances.items() if i.get("PrivateIpAddress")
        }
        deadline = time.monotonic() + ADDRESS_WAIT_S
        while len(addresses) < len(instances) and time.monotonic() < deadline:
            time.sleep(ADDRESS_POLL_S)
            waiting = {instances[name]["InstanceId"]: name for name in instances if name not in addresses}
            response = self.client.describe_instances(InstanceIds=list(waiting))
            for reservation in response["Reservations"]:
                for instance in reservation["Instances"]:
                    if instance.get("PrivateIpAddress"):
                        addresses[waiting[instance["InstanceId"]]] = instance["PrivateIpAddress"]
        return addresses

    def scheduled_events(self, instance_ids: Sequence[str], codes: Sequence[str]) -> dict[str, str]:
        """Each instance's first pending scheduled event of these codes, "CODE at TIME", by ID."""
        events: dict[str, str] = {}
        for batch in chunks(instance_ids, STATUS_IDS_MAX):
            response = self.client.describe_instance_status(InstanceIds=batch)
            for status in response.get("InstanceStatuses", []):
                pending = [
                    event for event in status.get("Events", [])
                    if event.get("Code") in codes
                    and not str(event.get("Description", "")).startswith(EVENT_OVER_PREFIXES)
                ]  # fmt: skip
                if pending:
                    event = pending[0]
                    events[status["InstanceId"]] = f"{event['Code']} at {event.get('NotBefore', 'unknown')}"
        return events

    def terminate(self, instance_ids: Sequence[str]) -> list[str]:
        """Terminate the instances; the IDs that could not be terminated (logged).

        One call per batch; when a batch fails (one protected or vanished instance fails the whole
        call), each of its instances is tried on its own so the others still go.
        """
        failed: list[str] = []
        for batch in chunks(instance_ids, TERMINATE_MAX):
            try:
                self.client.terminate_instances(InstanceIds=batch)
            except ErrorTypes as err:
                LOG.warning("terminate_instances of %d instances failed (%s); one by one", len(batch), err)
                failed.extend(instance_id for instance_id in batch if not self.terminate_one(instance_id))
        return failed

    def terminate_one(self, instance_id: str) -> bool:
        try:
            self.client.terminate_instances(InstanceIds=[instance_id])
        except ErrorTypes as err:
            LOG.error("cannot terminate %s: %s", instance_id, err)
            return False
        return True


def aws_session() -> boto3.session.Session:
    """Instance-profile credentials come from the instance metadata, which botocore asks once with a
    one-second timeout (botocore/configprovider.py: metadata_service_num_attempts 1,
    metadata_service_timeout 1): one slow answer and the whole program run fails "Unable to locate
    credentials" (seen in the box while its machines were busy). Asked up to 3 times, 2 s each."""
    core = botocore.session.get_session()
    core.set_config_variable("metadata_service_num_attempts", 3)
    core.set_config_variable("metadata_service_timeout", IMDS_TIMEOUT_S)
    return boto3.session.Session(botocore_session=core)


def ec2_client(region: str, endpoint_url: str | None, total_attempts: int = 6) -> Any:
    # botocore's `max_attempts` counts the retries; `total_max_attempts` counts the first call too.
    retries = {"total_max_attempts": total_attempts, "mode": "standard"}
    config = Config(connect_timeout=5, read_timeout=30, retries=retries)
    return aws_session().client("ec2", region_name=region, endpoint_url=endpoint_url, config=config)


def ec2_nodes(region: str, endpoint_url: str | None, stack: str) -> Ec2Nodes:
    """EC2 answers InsufficientInstanceCapacity with HTTP 500 (a server error code, EC2 API Reference,
    "Error codes"), which botocore's standard retry mode takes for a transient fault and asks again,
    with back-off: the names of a pool out of capacity would be held through the retries instead of
    returning to power saving at once, and the capacity error would never be seen. RunInstances is
    asked once (the retry is Slurm's: the names come back through power saving and are resumed again
    for their jobs); the other calls are retried. (ParallelCluster's resume retries once:
    aws-parallelcluster-node v3.11.0, src/slurm_plugin/resume.py, DEFAULTS max_retry 1 as botocore
    max_attempts.)"""
    return Ec2Nodes(
        ec2_client(region, endpoint_url),
        stack,
        launch_client=ec2_client(region, endpoint_url, total_attempts=1),
    )


def terminate_named(ec2: Ec2Nodes, names: Sequence[str], action: str) -> bool:
    """Terminate every instance tagged with these node names (logged per name)."""
    try:
        found = ec2.instances_of(names, TERMINABLE_STATES)
    except ErrorTypes as err:
        LOG.error("%s: cannot look up the instances of %s: %s", action, ",".join(names), err)
        return False
    instance_ids = [instance["InstanceId"] for instances in found.values() for instance in instances]
    failed = ec2.terminate(instance_ids) if instance_ids else []
    for name in names:
        ids = ",".join(i["InstanceId"] for i in found.get(name, []) if i["InstanceId"] not in failed)
        LOG.info("%s: %s: terminated %s", action, name, ids or "no instance")
    return not failed
