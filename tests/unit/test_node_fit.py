"""The plan refuses software the nodes cannot run: an engine whose Requires-Python excludes the OS
release's python3, an engine whose torch wheel has no kernels for the serving GPUs, a driver older than a
GPU model needs (not only its architecture), a toolkit that cannot build for the GPUs."""

from __future__ import annotations

import datetime as dt

from infra.data.load import compatibility
from infra.data.packages import package_facts, release_offer
from infra.platform.versions import resolve_versions
from infra.spec.models import Serving, Software

WHILE_535_WAS_SUPPORTED = dt.date(2026, 1, 15)


def vllm(**fields: object) -> Serving:
    return Serving.model_validate({"engine": "vllm", "model": "m", "pool": "infer", **fields})


def test_an_engine_needing_a_newer_python_than_the_release_has_is_refused() -> None:
    """vLLM 0.33.0 requires Python >= 3.11; Ubuntu 22.04 has 3.10."""
    offer = release_offer(package_facts(), "ubuntu2204")
    _, problems = resolve_versions(
        Software(), ["hopper"], compatibility(), "p", vllm(engine_version="0.33.0"), offer
    )
    assert [path for path, _ in problems] == ["p.serving.engine_version"]
    assert "Python >= 3.11" in problems[0][1] and "has 3.10" in problems[0][1]
    software, problems = resolve_versions(Software(), ["hopper"], compatibility(), "p", vllm(), offer)
    assert not problems and software is not None and software.serving is not None
    engine = next(e for e in compatibility().serving_engines if e.version == software.serving.version)
    assert engine.runs_on_python("3.10")


def test_an_engine_capped_below_the_releases_python_is_refused() -> None:
    """vLLM 0.10.1.1 requires Python < 3.13; Debian 13 has 3.13."""
    offer = release_offer(package_facts(), "debian13")
    _, problems = resolve_versions(
        Software(), ["ada"], compatibility(), "p", vllm(engine_version="0.10.1.1"), offer
    )
    assert any("< 3.13" in message and "has 3.13" in message for _, message in problems)


def test_an_engine_without_kernels_for_the_serving_gpus_is_refused() -> None:
    """vLLM 0.10.1.1 pins torch 2.7.1, whose PyPI wheel is cu126: no sm_100 kernels for B200."""
    _, problems = resolve_versions(
        Software(),
        ["blackwell"],
        compatibility(),
        "p",
        vllm(engine_version="0.10.1.1"),
        serving_architectures=["blackwell"],
    )
    assert [path for path, _ in problems] == ["p.serving.engine_version"]
    assert "CUDA 12.6" in problems[0][1] and "CUDA >= 12.8" in problems[0][1]
    software, problems = resolve_versions(
        Software(), ["blackwell"], compatibility(), "p", vllm(), serving_architectures=["blackwell"]
    )
    assert not problems and software is not None and software.serving is not None
    assert tuple(int(x) for x in software.serving.torch_cuda.split(".")) >= (12, 8)


def test_a_gpu_model_newer_than_its_architectures_first_branch_is_checked() -> None:
    """H200 is Hopper, like H100, but no R535 driver supports it (first listed at 550.90.07)."""
    _, problems = resolve_versions(
        Software(driver_branch=535),
        ["hopper"],
        compatibility(),
        "p",
        today=WHILE_535_WAS_SUPPORTED,
        gpu_models=["H200"],
    )
    assert problems == [
        (
            "p.software.driver_branch",
            "H200 GPUs need driver 550.90.07 or newer, the first production driver that supports them "
            "(infra/data/compatibility.yaml, gpu_models); driver 535.247.01 (branch 535) does not: set "
            "software.driver_branch to one whose driver is 550.90.07 or later, or leave the driver to "
            "the plan",
        )
    ]
    software, problems = resolve_versions(
        Software(driver_branch=535),
        ["hopper"],
        compatibility(),
        "p",
        today=WHILE_535_WAS_SUPPORTED,
        gpu_models=["H100"],
    )
    assert not problems and software is not None


def test_a_toolkit_that_cannot_build_for_the_gpus_is_refused() -> None:
    _, problems = resolve_versions(Software(cuda="12.6"), ["blackwell"], compatibility(), "p")
    assert problems == [
        ("p.software.cuda", "CUDA 12.6 cannot build native code for these GPUs (blackwell >= 12.8)")
    ]


def test_dcgm_follows_the_drivers_cuda_major_not_the_toolkits() -> None:
    """R580 reports CUDA 13 even under a 12.8 toolkit: DCGM's cuda13 flavour, which 4.2.3 lacks."""
    offer = release_offer(package_facts(), "debian12")
    software, problems = resolve_versions(
        Software(cuda="12.8"), ["hopper"], compatibility(), "p", offer=offer
    )
    assert not problems and software is not None
    assert (software.driver_branch, software.cuda, software.driver_cuda_major) == (580, "12.8", 13)
    assert software.dcgm_version is not None
    release = next(d for d in compatibility().dcgm if d.version == software.dcgm_version)
    assert 13 in release.cuda_majors and software.dcgm_version in offer.dcgm(13)
