"""Measured GPU memory of real training steps (memory_calibration.yaml), the rows sizing is checked against.

A row holds the measured configuration in the fields of `gpuplat size` (a TrainingSizingRequest), the
framework and GPU it ran on, and three figures in GB (10**9 bytes) as benchmarks/measure_memory.py takes
them: model states before the forward pass, the growth over the forward pass, and the peak of the step.
"""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ConfigDict, Field, model_validator

from infra.data.load import DATA_DIR, load_data_file
from infra.data.models import Sourced
from infra.training.sizing import TrainingSizingRequest

CALIBRATION_FILE = DATA_DIR / "memory_calibration.yaml"


class MeasuredMemory(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    model_states_gb: float = Field(
        gt=0, description="allocated before the forward pass: parameters, gradients, optimizer state"
    )
    activations_gb: float = Field(gt=0, description="growth of allocated memory over the forward pass")
    peak_gb: float = Field(gt=0, description="the most held during the step (forward, backward, update)")

    @model_validator(mode="after")
    def _peak_covers_the_forward_pass(self) -> MeasuredMemory:
        if self.peak_gb < self.model_states_gb + self.activations_gb:
            raise ValueError(
                f"peak_gb {self.peak_gb} is below model_states_gb + activations_gb "
                f"({self.model_states_gb + self.activations_gb:.2f}): the peak includes the end of the "
                "forward pass"
            )
        return self


class CalibrationRow(Sourced):
    name: str = Field(min_length=1)
    setup: TrainingSizingRequest = Field(description="the measured configuration, as `gpuplat size` takes it")
    framework: str = Field(min_length=1, description="framework, version and settings that matter to memory")
    gpu: str = Field(min_length=1)
    measured: MeasuredMemory
    notes: str | None = None

    @model_validator(mode="after")
    def _setup_has_activations(self) -> CalibrationRow:
        if not self.setup.has_activations:
            raise ValueError("setup needs the activation inputs (seq_len, micro_batch, hidden_size, layers)")
        return self


class MemoryCalibration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rows: list[CalibrationRow] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> MemoryCalibration:
        names = [row.name for row in self.rows]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"row names must be unique: {', '.join(repeated)} repeated")
        return self


@cache
def memory_calibration() -> MemoryCalibration:
    return load_data_file(CALIBRATION_FILE, MemoryCalibration)
