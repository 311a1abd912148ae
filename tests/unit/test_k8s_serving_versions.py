"""A `gpuplat serve` release on the Kueue platform: a workload and a headless Service per registered
version, the stable version's replica count owned by KEDA, the canary's share drawn per request by the
inference_gateway role's HAProxy (the configuration checked by the real haproxy), every object valid
against the strict Kubernetes schemas and the CRDs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from infra.k8s.facts import host_path_facts
from infra.k8s.objects import Manifest
from infra.k8s.serving import serving_objects
from infra.k8s.serving_versions import ServedVersion, ServingRelease
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.spec.load import stack_file
from tests.conftest import fsx_facts
from tests.k8s_schemas import assert_accepted

HAPROXY = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
V1 = ServedVersion("llama@1", "s3://models/llama/1")
V2 = ServedVersion("llama@2", "s3://models/llama/2")


@pytest.fixture(scope="module")
def aws() -> ResolvedPlatform:
    return load_platform(stack_file("aws-k8s"))


@pytest.fixture(scope="module")
def onprem() -> ResolvedPlatform:
    return load_platform(stack_file("onprem-k8s"))


def objects(platform: ResolvedPlatform, release: ServingRelease | None) -> list[Manifest]:
    facts = fsx_facts() if platform.spec.backend == "aws" else host_path_facts(platform)
    return serving_objects(platform, facts, release)


def named(found: list[Manifest], kind: str, name: str) -> Manifest:
    [one] = [o for o in found if o["kind"] == kind and o["metadata"]["name"] == name]
    return one


def config(found: list[Manifest]) -> str:
    return str(named(found, "ConfigMap", "gateway-haproxy")["data"]["haproxy.cfg"])


def test_each_version_runs_its_own_deployment_and_headless_service(aws: ResolvedPlatform) -> None:
    found = objects(aws, ServingRelease(V1, canary=V2, canary_percent=20, canary_replicas=2))
    stable = named(found, "Deployment", "model-server-llama-v1")
    canary = named(found, "Deployment", "model-server-llama-v2")
    assert "replicas" not in stable["spec"]  # KEDA's
    assert canary["spec"]["replicas"] == 2
    for deployment, version in ((stable, V1), (canary, V2)):
        labels = {"gpuplat/component": "model-server", "gpuplat/model-version": version.slug}
        assert deployment["spec"]["selector"] == {"matchLabels": labels}
        template = deployment["spec"]["template"]
        assert template["metadata"]["labels"] == labels
        [container] = template["spec"]["containers"]
        assert {"name": "GPUPLAT_MODEL", "value": version.model} in container["env"]
        service = named(found, "Service", f"model-server-{version.slug}-replicas")
        assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == labels
    target = named(found, "ScaledObject", "model-server")["spec"]["scaleTargetRef"]
    assert target == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "model-server-llama-v1"}
    assert not [o for o in found if o["metadata"]["name"] in ("model-server-replicas",) or (
        o["kind"] == "Deployment" and o["metadata"]["name"] == "model-server")]  # fmt: skip


def test_the_gateways_draw_the_canarys_share_and_resolve_each_versions_pods(aws: ResolvedPlatform) -> None:
    text = config(objects(aws, ServingRelease(V1, canary=V2, canary_percent=20)))
    assert "    use_backend inference_canary if { rand(100) lt 20 }\n" in text
    templates = re.findall(
        r"^backend (\S+)$|^\s+server-template (\S+) 1-(\d+) (\S+):8000 ", text, re.MULTILINE
    )
    assert [t for t in templates if any(t)] == [
        ("inference", "", "", ""),
        ("", "replica-", "8", "model-server-llama-v1-replicas.serving.svc.cluster.local"),
        ("inference_canary", "", "", ""),
        ("", "replica-canary-", "8", "model-server-llama-v2-replicas.serving.svc.cluster.local"),
    ]


def test_a_canary_at_share_0_keeps_its_backend_but_draws_no_request(aws: ResolvedPlatform) -> None:
    text = config(objects(aws, ServingRelease(V1, canary=V2, canary_percent=0)))
    assert "backend inference_canary\n" in text
    assert "use_backend" not in text
    alone = config(objects(aws, ServingRelease(V1)))
    assert "inference_canary" not in alone and "use_backend" not in alone


def test_a_retiring_version_keeps_its_pods_but_no_gateway_names_it(aws: ResolvedPlatform) -> None:
    found = objects(aws, ServingRelease(V2, retiring=V1, retiring_replicas=3))
    assert named(found, "Deployment", "model-server-llama-v1")["spec"]["replicas"] == 3
    assert "llama-v1" not in config(found)
    target = named(found, "ScaledObject", "model-server")["spec"]["scaleTargetRef"]["name"]
    assert target == "model-server-llama-v2"


def test_multi_node_versions_are_leader_worker_sets_of_their_own(onprem: ResolvedPlatform) -> None:
    found = objects(onprem, ServingRelease(V1, canary=V2, canary_percent=5))
    canary = named(found, "LeaderWorkerSet", "model-server-llama-v2")
    assert canary["spec"]["replicas"] == 1
    service = named(found, "Service", "model-server-llama-v2-replicas")
    assert service["spec"]["selector"] == {
        "gpuplat/component": "model-server",
        "gpuplat/model-version": "llama-v2",
        "leaderworkerset.sigs.k8s.io/worker-index": "0",
    }


@pytest.mark.parametrize("stack", ["aws", "onprem"])
def test_every_release_object_is_accepted_by_the_api_server_schemas(
    stack: str, request: pytest.FixtureRequest
) -> None:
    platform: ResolvedPlatform = request.getfixturevalue(stack)
    assert platform.spec.kubernetes is not None
    for release in (
        ServingRelease(V1, canary=V2, canary_percent=20, retiring=ServedVersion("llama@0", "/m/0")),
        ServingRelease(V1, stable_replicas=3, stack_model="serving"),
        ServingRelease(V1, canary=V2, stack_model="retiring"),
    ):
        for manifest in objects(platform, release):
            assert_accepted(manifest, platform.spec.kubernetes.version)


def test_while_a_first_release_takes_over_the_stacks_own_objects_run_beside_it(aws: ResolvedPlatform) -> None:
    starting = objects(aws, ServingRelease(V1, stable_replicas=3, stack_model="serving"))
    assert "replicas" not in named(starting, "Deployment", "model-server")["spec"]
    assert named(starting, "Deployment", "model-server-llama-v1")["spec"]["replicas"] == 3
    assert "model-server-replicas.serving.svc" in config(starting) and "llama-v1" not in config(starting)
    retiring = objects(aws, ServingRelease(V1, stable_replicas=3, stack_model="retiring"))
    assert named(retiring, "Service", "model-server-replicas")
    assert "model-server-replicas" not in config(retiring) and "llama-v1-replicas" in config(retiring)


@pytest.mark.skipif(
    HAPROXY is None, reason="no haproxy binary: scripts/setup-host.sh installs Debian's package"
)
@pytest.mark.parametrize("share", [0, 1, 50, 99])
def test_haproxy_accepts_the_gateway_configuration_of_a_release(
    aws: ResolvedPlatform, share: int, tmp_path: Path
) -> None:
    path = tmp_path / "haproxy.cfg"
    path.write_text(config(objects(aws, ServingRelease(V1, canary=V2, canary_percent=share))))
    checked = subprocess.run(
        [str(HAPROXY), "-c", "-f", str(path)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize(
    "reference",
    ["embedder@1", "Team_Model.v2@17", "a" * 80 + "@3", "x--y@1", "-lead@2"],
)
def test_a_versions_object_names_are_dns_labels(reference: str) -> None:
    slug = ServedVersion(reference, "/m").slug
    # The slug alone is the gpuplat/model-version label's value: alphanumeric at both ends.
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", slug), slug
    service = f"model-server-{slug}-replicas"
    assert len(service) <= 63
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", service), service


@pytest.mark.parametrize("reference", ["embedder@1", "m" * 38 + "@1", "a" * 80 + "@3", "Team_Model.v2@17"])
def test_a_multi_node_versions_group_statefulsets_can_create_pods(reference: str) -> None:
    """LeaderWorkerSet model-server-<slug> runs a StatefulSet model-server-<slug>-<group> per group; the
    StatefulSet controller labels its pods with that name, `-` and a hash of up to 10 characters, a label
    value of at most 63 characters (kubernetes/kubernetes#64023): checked for 999 groups."""
    slug = ServedVersion(reference, "/m").slug
    assert len(f"model-server-{slug}-998-{'h' * 10}") <= 63, slug


@pytest.mark.parametrize(
    "references",
    [("Embedder@1", "embedder@1"), ("team_model@2", "team-model@2", "team.model@2")],
)
def test_registered_models_whose_names_differ_only_in_case_or_punctuation_keep_apart(
    references: tuple[str, ...],
) -> None:
    """The registry's model names are case-sensitive and may hold `_` and `.`: each is another model."""
    slugs = {ServedVersion(reference, "/m").slug for reference in references}
    assert len(slugs) == len(references), slugs
    # A canary of one beside the other is no "one version in two roles".
    ServingRelease(ServedVersion(references[0], "/m/a"), canary=ServedVersion(references[1], "/m/b"))


def test_long_references_that_share_a_prefix_keep_apart() -> None:
    first, second = (ServedVersion("m" * 60 + f"@{n}", "/m").slug for n in (1, 2))
    assert first != second


@pytest.mark.parametrize(
    ("release", "message"),
    [
        (lambda: ServingRelease(V1, canary=V2, canary_percent=100), "0 to 99"),
        (lambda: ServingRelease(V1, canary_percent=5), "without a canary"),
        (lambda: ServingRelease(V1, canary=V1), "one version in two roles"),
        (lambda: ServingRelease(V1, canary=V2, canary_replicas=0), "at least one replica"),
        (lambda: ServingRelease(V1, canary=V2, stack_model="serving"), "no canary or retiring"),
    ],
)
def test_impossible_releases_are_refused(release: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        release()  # type: ignore[operator]


def test_a_gateway_pod_stopping_for_a_new_share_answers_what_it_took_first(aws: ResolvedPlatform) -> None:
    """A share changed rolls the gateways; the image stops HAProxy gracefully (SIGUSR1), and the pod must
    be given the time a request may take in the queue and at the server, and an idle keep-alive."""
    serving = aws.spec.serving
    assert serving is not None
    found = objects(aws, ServingRelease(V1, canary=V2, canary_percent=20))
    pod = named(found, "Deployment", "gateway")["spec"]["template"]["spec"]
    [keep_alive] = re.findall(r"timeout http-keep-alive (\d+)s", config(found))
    # The Service's endpoints drop a stopping pod while it stops, each node's kube-proxy later: the pod
    # keeps listening a while before HAProxy unbinds, and that wait counts against the grace period.
    [container] = pod["containers"]
    sleep, seconds = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep == "sleep" and int(seconds) >= 1
    in_flight = serving.queue_timeout_s + serving.gateway_timeout_s + int(keep_alive)
    assert pod["terminationGracePeriodSeconds"] >= int(seconds) + in_flight
