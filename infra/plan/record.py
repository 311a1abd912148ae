"""Run the real Pulumi program in-process under the SDK's mock engine and record every resource.

No Pulumi CLI and no cloud calls: the mock monitor answers registrations; we keep type, name, inputs
and parent of each, and the stack outputs.
"""

from __future__ import annotations

import asyncio
import gc
import json
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import resource as _sdk_resource
from pulumi.runtime import rpc
from pulumi.runtime.proto import source_pb2
from pulumi.runtime.stack import run_in_stack
from pulumi.runtime.sync_await import _sync_await

from infra.plan.event_loops import note_sdk_ran
from infra.platform.resolve import ResolvedPlatform

PROJECT = "gpu-platform"
_FAKE_ACCOUNT = "123456789012"


@dataclass(frozen=True)
class RecordedResource:
    type: str
    name: str
    urn: str
    inputs: dict[str, Any]
    parent_urn: str | None
    custom: bool
    dependencies: tuple[str, ...] = ()  # URNs of what it was declared to depend on (depends_on)

    @property
    def parent_name(self) -> str | None:
        return self.parent_urn.rsplit("::", 1)[-1] if self.parent_urn else None


@dataclass
class Recording:
    resources: list[RecordedResource] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)

    def of_type(self, type_token: str) -> list[RecordedResource]:
        return [r for r in self.resources if r.type == type_token]

    def named(self, name: str) -> RecordedResource:
        return next(r for r in self.resources if r.name == name)

    def by_urn(self) -> dict[str, RecordedResource]:
        return {r.urn: r for r in self.resources}


def _plain(value: Any) -> Any:
    """Inputs as plain JSON-able data (unknowns and secrets rendered as strings, whole floats as ints:
    the wire format carries every number as a double)."""

    def whole(number: float) -> int | float:
        return int(number) if number.is_integer() else number

    return json.loads(
        json.dumps(_redact(value), default=_describe, sort_keys=True), parse_float=lambda t: whole(float(t))
    )


# Pulumi's wire marker of a secret value: {SPECIAL_SIG_KEY: SECRET_SIG, "value": ...}.
_SIG_KEY = "4dabf18193072939515e22adb298388d"
_SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
SECRET = "[secret]"


