"""The gateway's canary program (roles/inference_gateway/files/gpuplat_gateway_canary.py): the version map
for a share and the entries a change sets. Against HAProxy itself, through `gpuplat serve`:
tests/serving/test_serve.py."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.nodes.role_templates import role_vars
from tests.conftest import load_script

FILES = Path(__file__).resolve().parents[2] / "roles" / "inference_gateway" / "files"


@pytest.fixture(scope="module")
def canary() -> ModuleType:
    sys.path.insert(0, str(FILES))  # it imports the runtime API client of gpuplat_gateway_targets.py
    try:
        return load_script(FILES / "gpuplat_gateway_canary.py")
    finally:
        sys.path.remove(str(FILES))


@given(percent=st.integers(min_value=0, max_value=100))
def test_the_version_map_gives_the_canary_its_share_of_draws(canary: ModuleType, percent: int) -> None:
    entries = canary.version_map(percent)
    assert sorted(entries) == list(range(canary.DRAWS))
    assert sum(backend == canary.CANARY for backend in entries.values()) == percent


def test_moving_the_share_sets_only_the_draws_that_change(canary: ModuleType) -> None:
    at_20 = canary.version_map(20)
    assert canary.map_changes(at_20, canary.version_map(25)) == [(d, canary.CANARY) for d in range(20, 25)]
    assert canary.map_changes(at_20, at_20) == []
    assert canary.map_changes(at_20, canary.version_map(0)) == [(d, canary.STABLE) for d in range(20)]


def test_a_share_is_a_whole_percentage(canary: ModuleType) -> None:
    with pytest.raises(ValueError, match="0 to 100"):
        canary.version_map(101)


def test_show_map_lines_are_read_by_key(canary: ModuleType) -> None:
    text = "0x5581c1a0e2d0 0 inference_canary\n0x5581c1a0e310 1 inference\n\n"
    assert canary.parse_map(text) == {0: "inference_canary", 1: "inference"}


class FakeApi:
    """HAProxy's runtime API as the canary program uses it: `show map`, `set map` and `show stat` of the
    two versions' backends. `refuse` answers `set map` with an error; `canary_status` is the status of the
    canary's one server."""

    def __init__(
        self,
        entries: dict[int, str],
        canary_status: str = "UP",
        refuse: str = "",
        map_file: Path | None = None,
    ) -> None:
        self.entries = dict(entries)
        self.canary_status = canary_status
        self.refuse = refuse
        self.map_file = map_file
        self.sets: list[str] = []
        self.canary_backend = True  # False: HAProxy has no such backend (a configuration without a canary)

    def send(self, command: str) -> str:
        words = command.split()
        if self.map_file is not None and words[1:2] == ["map"]:
            assert words[2] == str(self.map_file), command
        if words[:2] == ["show", "map"]:
            return (
                "".join(f"0x55{draw:04x} {draw} {backend}\n" for draw, backend in self.entries.items()) + "\n"
            )
        if words[:2] == ["set", "map"]:
            self.sets.append(command)
            if self.refuse:
                return self.refuse + "\n"
            self.entries[int(words[3])] = words[4]
            return "\n"
        raise AssertionError(f"unexpected command {command!r}")

    def stats(self, backend: str) -> dict[str, dict[str, str]]:
        rows = {
            "inference": {
                "FRONTEND": {"status": "OPEN", "stot": "0"},
                "BACKEND": {
                    "status": "UP",
                    "stot": "900",
                    "hrsp_4xx": "4",
                    "hrsp_5xx": "9",
                    "cli_abrt": "2",
                    "srv_abrt": "1",
                },
                "infer-1": {"status": "UP"},
                "slot-2": {"status": "UP 1/3"},  # going down, still taking requests
                "slot-3": {"status": "MAINT"},
            },
            "inference_canary": {
                "BACKEND": {"status": "UP" if self.canary_status.startswith("UP") else "DOWN", "stot": "100"},
                "canary-1": {"status": self.canary_status, "hrsp_5xx": "50"},
            },
        }
        if backend == "inference_canary" and not self.canary_backend:
            return {}
        return rows[backend]


