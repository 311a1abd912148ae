"""Policy settings and the neutral view: defaults, the Pulumi-style config file, proxies, tags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

from infra.errors import SpecError
from infra.policy.config import load_policy_config, parse_policy_config
from infra.policy.settings import PolicyConfig
from infra.policy.view import UNKNOWN, ResourceView, plain


def test_defaults() -> None:
    config = PolicyConfig()
    assert config.min_spot_share == 0.5
    assert config.required_tags == ("owner", "team", "cost-center")
    assert config.isolate_subnets is False
    assert config.inference_label is None


def test_pulumi_style_document_sets_levels_and_properties() -> None:
    config = parse_policy_config(
        {
            "all": "advisory",
            "budget-gpus": {"enforcementLevel": "mandatory"},
            "spot-training-share": {"minSpotShare": 0.7},
            "isolation-shared-resources": {"isolateSubnets": True},
        }
    )
    assert config.min_spot_share == 0.7 and config.isolate_subnets is True
    assert config.enforcement["budget-gpus"] == "mandatory"
    assert config.enforcement["security-imdsv2"] == "advisory"


def test_unknown_rule_and_bad_value_are_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="unknown rule 'no-such-rule'"):
        parse_policy_config({"no-such-rule": "advisory"})
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"spot-training-share": {"minSpotShare": 2}}))
    with pytest.raises(SpecError, match="minSpotShare"):
        load_policy_config(path)


def test_plain_unwraps_proxies_and_marks_unknowns() -> None:
    proxied = unknown_checking_proxy({"a": [{"b": UNKNOWN_STRING_VALUE}], "c": 1})
    assert plain(proxied) == {"a": [{"b": UNKNOWN}], "c": 1}


def test_tags_as_mapping_or_autoscaling_list() -> None:
    listed = ResourceView("t", "n", {"tags": [{"key": "owner", "value": "me", "propagateAtLaunch": True}]})
    assert listed.tag("owner") == "me"
    assert ResourceView("t", "n", {"tags": {"team": "ml"}}).tags() == {"team": "ml"}
