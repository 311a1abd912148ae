"""The CI examples users copy (examples/ci/): the scripts their workflows call, run here as the workflows
run them; the workflow files themselves are validated in `make lint` (check-jsonschema, the GitHub
workflow and GitLab CI schemas it vendors; actionlint) and the runtimes of the actions they use here."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from infra.spec.load import PROJECT_ROOT, stack_file
from tests.upstream import UPSTREAM

GPUPLAT = str(Path(sys.executable).parent / "gpuplat")
SCRIPTS = PROJECT_ROOT / "scripts" / "ci"


def _git(repository: Path, *args: str) -> str:
    command = ["git", "-C", str(repository), "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def test_the_plan_comment_covers_the_stack_files_a_change_touches(tmp_path: Path) -> None:
    repository = tmp_path / "platform"
    (repository / "stacks").mkdir(parents=True)
    _git(repository, "init", "-q", "-b", "main")
    for name in ("aws-prod", "onprem"):
        (repository / "stacks" / f"Pulumi.{name}.yaml").write_text(stack_file(name).read_text())
    _git(repository, "add", ".")
    _git(repository, "commit", "-q", "-m", "base")
    _git(repository, "checkout", "-q", "-b", "change")
    changed = repository / "stacks" / "Pulumi.aws-prod.yaml"
    document = yaml.safe_load(changed.read_text())
    pools = document["config"]["gpu-platform:platform"]["pools"]
    next(p for p in pools if p["name"] == "infer")["max"] = 12
    changed.write_text(yaml.safe_dump(document, sort_keys=False))
    _git(repository, "commit", "-q", "-am", "more inference")

    done = subprocess.run(
        [str(SCRIPTS / "plan-comment.sh"), "main", "comment.md"],
        cwd=repository, capture_output=True, text=True, env={"GPUPLAT": GPUPLAT, "PATH": "/usr/bin:/bin"},
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    comment = (repository / "comment.md").read_text()
    assert "stack `aws-prod`" in comment and "`aws-prod-infer-asg`" in comment
    assert "onprem" not in comment  # untouched stacks stay out of the comment
    bad = subprocess.run(
        [str(SCRIPTS / "plan-comment.sh"), "origin/nowhere"], cwd=repository, capture_output=True, text=True,
        env={"GPUPLAT": GPUPLAT, "PATH": "/usr/bin:/bin"}, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "not a revision" in bad.stderr


def test_the_policy_report_writes_valid_sarif_and_junit(tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = subprocess.run(
        [str(SCRIPTS / "policy-report.sh"), str(out)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, env={"GPUPLAT": GPUPLAT, "PATH": "/usr/bin:/bin"},
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    schema = json.loads((UPSTREAM / "sarif" / "sarif-schema-2.1.0.json").read_text())
    jsonschema.validate(json.loads((out / "gpuplat.sarif").read_text()), schema)
    assert (out / "gpuplat-junit.xml").read_text().startswith("<?xml")


def _actions_used() -> set[str]:
    """Every `uses:` of the example workflows' steps."""
    used = set()
    for workflow in (PROJECT_ROOT / "examples" / "ci" / "github").glob("*.yml"):
        for job in yaml.safe_load(workflow.read_text())["jobs"].values():
            used |= {step["uses"] for step in job.get("steps", []) if "uses" in step}
    return used


def test_every_action_the_workflows_use_runs_on_a_runtime_github_still_offers() -> None:
    """GitHub's runners dropped node20 (tests/data/github_action_runtimes.yaml, with each action's source):
    a workflow copied with an action still on it stops at that step."""
    facts = yaml.safe_load((PROJECT_ROOT / "tests" / "data" / "github_action_runtimes.yaml").read_text())
    runtime = {entry["uses"]: entry["runtime"] for entry in facts["actions"]}
    used = _actions_used()
    assert used, "no workflow steps found"
    unknown = sorted(used - set(runtime))
    assert not unknown, f"add these actions' runtimes (runs.using at the tag) to the data: {unknown}"
    stale = sorted(action for action in used if runtime[action] in facts["removed_runtimes"])
    assert not stale, f"on a runtime GitHub removed: {[(a, runtime[a]) for a in stale]}"


@pytest.mark.parametrize("verdict", [0, 1, 2])
def test_the_policy_report_exits_with_the_checks_verdict(tmp_path: Path, verdict: int) -> None:
    """CI fails the job on the script's exit code: 1 where a mandatory rule is broken, 2 on bad input, from
    one check run that writes both reports (the code scanning and test report uploads run on failure too)."""
    calls = tmp_path / "calls"
    fake = tmp_path / "gpuplat"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\necho "report of $*"\nexit {verdict}\n')
    fake.chmod(0o755)
    out = tmp_path / "report"
    done = subprocess.run(
        [str(SCRIPTS / "policy-report.sh"), str(out), "policy.yaml"],
        cwd=tmp_path, capture_output=True, text=True, env={"GPUPLAT": str(fake), "PATH": "/usr/bin:/bin"},
        check=False,
    )  # fmt: skip
    assert done.returncode == verdict, done.stderr
    assert calls.read_text().splitlines() == [
        f"check --all --sarif {out}/gpuplat.sarif --junit {out}/gpuplat-junit.xml --policy-config policy.yaml"
    ]
    assert "report of check --all" in done.stderr  # the text report goes to the job's log
    assert f"no {out}/gpuplat.sarif (gpuplat exited {verdict} before checking any stack)" in done.stderr
    assert f"(verdict {verdict})" in done.stderr