def _redact(value: Any) -> Any:
    """Secrets never reach a recording, a plan report or a policy finding."""
    if isinstance(value, dict):
        if value.get(_SIG_KEY) == _SECRET_SIG:
            return SECRET
        return {key: _redact(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_redact(item) for item in value]
    return value


def _describe(value: Any) -> Any:
    """Assets and archives by what they hold (their repr carries a memory address)."""
    if isinstance(value, pulumi.AssetArchive):
        return {"archive": value.assets}
    if isinstance(value, pulumi.FileArchive | pulumi.FileAsset):
        return {type(value).__name__: value.path}
    if isinstance(value, pulumi.StringAsset):
        return {"StringAsset": value.text}
    return str(value)


class _Mocks(pulumi.runtime.Mocks):
    """Answers like a cloud would, with deterministic ids and the computed attributes callers read."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        state = dict(args.inputs)
        resource_id = f"{args.name}-id"
        state.setdefault("name", args.name)
        state.setdefault("arn", f"arn:aws:mock:::{args.typ.split(':')[-1].lower()}/{args.name}")
        if args.typ == "aws:fsx/lustreFileSystem:LustreFileSystem":
            state.setdefault("dnsName", f"{resource_id}.fsx.mock.amazonaws.com")
            state.setdefault("mountName", "mockmnt")
        if args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            state.setdefault("latestVersion", 1)
        if args.typ == "aws:lb/loadBalancer:LoadBalancer":
            state.setdefault("dnsName", f"{resource_id}.elb.mock.amazonaws.com")
        if args.typ == "aws:s3/bucket:Bucket":
            state.setdefault("bucket", args.inputs.get("bucketPrefix", args.name) + "mock")
        if args.typ == "aws:eks/cluster:Cluster":
            state.setdefault("endpoint", f"https://{resource_id}.eks.mock.amazonaws.com")
            state.setdefault("certificateAuthority", {"data": "bW9jay1jbHVzdGVyLWNh"})  # "mock-cluster-ca"
            state["vpcConfig"] = {**state.get("vpcConfig", {}), "clusterSecurityGroupId": f"{resource_id}-sg"}
        if args.typ == "aws:eks/nodeGroup:NodeGroup":
            state.setdefault("nodeGroupName", args.name)
        if args.typ == "aws:imagebuilder/image:Image":
            state.setdefault(
                "outputResources", [{"amis": [{"image": f"ami-0{args.name}", "region": "mock"}]}]
            )
        return resource_id, state

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:  # type: ignore[override]
        token = args.token
        if token == "aws:ssm/getParameter:getParameter":
            return {"name": args.args.get("name"), "value": "ami-0mockdeeplearning0", "type": "String"}
        if token == "aws:ec2/getAmi:getAmi":
            return {"id": "ami-0mockdeeplearning0", "rootDeviceName": "/dev/sda1", "architecture": "x86_64"}
        if token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {
                "accountId": _FAKE_ACCOUNT,
                "arn": f"arn:aws:iam::{_FAKE_ACCOUNT}:root",
                "userId": "mock",
            }
        if token == "aws:index/getPartition:getPartition":
            return {"partition": "aws", "dnsSuffix": "amazonaws.com"}
        if token == "aws:iam/getPolicyDocument:getPolicyDocument":
            return {"json": json.dumps(args.args, default=str, sort_keys=True)}
        return {}


class _RecordingMonitor(pulumi_mocks.MockMonitor):
    def __init__(self, mocks: pulumi.runtime.Mocks, recording: Recording) -> None:
        super().__init__(mocks)
        self.recording = recording
        self._stack_urn = ""

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
        if request.type == "pulumi:pulumi:Stack":
            self._stack_urn = response.urn
            return response
        inputs = _sync_await(_deserialize(request.object))
        parent = request.parent if request.parent and request.parent != self._stack_urn else None
        self.recording.resources.append(
            RecordedResource(
                request.type,
                request.name,
                response.urn,
                _plain(inputs),
                parent,
                bool(request.custom),
                tuple(request.dependencies),
            )
        )
        return response

    def RegisterResourceOutputs(self, request: Any) -> Any:
        if request.urn == self._stack_urn:
            self.recording.outputs.update(_plain(_sync_await(_deserialize(request.outputs))))
        return super().RegisterResourceOutputs(request)  # type: ignore[no-untyped-call]


def _no_stack_trace() -> Any:
    return source_pb2.StackTrace()


# The SDK walks the whole Python stack at each resource it registers, to send the engine the resource's
# source position (pulumi 3.272.0 sdk/python/lib/pulumi/runtime/resource.py: _get_stack_trace, lines
# 741-778, called by register_resource at line 1160 and by read_resource at 833; a URI made per frame).
# The recording monitor reads no source position, and under a deep stack (the CLI's, a test's) the walk
# was a third of a plan's CPU: aws-k8s 0.35 CPU-s a plan 45 frames down, 0.19 without it. record()
# swaps it out while the program runs and puts it back after.
_STACK_TRACE = "_get_stack_trace"


async def _deserialize(struct: Any) -> dict[str, Any]:
    return dict(rpc.deserialize_properties(struct))


def record(platform: ResolvedPlatform, program: Any = None) -> Recording:
    """Run `program(platform)` (default: the real program) under mocks; return what it declared."""
    from infra.program import build

    recording = Recording()
    mocks = _Mocks()
    note_sdk_ran()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    # No cyclic garbage collection while the program runs: the SDK keeps every Output, Task and coroutine
    # of the run alive until its end (some 10,000 of each for 50 pools), and each full collection, due
    # whenever the heap has grown by a quarter, traversed all of them again (half of the CPU of a plan of
    # 50 pools / 1,000 nodes). Whatever the run leaves as garbage is collected after it.
    collecting = gc.isenabled()
    stack_trace = getattr(_sdk_resource, _STACK_TRACE, None)  # an SDK without it: nothing to skip
    try:
        gc.disable()
        if stack_trace is not None:
            setattr(_sdk_resource, _STACK_TRACE, _no_stack_trace)
        pulumi.runtime.settings.ROOT.set(None)
        pulumi_mocks.set_mocks(
            mocks,
            project=PROJECT,
            stack=platform.name,
            preview=False,
            monitor=_RecordingMonitor(mocks, recording),
        )
        pulumi.runtime.settings.ROOT.set(None)
        _sync_await(run_in_stack(lambda: (program or build)(platform)))
    finally:
        if stack_trace is not None:
            setattr(_sdk_resource, _STACK_TRACE, stack_trace)
        loop.close()
        asyncio.set_event_loop(None)
        if collecting:
            gc.enable()
    recording.resources.sort(key=lambda r: (r.type, r.urn))
    return recording
