"""Serving engine <-> driver: vLLM's torch, that torch's CUDA major, the driver branch it needs;
tensor-parallel degree and replicas per node; both carried to the roles by the inventory."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.data.load import catalog, compatibility
from infra.errors import SpecError
from infra.nodes.inventory import platform_vars
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.platform.serving_layout import serving_layout
from infra.platform.versions import resolve_versions, serving_chain, training_torch_problems, version_tuple
from infra.spec.load import CONFIG_KEY, stack_file
from infra.spec.models import Serving, Software

ROOT = Path(__file__).resolve().parents[2]


def vllm(**fields: Any) -> Serving:
    return Serving(engine="vllm", model="/models/m", pool="infer", **fields)


def node(name: str) -> Any:
    found = catalog().get(name)
    assert found is not None, name
    return found


# -- the data chain ----------------------------------------------------------------------------


def test_every_vllm_release_resolves_to_a_driver_minimum() -> None:
    data = compatibility()
    chains = [serving_chain(r, data) for r in data.serving_engines]
    assert chains, "the compatibility data lists no serving engine"
    for chain in chains:
        major = int(chain.torch_cuda.split(".")[0])
        assert chain.min_driver_branch == (525 if major == 12 else 580), chain


def test_cuda13_torch_needs_driver_580() -> None:
    data = compatibility()
    cuda13 = [serving_chain(r, data) for r in data.serving_engines if r.torch == "2.13.0"]
    assert cuda13 and all(c.min_driver_branch == 580 for c in cuda13)


# -- the resolver ------------------------------------------------------------------------------


def test_default_driver_gets_the_newest_vllm_it_runs() -> None:
    data = compatibility()
    software, problems = resolve_versions(Software(), ["ada"], data, "p", vllm())
    assert not problems and software is not None and software.serving is not None
    assert software.driver_branch == data.default_driver_branch
    chosen = software.serving
    assert chosen.min_driver_branch <= software.driver_branch
    # the newest runnable one: no release with a higher version runs on the default branch
    newer = [
        serving_chain(r, data)
        for r in data.serving_engines
        if version_tuple(r.version) > version_tuple(chosen.version)
    ]
    assert all(c.min_driver_branch > software.driver_branch for c in newer)


def test_explicit_570_gets_the_newest_vllm_it_runs_while_570_was_supported() -> None:
    software, problems = resolve_versions(
        Software(driver_branch=570), ["ada"], compatibility(), "p", vllm(), today=dt.date(2026, 1, 15)
    )
    assert not problems and software is not None and software.serving is not None
    assert software.serving.min_driver_branch <= 570 and software.serving.torch_cuda.startswith("12.")


def test_pinned_cuda13_vllm_raises_an_open_driver_branch() -> None:
    software, problems = resolve_versions(
        Software(), ["hopper"], compatibility(), "p", vllm(engine_version="0.33.0")
    )
    assert not problems and software is not None and software.serving is not None
    assert software.driver_branch >= 580
    assert software.serving.version == "0.33.0"
    assert software.cuda == "13.0"


def test_pinned_cuda13_vllm_against_explicit_570_names_both_fields() -> None:
    software, problems = resolve_versions(
        Software(driver_branch=570),
        ["hopper"],
        compatibility(),
        "p",
        vllm(engine_version="0.33.0"),
        today=dt.date(2026, 1, 15),
    )
    assert software is None
    assert len(problems) == 1
    path, message = problems[0]
    assert path == "p.serving.engine_version"
    assert "vLLM 0.33.0" in message and "CUDA 13" in message and ">= 580" in message
    assert "software.driver_branch is 570" in message


def test_newer_explicit_driver_gets_a_cuda13_vllm() -> None:
    software, problems = resolve_versions(
        Software(driver_branch=580), ["hopper"], compatibility(), "p", vllm()
    )
    assert not problems and software is not None and software.serving is not None
    assert software.serving.min_driver_branch == 580


def test_unknown_vllm_is_rejected() -> None:
    _, problems = resolve_versions(Software(), ["ada"], compatibility(), "p", vllm(engine_version="9.9.9"))
    assert problems and problems[0][0] == "p.serving.engine_version" and "unknown vLLM" in problems[0][1]


def test_cpu_reference_has_no_engine_version() -> None:
    software, problems = resolve_versions(
        Software(),
        ["hopper"],
        compatibility(),
        "p",
        Serving(engine="cpu-reference", model="m", pool="infer"),
    )
    assert not problems and software is not None and software.serving is None


def test_role_no_longer_pins_its_own_vllm() -> None:
    defaults = yaml.safe_load((ROOT / "roles/inference_server/defaults/main.yml").read_text())
    assert not [key for key in defaults if "vllm_version" in key]
    task = (ROOT / "roles/inference_server/tasks/engine-vllm.yml").read_text()
    assert "vllm=={{ inference_vllm_version }}" in task


def test_inventory_carries_a_vllm_that_runs_on_the_driver(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    data = compatibility()
    for name in ("onprem", "aws-prod"):
        values = platform_vars(shipped_platforms[name])
        release = next(r for r in data.serving_engines if r.version == values["inference_vllm_version"])
        assert serving_chain(release, data).min_driver_branch <= values["gpu_driver_branch"], name
    assert platform_vars(shipped_platforms["local"])["inference_vllm_version"] == ""


def _pin(version: str, driver: int | None) -> Callable[[dict[str, Any]], None]:
    def mutate(platform: dict[str, Any]) -> None:
        platform["serving"]["engine_version"] = version
        if driver is not None:
            platform.setdefault("software", {})["driver_branch"] = driver

    return mutate


def test_conflicting_stack_is_a_spec_error(write_stack: Callable[..., Path]) -> None:
    with pytest.raises(SpecError) as raised:
        load_platform(write_stack("onprem", _pin("0.33.0", 570)))
    assert "serving.engine_version" in str(raised.value) and "driver_branch is 570" in str(raised.value)


def test_conflicting_stack_exits_2_without_traceback(write_stack: Callable[..., Path]) -> None:
    path = write_stack("onprem", _pin("0.33.0", 570))
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from infra.cli.app import main; main()",
            "inventory",
            "--stack-file",
            str(path),
        ],
        capture_output=True,
        text=True,
        env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 2
    assert str(path) in result.stderr and "serving.engine_version" in result.stderr
    assert "Traceback" not in result.stderr


# -- tensor parallel and replicas ----------------------------------------------------------------


def test_small_model_on_8_gpus_runs_8_replicas_not_gpu0_alone() -> None:
    layout, problems = serving_layout(
        vllm(model_params_b=8), node("hgx-h100"), simulated=False, path="p.serving"
    )
    assert not problems and layout is not None
    assert (layout.tensor_parallel, layout.replicas) == (1, 8)
    assert layout.devices == tuple(str(g) for g in range(8))
    assert layout.ports(8000) == list(range(8000, 8008))


def test_70b_model_on_h200_needs_tp2_and_runs_4_replicas() -> None:
    # 70e9 x 2 B = 130.4 GiB of weights + 8 GiB KV: 71.2 GiB per GPU at TP 2 fits an H200 (141 GB =
    # 131.3 GiB, 118.2 usable at 0.9), not an H100 (80 GB = 74.5 GiB, 67.1 usable): TP 4 there.
    layout, problems = serving_layout(
        vllm(model_params_b=70), node("p5e.48xlarge"), simulated=False, path="p.serving"
    )
    assert not problems and layout is not None
    assert (layout.tensor_parallel, layout.replicas) == (2, 4)
    assert layout.devices == ("0,1", "2,3", "4,5", "6,7")
    assert layout.ports(8000) == [8000, 8001, 8002, 8003]
    on_h100, _ = serving_layout(vllm(model_params_b=70), node("hgx-h100"), simulated=False, path="p.serving")
    assert on_h100 is not None and (on_h100.tensor_parallel, on_h100.replicas) == (4, 2)


def test_model_too_large_for_the_node_is_rejected() -> None:
    layout, problems = serving_layout(
        vllm(model_params_b=700), node("hgx-h100"), simulated=False, path="p.serving"
    )
    assert layout is None and problems[0][0] == "p.serving.model_params_b"


def test_explicit_tensor_parallel_must_divide_the_gpus() -> None:
    _, problems = serving_layout(vllm(tensor_parallel=3), node("hgx-h100"), simulated=False, path="p.serving")
    assert problems and problems[0][0] == "p.serving.tensor_parallel"


def test_cpu_reference_and_simulated_gpus_run_one_replica() -> None:
    cpu = Serving(engine="cpu-reference", model="m", pool="infer")
    for serving, simulated in ((cpu, False), (vllm(model_params_b=8), True)):
        layout, problems = serving_layout(serving, node("hgx-h100"), simulated=simulated, path="p")
        assert not problems and layout is not None
        assert (layout.replicas, layout.devices) == (1, ("",))


def test_inventory_carries_the_layout(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    onprem = platform_vars(shipped_platforms["onprem"])
    assert onprem["inference_replicas_per_node"] == 8
    assert onprem["inference_tensor_parallel_size"] == 1
    assert len(onprem["inference_replica_gpus"]) == 8
    local = platform_vars(shipped_platforms["local"])
    assert (local["inference_replicas_per_node"], local["inference_replica_gpus"]) == (1, [""])


def test_the_training_torch_must_be_known_and_run_on_the_driver() -> None:
    """torch 2.13.0's PyPI build is CUDA 13 (driver 580+); 2.9.1's is CUDA 12 (525+)."""
    data = compatibility()
    assert training_torch_problems(None, 535, data, "root") == []
    assert training_torch_problems("2.9.1", 535, data, "root") == []
    [(path, message)] = training_torch_problems("2.13.0", 570, data, "root")
    assert path == "root.training.torch_version" and "CUDA 13.0" in message and "580" in message
    [(path, message)] = training_torch_problems("2.99.0", 580, data, "root")
    assert "not in infra/data/compatibility.yaml" in message and "2.13.0" in message


def test_a_stack_with_an_unknown_training_torch_is_refused_at_its_field(tmp_path: Path) -> None:
    document = yaml.safe_load(stack_file("aws-prod").read_text())
    document["config"][CONFIG_KEY]["training"] = {"torch_version": "2.99.0"}
    path = tmp_path / "Pulumi.unknown-torch.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(SpecError, match=r"training\.torch_version: torch 2\.99\.0 is not in"):
        load_platform(path)
