"""Replicas that span nodes (the Kueue platform): tensor parallel over each node's GPUs, pipeline parallel
over the fewest nodes the model fits, bounded by the pool; the Slurm platform keeps one node per replica.
And the start budget a replica gets from its model size."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.data.load import catalog
from infra.data.models import NodeType
from infra.errors import SpecError
from infra.platform.resolve import load_platform
from infra.platform.serving_layout import (
    MIN_STARTUP_BUDGET_S,
    ServingLayout,
    replica_gib_per_gpu,
    serving_layout,
    startup_budget_s,
)
from infra.spec.load import stack_file
from infra.spec.models import Serving

H100_USABLE_GIB = 80e9 / 2**30 * 0.9  # the catalog's marketed 80 GB, in GiB


def vllm(**fields: Any) -> Serving:
    return Serving(engine="vllm", model="/models/m", pool="infer", **fields)


def hgx() -> NodeType:
    found = catalog().get("hgx-h100")
    assert found is not None
    return found


def test_onprem_k8s_serves_the_405b_model_over_two_8_gpu_nodes() -> None:
    platform = load_platform(stack_file("onprem-k8s"))
    layout = platform.serving_layout
    assert layout is not None
    assert (layout.tensor_parallel, layout.pipeline_parallel, layout.nodes) == (8, 2, 2)
    assert layout.gpus_per_replica == 16
    # It fits two nodes and not one.
    assert layout.gib_per_gpu is not None and layout.gib_per_gpu <= H100_USABLE_GIB
    spec = platform.spec.serving
    assert spec is not None
    assert (replica_gib_per_gpu(spec, 8) or 0.0) > H100_USABLE_GIB


def test_the_node_count_is_the_smallest_that_fits() -> None:
    # 700e9 x 2 B = 1304 GiB + 8 GiB KV: 1312 / 16 + 2 = 84 GiB per GPU on 2 nodes, / 24 + 2 = 56.7 on 3.
    layout, problems = serving_layout(
        vllm(model_params_b=700, max_replicas=1),
        hgx(),
        simulated=False,
        path="p.serving",
        multi_node=True,
        pool_nodes=4,
    )
    assert not problems and layout is not None
    assert (layout.tensor_parallel, layout.nodes, layout.replicas) == (8, 3, 1)
    assert layout.devices == ("0,1,2,3,4,5,6,7",)


def test_a_model_that_fits_one_node_stays_on_one_node_on_kueue_too() -> None:
    layout, problems = serving_layout(
        vllm(model_params_b=70), hgx(), simulated=False, path="p.serving", multi_node=True, pool_nodes=4
    )
    assert not problems and layout is not None
    # 130.4 GiB of weights + 8 GiB KV: 71.2 GiB per GPU at TP 2, over the 67.1 GiB usable of an
    # "80 GB" H100 (74.5 GiB x 0.9); 36.6 GiB at TP 4: two replicas on the node's 8 GPUs.
    assert (layout.tensor_parallel, layout.replicas, layout.nodes) == (4, 2, 1)


def test_even_all_nodes_of_the_pool_too_few_names_the_model_size_and_the_pool() -> None:
    layout, problems = serving_layout(
        vllm(model_params_b=2000), hgx(), simulated=False, path="p.serving", multi_node=True, pool_nodes=2
    )
    assert layout is None
    [(path, message)] = problems
    assert path == "p.serving.model_params_b"
    assert "all 2 hgx-h100 nodes of pool 'infer'" in message


def test_replicas_times_nodes_must_fit_the_pool() -> None:
    layout, problems = serving_layout(
        vllm(model_params_b=405, kv_cache_gib=64, max_replicas=2),
        hgx(),
        simulated=False,
        path="p.serving",
        multi_node=True,
        pool_nodes=3,
    )
    assert layout is None
    [(path, message)] = problems
    assert path == "p.serving.max_replicas"
    assert "need 4 nodes" in message and "at most 1" in message


def test_explicit_tensor_parallel_over_the_whole_node_spans_nodes_but_a_smaller_one_is_refused() -> None:
    whole, problems = serving_layout(
        vllm(model_params_b=405, tensor_parallel=8),
        hgx(),
        simulated=False,
        path="p.serving",
        multi_node=True,
        pool_nodes=2,
    )
    assert not problems and whole is not None and whole.nodes == 2
    part, problems = serving_layout(
        vllm(model_params_b=405, tensor_parallel=4),
        hgx(),
        simulated=False,
        path="p.serving",
        multi_node=True,
        pool_nodes=2,
    )
    assert part is None and problems[0][0] == "p.serving.tensor_parallel"


def test_slurm_stacks_still_refuse_a_model_larger_than_one_node(
    write_stack: Callable[..., Path],
) -> None:
    def large_model(platform: dict[str, Any]) -> None:
        platform["serving"]["model_params_b"] = 405
        platform["serving"]["kv_cache_gib"] = 64

    with pytest.raises(SpecError) as raised:
        load_platform(write_stack("onprem", large_model))
    assert "serving.model_params_b" in raised.value.message
    assert "does not fit one hgx-h100 node" in raised.value.message


def test_startup_budget_covers_the_weights_at_the_worst_case_read_and_never_under_20_minutes() -> None:
    small = ServingLayout(tensor_parallel=1, replicas=8, devices=("0",), gib_per_gpu=None)
    assert startup_budget_s(vllm(model_params_b=8), small, hgx()) == MIN_STARTUP_BUDGET_S == 1200
    big = ServingLayout(tensor_parallel=8, replicas=1, devices=("0",), gib_per_gpu=None, nodes=2)
    # 405e9 x 2 B = 754.4 GiB at 250 MiB/s = 3090 s, + 600 s engine start.
    assert startup_budget_s(vllm(model_params_b=405), big, hgx()) == 3690


def test_startup_budget_without_a_model_size_assumes_the_gpus_full() -> None:
    # 16 GPUs x 67.1 GiB usable (80 GB = 74.5 GiB, x 0.9) = 1073 GiB at 250 MiB/s = 4395 s, + 600 s.
    big = ServingLayout(tensor_parallel=8, replicas=1, devices=("0",), gib_per_gpu=None, nodes=2)
    assert startup_budget_s(vllm(), big, hgx()) == 4995
