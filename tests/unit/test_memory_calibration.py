"""infra.training.sizing against measured GPU memory (infra/data/memory_calibration.yaml), and the benchmark
that measures it (benchmarks/measure_memory.py)."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from infra.data.load import load_data_file
from infra.data.models import GB
from infra.errors import SpecError
from infra.training.memory_calibration import CalibrationRow, MemoryCalibration, memory_calibration
from infra.training.sizing import size_training

TOLERANCE = 0.15
ROWS = memory_calibration().rows
ROOT = Path(__file__).resolve().parents[2]
BENCHMARK = ROOT / "benchmarks" / "measure_memory.py"


def by_name(row: CalibrationRow) -> str:
    return row.name


def test_rows_cover_both_attention_paths() -> None:
    assert {row.setup.attention for row in ROWS} == {"flash", "math"}


@pytest.mark.parametrize("row", ROWS, ids=by_name)
def test_predicted_peak_within_15_percent_of_measured(row: CalibrationRow) -> None:
    predicted = size_training(row.setup).per_gpu_bytes.total
    assert predicted == pytest.approx(row.measured.peak_gb * GB, rel=TOLERANCE)


@pytest.mark.parametrize("row", ROWS, ids=by_name)
def test_predicted_parts_within_15_percent_of_measured(row: CalibrationRow) -> None:
    result = size_training(row.setup)
    assert result.activation is not None
    # what the forward pass adds: activations and the fp32 log-probabilities kept for the backward pass
    forward = result.per_gpu_bytes.activations + result.activation.logits_kept_bytes
    assert forward == pytest.approx(row.measured.activations_gb * GB, rel=TOLERANCE)
    assert result.per_gpu_bytes.model_states == pytest.approx(
        row.measured.model_states_gb * GB, rel=TOLERANCE
    )


@pytest.mark.parametrize("row", ROWS, ids=by_name)
def test_the_other_attention_path_misses_the_row(row: CalibrationRow) -> None:
    other = "math" if row.setup.attention == "flash" else "flash"
    wrong = size_training(row.setup.model_copy(update={"attention": other})).per_gpu_bytes.total
    assert abs(wrong / (row.measured.peak_gb * GB) - 1) > TOLERANCE


# --- the data file's model -----------------------------------------------------------------------------


def shipped_row() -> dict[str, Any]:
    return ROWS[0].model_dump(mode="json")


def load_rows(tmp_path: Path, rows: list[dict[str, Any]]) -> MemoryCalibration:
    path = tmp_path / "memory_calibration.yaml"
    path.write_text(yaml.safe_dump({"rows": rows}))
    return load_data_file(path, MemoryCalibration)


def test_shipped_rows_round_trip(tmp_path: Path) -> None:
    assert load_rows(tmp_path, [row.model_dump(mode="json") for row in ROWS]) == memory_calibration()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"measured": {"model_states_gb": 14.6, "activations_gb": 13.1, "peak_gb": 20.0}},
            r"rows\[0\]\.measured",
        ),
        ({"setup": {"params": 1e9, "attention": "sparse"}}, r"rows\[0\]\.setup\.attention"),
        ({"setup": {"params": 1e9}}, "needs the activation inputs"),
        ({"gpu": ""}, r"rows\[0\]\.gpu"),
        ({"source": "x"}, r"rows\[0\]\.source"),
    ],
)
def test_bad_rows_name_the_field(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        load_rows(tmp_path, [{**shipped_row(), **change}])


def test_row_names_are_unique(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="unique"):
        load_rows(tmp_path, [shipped_row(), shipped_row()])


# --- benchmarks/measure_memory.py ----------------------------------------------------------------------


@cache
def benchmark_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("benchmarks_measure_memory", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_benchmark_without_torch_or_gpu_exits_3() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # where torch is installed, hide the GPUs
    result = subprocess.run(
        [sys.executable, str(BENCHMARK)], capture_output=True, text=True, env=env, cwd=ROOT, check=False
    )
    assert result.returncode == 3, result.stderr
    assert "torch is not installed" in result.stderr or "no CUDA GPU" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_benchmark_model_is_the_issue_model() -> None:
    bench = benchmark_module()
    args: argparse.Namespace = bench.parse_args([])
    assert bench.gpt_params(bench.shape_of(args)) == 875_466_752  # the parameter count issue 17 measured


@pytest.mark.parametrize("attention", ["flash", "math"])
def test_benchmark_row_matches_the_shipped_rows(attention: str) -> None:
    bench = benchmark_module()
    measured = bench.Measured(model_states=14_600_000_000, activations=13_120_000_000, peak=29_820_000_000,
                              outside_allocator=500_000_000)  # fmt: skip
    row = bench.calibration_row(
        bench.parse_args(["--attention", attention]),
        measured,
        framework="PyTorch 2.11, CUDA 13",
        gpu="NVIDIA H200",
        today=dt.date(2026, 12, 1),
    )
    assert row["measured"] == {"model_states_gb": 14.6, "activations_gb": 13.12, "peak_gb": 29.82}
    assert row["name"] == f"gpt-875m-h200-bf16-autocast-{attention}"
    shipped = next(r for r in ROWS if r.setup.attention == attention)
    assert CalibrationRow.model_validate(row).setup == shipped.setup
