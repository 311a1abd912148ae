"""tests/docs_session.py: a page's console blocks run in one shell, in turn; a command that fails ends
the session there."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.docs_commands import Block, blocks_of
from tests.docs_session import Session


def _blocks(tmp_path: Path, *bodies: str) -> list[Block]:
    marked = "<!-- gpuplat:run local b{} -->\n```console\n{}```\n\n"
    text = "".join(marked.format(i, body) for i, body in enumerate(bodies))
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    return blocks_of(page)


def _env() -> dict[str, str]:
    return {"PATH": os.environ["PATH"]}


def test_what_one_block_sets_the_next_one_has(tmp_path: Path) -> None:
    first, second = _blocks(
        tmp_path,
        "$ job=$(echo 42)\n$ cd sub\n$ echo \"$job\"; printf 'no newline'\n42\n",
        '$ echo "job $job in $(basename "$PWD")" >&2\n$ cat\n',
    )
    (tmp_path / "sub").mkdir()
    with Session(tmp_path, _env()) as session:
        ran = session.run(first)
        assert ran.ok, ran.report()
        assert [r.output for r in ran.ran] == ["", "", "42\nno newline"]
        then = session.run(second, timeout=20)  # `cat` reads /dev/null, not the shell's commands
        assert then.ok, then.report()
        assert then.output(0) == "job 42 in sub\n" and then.output(1) == ""


def test_a_failing_command_fails_its_block_and_ends_the_session(tmp_path: Path) -> None:
    broken, after = _blocks(
        tmp_path,
        '$ echo before\n$ for x in 1 2; do false; echo "$x"; done\n$ echo never\n',
        "$ echo after\n",
    )
    with Session(tmp_path, _env()) as session:
        ran = session.run(broken)
        assert not ran.ok
        assert [r.status for r in ran.ran] == [0, 1]  # -e: the loop's first `false` ends it
        assert "for x in 1 2" in ran.report() and "(exit 1)" in ran.report()
        assert not session.run(after).ok  # nothing runs after the failure
    (piped,) = _blocks(tmp_path, "$ false | true\n")
    with Session(tmp_path, _env()) as session:
        assert not session.run(piped).ok  # pipefail


def test_a_command_past_the_time_fails_and_what_runs_in_the_background_is_killed(tmp_path: Path) -> None:
    (block,) = _blocks(tmp_path, "$ (sleep 300; touch late) &\n$ echo $! > pid\n$ sleep 30\n")
    with Session(tmp_path, _env()) as session:
        started = time.monotonic()
        ran = session.run(block, timeout=2)
        assert not ran.ok and ran.ran[-1].status is None and time.monotonic() - started < 15
    background = int((tmp_path / "pid").read_text())
    time.sleep(0.2)
    stat = Path(f"/proc/{background}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z", "left running"


def test_a_process_sent_to_the_background_runs_until_a_later_command_stops_it(tmp_path: Path) -> None:
    """The loop page's guard step: traffic in the background (`&`), the guard, then `kill $!`."""
    (block,) = _blocks(
        tmp_path,
        "$ while sleep 0.1; do echo tick >> ticks; done &\n$ sleep 1; wc -l < ticks\n$ kill $!\n"
        '$ sleep 0.5; a=$(wc -l < ticks); sleep 0.5; b=$(wc -l < ticks); [ "$a" = "$b" ] && echo stopped\n',
    )
    with Session(tmp_path, _env()) as session:
        ran = session.run(block, timeout=30)
    assert ran.ok, ran.report()
    assert int(ran.output(1)) >= 3 and ran.output(3) == "stopped\n"


def test_a_command_that_fails_where_bash_ignores_e_still_fails_its_block(tmp_path: Path) -> None:
    """`-e` does not end the shell when the failed command is left of `&&` (the loop page's first command,
    `make_pairs.py ... > pairs.jsonl && wc -l pairs.jsonl`) or negated with `!`; the user sees it fail.
    Nor does a command that closes the terminal (`exit 0`) count as run."""
    for failing in ("false && echo unseen", "! true", "exit 0"):
        broken, after = _blocks(tmp_path, f"$ echo before\n$ {failing}\n$ echo never\n", "$ echo after\n")
        with Session(tmp_path, _env()) as session:
            ran = session.run(broken, timeout=20)
            assert not ran.ok, (failing, ran.report())
            assert [r.command for r in ran.ran] == ["echo before", failing], ran.report()
            assert ran.ran[-1].status not in (0, None), ran.report()
            assert not session.run(after, timeout=20).ok, failing  # nothing runs after the failure