def _map_file(tmp_path: Path, canary: ModuleType, percent: int) -> Path:
    path = tmp_path / "gpuplat-versions.map"
    path.write_text("".join(f"{d} {b}\n" for d, b in sorted(canary.version_map(percent).items())))
    return path


def test_a_share_moves_only_its_draws_at_haproxy_and_in_the_map_file(
    canary: ModuleType, tmp_path: Path
) -> None:
    map_file = _map_file(tmp_path, canary, 0)
    api = FakeApi(canary.version_map(0))
    result = canary.share(api, map_file, 3)
    assert api.sets == [f"set map {map_file} {d} inference_canary" for d in range(3)]
    assert map_file.read_text() == "".join(
        f"{d} {'inference_canary' if d < 3 else 'inference'}\n" for d in range(100)
    )
    assert map_file.stat().st_mode & 0o777 == 0o644  # HAProxy reads it after dropping privileges
    assert [p.name for p in tmp_path.iterdir()] == [map_file.name]  # no temporary file left beside it
    assert result == {
        "canary_percent": 3,
        "backends": {
            "inference": {"requests": 900, "errors": 16, "errors_5xx": 9, "servers_up": 2},
            "inference_canary": {"requests": 100, "errors": 0, "errors_5xx": 0, "servers_up": 1},
        },
    }


@pytest.mark.parametrize("status", ["DOWN", "MAINT", "NOLB", "no check"])
def test_no_share_while_no_canary_server_is_up(canary: ModuleType, tmp_path: Path, status: str) -> None:
    """The refusal: a share sent to a backend whose servers are all down would fail those requests."""
    map_file = _map_file(tmp_path, canary, 0)
    before = map_file.read_text()
    api = FakeApi(canary.version_map(0), canary_status=status)
    with pytest.raises(canary.RuntimeApiError, match="no server of backend inference_canary is up"):
        canary.share(api, map_file, 1)
    assert api.sets == [] and map_file.read_text() == before
    # Taking the share back to 0 needs no canary: it is how a rollback ends.
    api.entries = canary.version_map(10)
    canary.share(api, map_file, 0)
    assert api.entries == canary.version_map(0)


def test_a_set_haproxy_refuses_stops_the_share_before_the_file(canary: ModuleType, tmp_path: Path) -> None:
    map_file = _map_file(tmp_path, canary, 0)
    before = map_file.read_text()
    api = FakeApi(canary.version_map(0), refuse="entry not found.")
    with pytest.raises(canary.RuntimeApiError) as refused:
        canary.share(api, map_file, 5)
    assert str(refused.value) == f"HAProxy refused 'set map {map_file} 0 inference_canary': entry not found."
    assert len(api.sets) == 1 and map_file.read_text() == before


