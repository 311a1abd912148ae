"""The fabric gates (infra/data/fabric_gates.yaml): GPUDirect RDMA expectation and published bus bandwidth
per node type and test shape, each with its source."""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from infra.data.load import DATA_DIR, catalog, load_data_file
from infra.data.models import Sourced
from infra.errors import SpecError

GATES_FILE = DATA_DIR / "fabric_gates.yaml"

Shape = Literal["intra-node", "two-node"]
Column = Literal["in-place", "out-of-place"]
SHAPE_NODES: dict[Shape, int] = {"intra-node": 1, "two-node": 2}


class GpuDirectRdma(Sourced):
    expected: bool = Field(description="NCCL's network transport should use GPUDirect RDMA on this node type")


class BusbwGate(Sourced):
    shape: Shape
    min_busbw_gbps: float = Field(gt=0, description="nccl-tests busbw, GB/s (10**9 bytes/s), all_reduce_perf")
    message_bytes: int = Field(gt=0, description="the message size the figure is read at")
    column: Column = Field(description="the nccl-tests column the figure is read from")
    ranks_per_node: int = Field(ge=1)
    published: str = Field(min_length=8, description="the figure and test as the source states them")


class NodeGates(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    node_type: str
    gpudirect_rdma: GpuDirectRdma | None = None
    busbw: list[BusbwGate] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_gate_per_shape(self) -> NodeGates:
        shapes = [gate.shape for gate in self.busbw]
        if len(shapes) != len(set(shapes)):
            raise ValueError(f"{self.node_type}: one busbw gate per shape, got {shapes}")
        return self

    def busbw_gate(self, shape: Shape) -> BusbwGate | None:
        return next((gate for gate in self.busbw if gate.shape == shape), None)


class FabricGates(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    node_types: list[NodeGates]

    @model_validator(mode="after")
    def _unique_node_types(self) -> FabricGates:
        names = [entry.node_type for entry in self.node_types]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"node types listed twice: {', '.join(repeated)}")
        return self

    def get(self, node_type: str) -> NodeGates | None:
        return next((entry for entry in self.node_types if entry.node_type == node_type), None)


@cache
def fabric_gates() -> FabricGates:
    gates = load_data_file(GATES_FILE, FabricGates)
    known = set(catalog().names())
    unknown = sorted(entry.node_type for entry in gates.node_types if entry.node_type not in known)
    if unknown:
        raise SpecError(f"{GATES_FILE}: node_types not in gpu_catalog.yaml: {', '.join(unknown)}")
    return gates
