"""The model-server role's check of what `gpuplat serve` holds on a node before a converge changes it
(roles/inference_server files/gpuplat_replica_loan.py, run by tasks/loan.yml): a replica lent to a canary is
left alone, a layout that would put a replica on GPUs a canary runs on is refused with one paragraph, and
replicas past the layout are retired, and a replica the layout adds serves what its peers serve. Node files
written as release.py writes them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from infra.serving.registry.mlflow import ModelVersion, to_wire_source
from infra.serving.release import BORROW_MARK, VERSION_MARK, version_environment

PROGRAM = Path(__file__).resolve().parents[2] / "roles/inference_server/files/gpuplat_replica_loan.py"


def program() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpuplat_replica_loan", PROGRAM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def node(folder: Path, replicas: int, canary: str | None = None, spare: str = "") -> Path:
    """/etc/gpuplat-inference of an 8-GPU node: `replicas` replicas of one GPU each, the canary slot's env
    file (with a spare group where given), and the canary's version file where given."""
    for number in range(replicas):
        (folder / f"replica-{number}.env").write_text(
            f"GPUPLAT_INFERENCE_PORT={8000 + number}\nCUDA_VISIBLE_DEVICES={number}\n"
        )
    (folder / "replica-canary.env").write_text(
        "GPUPLAT_INFERENCE_PORT=8100\n" + (f"CUDA_VISIBLE_DEVICES={spare}\n" if spare else "")
    )
    if canary is not None:
        (folder / "version-canary.env").write_text(canary)
    return folder


def loan(replica: int, gpus: str) -> str:
    """The canary's version file a borrowing canary's deploy writes (release.py _write_version)."""
    version = ModelVersion("embedder", 3, to_wire_source("/shared/models/embedder/3"), "READY")
    return version_environment(version, "vllm") + f"{BORROW_MARK}{replica}\nCUDA_VISIBLE_DEVICES={gpus}\n"


def check(folder: Path, replicas: int, canary_gpus: str = "") -> dict[str, object]:
    """The program's answer for a layout of `replicas` one-GPU replicas, as the role calls it."""
    gpus = [str(number) for number in range(replicas)]
    arguments = [
        "--config-dir", str(folder), "--version-mark", VERSION_MARK, "--loan-mark", BORROW_MARK,
        "--node", "gpu-21", "--replicas", str(replicas), "--replica-gpus", json.dumps(gpus),
        "--canary-gpus", canary_gpus,
    ]  # fmt: skip
    module = program()
    answer: dict[str, object] = module.plan(
        folder, module.Marks(VERSION_MARK, BORROW_MARK), "gpu-21", replicas, gpus, canary_gpus
    )
    assert module.main(arguments) == 0
    return answer


def test_a_node_without_a_canary_keeps_every_replica(tmp_path: Path) -> None:
    assert check(node(tmp_path, 8), 8) == {"lent": [], "retire": [], "adopt": [], "forget": [], "problem": ""}


def test_a_first_converge_finds_nothing_held(tmp_path: Path) -> None:
    assert check(tmp_path / "absent", 8) == {
        "lent": [],
        "retire": [],
        "adopt": [],
        "forget": [],
        "problem": "",
    }


def test_the_lent_replica_is_left_alone_while_the_layout_stays(tmp_path: Path) -> None:
    answer = check(node(tmp_path, 8, loan(7, "7")), 8)
    assert answer == {"lent": [7], "retire": [], "adopt": [], "forget": [], "problem": ""}


def test_a_loan_record_with_a_trailing_blank_or_carriage_return_is_read(tmp_path: Path) -> None:
    record = loan(7, "7").replace(f"{BORROW_MARK}7\n", f"{BORROW_MARK}7 \r\n")
    assert check(node(tmp_path, 8, record), 8)["lent"] == [7]


@pytest.mark.parametrize("replicas, canary_gpus", [(7, ""), (7, "7")])
def test_fewer_replicas_or_a_switch_to_spare_while_a_replica_is_lent_is_refused(
    tmp_path: Path, replicas: int, canary_gpus: str
) -> None:
    """The lent replica 7 would be past the layout (retired while the canary runs on its GPUs), or its GPU
    given to the spare canary slot while the borrowing canary holds it."""
    answer = check(node(tmp_path, 8, loan(7, "7")), replicas, canary_gpus)
    problem = str(answer["problem"])
    assert "gpu-21 runs the canary embedder@3" in problem and "replica 7's GPUs (7)" in problem, problem
    assert "`gpuplat serve rollback embedder`" in problem and "Nothing was changed on gpu-21" in problem
    assert ("serving.canary.gpus spare" in problem) == bool(canary_gpus), problem
    assert answer["retire"] == []  # the lent replica is never retired under the canary


def test_a_layout_that_puts_a_replica_on_the_spare_canarys_gpus_is_refused(tmp_path: Path) -> None:
    """A switch from spare to borrow while a spare canary runs: replica 7 would start on GPU 7, where the
    canary runs."""
    answer = check(node(tmp_path, 7, "# gpuplat serve: embedder@3\nGPUPLAT_MODEL_PATH=/m\n", spare="7"), 8)
    assert "replica 7 would start on GPU(s) 7, which the canary runs on" in str(answer["problem"]), answer