def test_the_program_answers_json_and_exits_2_when_refused(
    canary: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    map_file = _map_file(tmp_path, canary, 0)
    api = FakeApi(canary.version_map(0), map_file=map_file)
    sockets: list[str] = []
    monkeypatch.setattr(canary, "RuntimeApi", lambda path: sockets.append(path) or api)
    assert canary.main(["--socket", "/tmp/s.sock", "--map", str(map_file), "share", "2"]) == 0
    assert sockets == ["/tmp/s.sock"]
    out = capsys.readouterr().out
    assert (
        out == json.dumps(json.loads(out), sort_keys=True) + "\n" and json.loads(out)["canary_percent"] == 2
    )
    assert canary.main(["--map", str(map_file), "show"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["canary_percent"] == 2 and shown["backends"]["inference_canary"]["servers_up"] == 1
    api.canary_status = "DOWN"
    caplog.set_level(logging.ERROR)
    assert canary.main(["--map", str(map_file), "share", "4"]) == 2
    assert canary.main(["--map", str(map_file), "share", "101"]) == 2
    assert capsys.readouterr().out == ""  # nothing printed as if done
    assert [r.getMessage() for r in caplog.records] == [
        "no server of backend inference_canary is up: deploy the canary's model servers "
        "(inference_gateway_canary_servers) and let their health checks pass before giving them a share",
        "a canary share is a whole percentage from 0 to 100, not 101",
    ]


def test_4xx_and_aborted_answers_are_failed_answers_never_more_than_the_requests(canary: ModuleType) -> None:
    """A version answering 4xx, or cutting its answers off, fails as a 5xx does; a 5xx cut off mid-answer
    (counted in two fields) never makes more failures than requests."""
    api = FakeApi(canary.version_map(0))
    assert canary.backend_figures(api)["inference"]["errors"] == 4 + 9 + 2 + 1
    stats = api.stats

    def cut_off(backend: str) -> dict[str, dict[str, str]]:
        rows = stats(backend)
        rows["BACKEND"] = {**rows["BACKEND"], "stot": "10", "hrsp_5xx": "10", "srv_abrt": "10"}
        return rows

    api.stats = cut_off  # type: ignore[method-assign]
    assert canary.backend_figures(api)["inference"]["errors"] == 10


def test_a_gateway_without_a_canary_backend_has_nothing_up_there(canary: ModuleType, tmp_path: Path) -> None:
    api = FakeApi(canary.version_map(0))
    api.canary_backend = False
    assert canary.backend_figures(api)["inference_canary"] == {
        "requests": 0,
        "errors": 0,
        "errors_5xx": 0,
        "servers_up": 0,
    }
    with pytest.raises(canary.RuntimeApiError, match="no server of backend inference_canary is up"):
        canary.share(api, _map_file(tmp_path, canary, 0), 5)


def test_the_map_file_is_replaced_whole(
    canary: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written beside the map under a hidden name, then renamed over it: a reload never reads half a map,
    and the rename stays on the map's file system."""
    map_file = _map_file(tmp_path, canary, 0)
    replaced: list[tuple[Path, Path]] = []
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: replaced.append((Path(a), Path(b))) or replace(a, b))
    canary.share(FakeApi(canary.version_map(0), map_file=map_file), map_file, 1)
    ((temporary, target),) = replaced
    assert target == map_file and temporary.parent == map_file.parent
    assert temporary.name.startswith(".gpuplat-versions.map.")


def test_the_programs_usage(canary: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as shown:
        canary.parse_args(["--help"])
    usage = capsys.readouterr().out
    assert shown.value.code == 0
    assert usage.startswith("usage: gpuplat_gateway_canary.py [-h] [--socket SOCKET] [--map MAP]")
    assert "A canary release's share of the requests at the inference gateway" in usage
    assert "HAProxy's admin stats socket" in usage and "give the canary PERCENT of the requests" in usage
    assert "the share and each version's requests and errors (JSON)" in usage
    with pytest.raises(SystemExit) as missing:
        canary.parse_args([])
    assert (
        missing.value.code == 2 and "the following arguments are required: command" in capsys.readouterr().err
    )


def test_the_program_fails_with_exit_2_when_haproxy_is_not_there(
    canary: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    missing = str(tmp_path / "no.sock")
    # The real client, without its wait for a restarting HAProxy's socket to come back.
    client = canary.RuntimeApi
    monkeypatch.setattr(canary, "RuntimeApi", lambda path: client(path, connect_wait_s=0))
    assert canary.main(["--socket", missing, "--map", str(tmp_path / "m.map"), "show"]) == 2
    (record,) = caplog.records
    assert record.getMessage() == f"HAProxy's runtime API at {missing}: [Errno 2] No such file or directory"


def test_the_defaults_are_where_the_role_puts_the_socket_and_the_map(canary: ModuleType) -> None:
    """`gpuplat serve` runs `gpuplat_gateway_canary.py share N` on the gateways without --socket or --map."""
    gateway = role_vars("inference_gateway")
    arguments = canary.parse_args(["show"])
    assert arguments.socket == gateway["__inference_gateway_admin_socket"]
    assert str(arguments.map) == gateway["__inference_gateway_version_map"]
    assert gateway["__inference_gateway_canary_backend"] == canary.CANARY
