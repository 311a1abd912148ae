"""`gpuplat manifests`: a directory a user can apply, written whole or not at all."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.unit.test_cli import gpuplat


def documents(path: Path) -> list[dict[str, object]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_writes_objects_nodes_operators_and_examples(tmp_path: Path) -> None:
    out = tmp_path / "onprem-k8s"
    result = gpuplat("manifests", "--stack", "onprem-k8s", "--output", str(out))
    assert result.returncode == 0, result.stderr
    kustomization = documents(out / "kustomization.yaml")[0]
    listed = kustomization["resources"]
    assert isinstance(listed, list)
    assert listed[0] == "00-namespaces.yaml" and "10-cluster.yaml" in listed
    kinds = {str(d["kind"]) for name in listed for d in documents(out / str(name))}
    assert {"ClusterQueue", "LocalQueue", "ValidatingAdmissionPolicy", "LeaderWorkerSet"} <= kinds
    for name in listed:
        for document in documents(out / str(name)):
            metadata = document["metadata"]
            assert isinstance(metadata, dict) and metadata["name"]
    nodes = {str(d["metadata"]["name"]) for d in documents(out / "nodes.yaml")}  # type: ignore[index]
    assert nodes == {"k8s-cp-01", "gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-21", "gpu-22"}
    helmfile = documents(out / "operators" / "helmfile.yaml")[0]
    releases = helmfile["releases"]
    assert isinstance(releases, list)
    for release in releases:
        assert (out / "operators" / release["values"][0]).is_file()
        assert release["version"]
    assert (out / "examples" / "research-jobset.yaml").is_file()
    assert "kubectl apply -k" in result.stderr


def test_refuses_a_non_empty_directory_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    refused = gpuplat("manifests", "--stack", "onprem-k8s", "--output", str(out))
    assert refused.returncode == 2 and "--force" in refused.stderr
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    forced = gpuplat("manifests", "--stack", "onprem-k8s", "--output", str(out), "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (out / "mine.txt").exists() and (out / "kustomization.yaml").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging directory left behind


def test_slurm_stacks_have_no_manifests(tmp_path: Path) -> None:
    result = gpuplat("manifests", "--stack", "aws-prod", "--output", str(tmp_path / "x"))
    assert result.returncode == 2
    assert "scheduler.kind kueue" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x").exists()


def test_cloud_computed_values_are_named_not_passed_off_as_real(tmp_path: Path) -> None:
    result = gpuplat("manifests", "--stack", "aws-k8s", "--output", str(tmp_path / "aws"))
    assert result.returncode == 0, result.stderr
    assert "computed by the cloud" in result.stderr
    assert "fsx.mock.amazonaws.com" in result.stderr


def test_eks_stacks_have_no_ansible_inventory() -> None:
    result = gpuplat("inventory", "--stack", "aws-k8s")
    assert result.returncode == 2
    assert "EKS" in result.stderr and "Traceback" not in result.stderr
    assert gpuplat("inventory", "--stack", "onprem-k8s").returncode == 0


def test_the_helmfile_applies_the_autoscalers_crd_before_its_release(tmp_path: Path) -> None:
    result = gpuplat("manifests", "--stack", "aws-k8s", "--output", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    helmfile = documents(tmp_path / "out" / "operators" / "helmfile.yaml")[0]
    (release,) = [r for r in helmfile["releases"] if r["name"] == "cluster-autoscaler"]
    (hook,) = release["hooks"]
    assert hook["events"] == ["presync"] and hook["command"] == "kubectl"
    assert hook["args"][-1].endswith("autoscaling.x-k8s.io_provisioningrequests.yaml")


def test_releases_after_the_autoscaler_wait_for_its_crd(tmp_path: Path) -> None:
    """helmfile installs releases in parallel unless one needs another, and Kueue sets up its
    ProvisioningRequest check only if the CRD is served when it starts (cmd/kueue/main.go:512-526 at
    v0.19.2): without the CRD first, every ClusterQueue with the check stays inactive."""
    result = gpuplat("manifests", "--stack", "aws-k8s", "--output", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    releases = documents(tmp_path / "out" / "operators" / "helmfile.yaml")[0]["releases"]
    autoscaler = next(r for r in releases if r["name"] == "cluster-autoscaler")
    (kueue,) = [r for r in releases if r["name"] == "kueue"]
    assert kueue["needs"] == [f"{autoscaler['namespace']}/cluster-autoscaler"]
    assert "needs" not in autoscaler