def test_replicas_past_the_layout_are_retired_where_no_canary_runs(tmp_path: Path) -> None:
    """A switch from borrow to spare (8 replicas to 7) with no release under way: replica 7 goes."""
    answer = check(node(tmp_path, 8), 7, canary_gpus="7")
    assert answer == {"lent": [], "retire": [7], "adopt": [], "forget": [], "problem": ""}


def promoted(folder: Path, replicas: range, version: int = 3) -> Path:
    """Each of `replicas` serving embedder@`version`, as a promote leaves them (release.py's version file)."""
    source = to_wire_source(f"/shared/models/embedder/{version}")
    text = version_environment(ModelVersion("embedder", version, source, "READY"), "vllm")
    for number in replicas:
        (folder / f"version-{number}.env").write_text(text)
    return folder


def test_a_replica_the_layout_adds_takes_the_version_its_peers_serve(tmp_path: Path) -> None:
    """Borrow -> spare -> borrow (7 replicas back to 8) after a promote: replica 7 starts on the champion
    its peers serve, from replica 0's version file, not on the stack's own model."""
    folder = promoted(node(tmp_path, 7), range(7))
    assert check(folder, 8) == {"lent": [], "retire": [], "adopt": [[7, 0]], "forget": [], "problem": ""}


def test_a_replica_the_layout_adds_beside_peers_on_the_stacks_own_model_takes_nothing(tmp_path: Path) -> None:
    assert check(node(tmp_path, 2), 4)["adopt"] == []


def test_a_replica_added_while_the_peers_serve_different_versions_is_refused(tmp_path: Path) -> None:
    """A promote that failed half-way (replica 0 on embedder@4, the rest on @3): which one the added replica
    should serve is the release's to say, not the converge's."""
    folder = promoted(promoted(node(tmp_path, 3), range(1, 3)), range(1), version=4)
    answer = check(folder, 4)
    problem = str(answer["problem"])
    assert answer["adopt"] == [] and "replica 0: embedder@4, replica 1: embedder@3" in problem, problem
    assert "adds replica(s) 3" in problem and "Nothing was changed on gpu-21" in problem, problem
    assert "`gpuplat serve rollback embedder`" in problem, problem
    assert check(folder, 3)["problem"] == ""  # the same node, nothing added: no refusal


def test_replica_gpus_that_are_not_a_json_list_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        program().main(
            ["--config-dir", str(tmp_path), "--version-mark", "x", "--loan-mark", "y", "--node", "n",
             "--replicas", "1", "--replica-gpus", "0,1"]
        )  # fmt: skip
    assert exited.value.code == 2
    assert "--replica-gpus is a JSON list of each replica's GPUs, not '0,1'" in capsys.readouterr().err


def test_a_replica_the_layout_adds_beside_peers_on_the_stacks_own_model_loses_a_stale_version_file(
    tmp_path: Path,
) -> None:
    """A retire killed between its two removals (replica-3.env gone, version-3.env left, naming @3), the
    peers since rolled back to the stack's own model: the layout grown back must not start replica 3 on
    the stale version, which nothing else would remove (the unit reads version-3.env)."""
    folder = promoted(node(tmp_path, 3), range(3, 4))
    answer = check(folder, 4)
    assert answer["adopt"] == [] and answer["forget"] == [3] and answer["problem"] == "", answer
    # Peers on a champion: the added replica takes theirs over the stale file (adopt), nothing to forget.
    assert check(promoted(folder, range(3)), 4) == {
        "lent": [],
        "retire": [],
        "adopt": [[3, 0]],
        "forget": [],
        "problem": "",
    }


def marks_answer(
    folder: Path, textfile_dir: Path, replicas: int, capsys: pytest.CaptureFixture[str]
) -> object:
    """The program's whole answer with the textfile collector's directory, as loan.yml calls it."""
    gpus = json.dumps([str(number) for number in range(replicas)])
    arguments = [
        "--config-dir", str(folder), "--version-mark", VERSION_MARK, "--loan-mark", BORROW_MARK,
        "--node", "gpu-21", "--replicas", str(replicas), "--replica-gpus", gpus,
        "--textfile-dir", str(textfile_dir), "--stopped-file", "gpuplat-inference-replica-%s.prom",
    ]  # fmt: skip
    capsys.readouterr()
    assert program().main(arguments) == 0
    return json.loads(capsys.readouterr().out)


def test_the_role_unmarks_the_replicas_it_starts_but_not_the_lent_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Marks for replicas 1 (lent: it stays marked, stopped), 2 (a loan given back by a command killed before
    it removed the mark) and 9 (retired, past the layout): only 2, which the role starts, loses it."""
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    for replica in (1, 2, 9):
        (textfile / f"gpuplat-inference-replica-{replica}.prom").write_text("x 1\n")
    folder = tmp_path / "etc"
    folder.mkdir()
    answer = marks_answer(node(folder, 4, loan(1, "1")), textfile, 4, capsys)
    assert answer == {
        "lent": [1], "retire": [], "adopt": [], "forget": [], "problem": "", "marking": True, "unmark": [2]
    }  # fmt: skip
    assert marks_answer(folder, tmp_path / "absent", 4, capsys) == {**answer, "marking": False, "unmark": []}
