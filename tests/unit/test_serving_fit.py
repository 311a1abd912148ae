"""The plan's fit check for a vLLM replica follows vLLM's own rule: GPU memory in GiB (the catalog's
marketed GB converted), and a KV cache at least that of one max_model_len sequence, the floor below
which vLLM refuses to start (vllm/v1/core/kv_cache_utils.py, check_enough_kv_cache_memory). And the
length the plan sized with is the one vLLM is given."""

from __future__ import annotations

from typing import Any

import pytest

from infra.data.load import catalog
from infra.data.models import NodeType
from infra.k8s.serving import _vllm_args
from infra.nodes.inventory import platform_vars, pool_vars
from infra.platform.resolve import load_platform
from infra.platform.serving_layout import kv_cache_floor_gib, serving_layout
from infra.spec.load import stack_file
from infra.spec.models import Serving
from tests.roles.test_serving_templates import ROLES, render, role_vars

LLAMA_31_8B_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V x layers x KV heads x head dim x bf16


def vllm(**fields: Any) -> Serving:
    return Serving(engine="vllm", model="/models/m", pool="infer", **fields)


def node(name: str) -> NodeType:
    found = catalog().get(name)
    assert found is not None
    return found


def fits(serving: Serving, node_type: NodeType) -> bool:
    layout, problems = serving_layout(serving, node_type, simulated=False, path="p.serving")
    return layout is not None and not problems


def test_gpu_memory_is_the_marketed_gb_in_gib() -> None:
    l4 = node("g6.xlarge")
    assert l4.gpu is not None and l4.gpu.memory_gb == 24
    assert l4.gpu_memory_gib == pytest.approx(22.35, abs=0.01)  # 24e9 / 2**30
    # 8B in bf16 (14.9 GiB) + 4.5 GiB KV + 2 GiB overhead = 21.4 GiB: under 24 x 0.9 = 21.6 "GiB", over
    # the 22.35 x 0.9 = 20.1 GiB vLLM would really have.
    assert not fits(vllm(model_params_b=8, kv_cache_gib=4.5), l4)
    assert fits(vllm(model_params_b=8, kv_cache_gib=2), l4)


def test_the_kv_cache_of_one_max_model_len_sequence_must_fit() -> None:
    l40s = node("g6e.xlarge")  # 48 GB: 40.2 GiB usable at 0.9
    full_context = vllm(
        model_params_b=8,
        kv_cache_gib=2,
        max_model_len=131072,
        kv_cache_bytes_per_token=LLAMA_31_8B_KV_BYTES_PER_TOKEN,
    )
    assert kv_cache_floor_gib(full_context) == 16.0
    # 14.9 + 16 + 2 = 32.9 GiB fits an L40S, not an L4 (20.1 GiB): where vLLM would refuse to start.
    assert fits(full_context, l40s)
    assert not fits(full_context, node("g6.xlarge"))
    layout, problems = serving_layout(full_context, node("g6.xlarge"), simulated=False, path="p.serving")
    assert layout is None and "16.0 GiB KV cache" in problems[0][1]
    # A shorter max_model_len lowers the floor under the declared budget: it fits the L4 again.
    assert fits(full_context.model_copy(update={"max_model_len": 8192}), node("g6.xlarge"))


def test_vllm_is_given_the_max_model_len_the_plan_sized_with() -> None:
    serving = vllm(model_params_b=8, max_model_len=16384)
    layout, _ = serving_layout(serving, node("g6e.xlarge"), simulated=False, path="p.serving")
    assert layout is not None
    args = _vllm_args(serving, layout)
    assert args[args.index("--max-model-len") + 1] == "16384"
    # The shipped aws-prod stack, through the inventory `gpuplat inventory` writes, into the unit.
    platform = load_platform(stack_file("aws-prod"))
    inventory = {
        **platform_vars(platform),
        **pool_vars(platform, platform.pool("infer")),
        "inventory_hostname": "aws-prod-infer-0",
        "hostvars": {"aws-prod-infer-0": {}},
    }
    unit = render(
        ROLES / "inference_server" / "templates" / "gpuplat-inference@.service.j2",
        role_vars("inference_server", inventory),
    )
    assert "--max-model-len 8192" in unit
    assert platform.spec.serving is not None and platform.spec.serving.max_model_len == 8192