def _one_bad_one_failing(stacks: Path) -> None:
    document = yaml.safe_load(stack_file("onprem").read_text())
    document["config"]["gpu-platform:platform"]["budget"]["max_gpus"] = 8
    (stacks / "Pulumi.onprem.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    platform = document["config"]["gpu-platform:platform"]
    platform["name"] = "typo"
    platform["budgett"] = platform.pop("budget")
    (stacks / "Pulumi.typo.yaml").write_text(yaml.safe_dump(document, sort_keys=False))


def test_one_bad_stack_is_one_error_and_the_failing_stack_keeps_its_results(tmp_path: Path) -> None:
    """A directory with a typo'd stack file beside a stack that breaks a mandatory rule: the SARIF holds the
    failing stack's finding and one error for the bad file, the JUnit one errored case for it and the
    failing stack's failed case, both whole; the exit is 2 (bad input), from one check run."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    _one_bad_one_failing(stacks)
    environment = {
        "GPUPLAT": GPUPLAT,
        "PATH": "/usr/bin:/bin",
        "GPUPLAT_STACKS_DIR": str(stacks),
        "NO_COLOR": "1",
    }
    done = subprocess.run(
        [str(SCRIPTS / "policy-report.sh"), "report"], cwd=tmp_path, capture_output=True, text=True,
        env=environment, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("budgett: unknown key") == 1  # said once, not once per format
    document = json.loads((tmp_path / "report" / "gpuplat.sarif").read_text())
    jsonschema.validate(document, json.loads((UPSTREAM / "sarif" / "sarif-schema-2.1.0.json").read_text()))
    results = {(r["ruleId"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]) for r in
               document["runs"][0]["results"]}  # fmt: skip
    assert results == {
        ("budget-gpus", "stacks/Pulumi.onprem.yaml"),
        ("stack-file-valid", "stacks/Pulumi.typo.yaml"),
    }
    suites = {
        s.get("name"): s for s in ET.fromstring((tmp_path / "report" / "gpuplat-junit.xml").read_text())
    }
    assert suites["policy typo"].get("errors") == "1" and suites["policy typo"].get("tests") == "1"
    error = suites["policy typo"].find("testcase/error")
    assert error is not None and "budgett" in error.get("message", "")
    assert suites["policy onprem"].get("failures") == "1"


def _gitlab_jobs() -> dict[str, dict[str, object]]:
    document = yaml.safe_load((PROJECT_ROOT / "examples" / "ci" / "gitlab" / ".gitlab-ci.yml").read_text())
    return {name: job for name, job in document.items() if isinstance(job, dict) and "script" in job}


def _flat(script: object) -> list[str]:
    """A GitLab script with its nested anchors flattened, as GitLab runs it."""
    if isinstance(script, list):
        return [line for item in script for line in _flat(item)]
    return [str(script)]


def test_every_gitlab_job_with_an_id_token_exchanges_it_and_has_the_tools() -> None:
    """A job that asks GitLab for an AWS ID token hands it to the SDKs' web-identity provider (and proves
    the exchange before anything else runs); the AWS CLI and the Session Manager plugin are installed."""
    jobs = _gitlab_jobs()
    with_token = [name for name, job in jobs.items() if "id_tokens" in job]
    assert set(with_token) == {"preview", "apply"}
    for name in with_token:
        job = jobs[name]
        lines = _flat(job["script"])
        assert job["variables"]["AWS_ROLE_ARN"].startswith("$PLATFORM_")  # type: ignore[index]
        exchange = next(i for i, line in enumerate(lines) if "AWS_WEB_IDENTITY_TOKEN_FILE=" in line)
        proof = next(i for i, line in enumerate(lines) if line.startswith("aws sts get-caller-identity"))
        deploy = next(i for i, line in enumerate(lines) if line.startswith(("pulumi preview", "gpuplat up")))
        assert exchange < proof < deploy
        assert any("awscli-exe-linux" in line for line in lines)
        assert any("session-manager-plugin" in line for line in lines)


def test_every_example_makes_the_virtualenv_pulumi_yaml_names() -> None:
    """Pulumi.yaml runs the program in `.venv`, as does the policy pack: each job that installs gpuplat
    installs it there."""
    assert "virtualenv: .venv" in (PROJECT_ROOT / "Pulumi.yaml").read_text()
    for name, job in _gitlab_jobs().items():
        lines = _flat(job["script"])
        if any("pip install" in line for line in lines):
            assert "python -m venv .venv" in lines, name
            assert all(".venv/bin/python -m pip" in line for line in lines if "pip install" in line), name
    for workflow in (PROJECT_ROOT / "examples" / "ci" / "github").glob("*.yml"):
        for job in yaml.safe_load(workflow.read_text())["jobs"].values():
            runs = [str(step.get("run", "")) for step in job["steps"]]
            installs = [run for run in runs if "pip install" in run]
            for run in installs:
                assert "python -m venv .venv" in run and ".venv/bin/python -m pip install" in run, workflow
