"""The training_env role's environment on the shared filesystem, run for real by ansible-playbook on
this host: made when missing, left alone when whole, made again when an earlier run left it without a
working pip (the shared filesystem outlives the machine that was installing it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
pytest.importorskip("ansible")

ROOT = Path(__file__).resolve().parents[2]


def _converge(tmp_path: Path, environment: Path) -> int:
    """Run the role's environment tasks on localhost; the number of tasks that changed."""
    from infra.nodes.playbook_run import ansible_playbook_binary, parse_recap

    play = [
        {
            "name": "The training environment's directory",
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Make or repair it",
                    "ansible.builtin.include_role": {"name": "training_env", "tasks_from": "environment"},
                    "vars": {"training_env_path": str(environment)},
                }
            ],
        }
    ]
    playbook = tmp_path / "environment.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    command = [ansible_playbook_binary(), "-i", "localhost,", "-c", "local", str(playbook)]
    command += ["-e", f"ansible_python_interpreter={sys.executable}"]
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=300, cwd=ROOT,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return parse_recap(done.stdout)[0]


def _pip_runs(environment: Path) -> bool:
    probe = [str(environment / "bin" / "python"), "-m", "pip", "--version"]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


@pytest.mark.processes
@pytest.mark.long
def test_an_environment_left_without_pip_is_made_again_and_a_whole_one_is_left_alone(tmp_path: Path) -> None:
    environment = tmp_path / "shared" / "envs" / "torch"
    assert _converge(tmp_path, environment) == 1
    assert _pip_runs(environment)

    kept = environment / "kept-by-a-whole-environment"
    kept.write_text("")
    assert _converge(tmp_path, environment) == 0
    assert kept.exists()

    [pip] = environment.glob("lib/python3*/site-packages/pip")
    subprocess.run(["rm", "-rf", str(pip)], check=True)
    assert (environment / "bin" / "pip").exists() and not _pip_runs(environment)
    assert _converge(tmp_path, environment) == 1
    assert _pip_runs(environment)
    assert not kept.exists()
