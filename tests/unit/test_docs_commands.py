"""The marks on the manual's shell blocks (tests/docs_commands.py): what is extracted, what is refused,
and that the marked blocks of the shipped pages are shell the integration tier can run."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from tests.docs_commands import MARK, ROOT, MarkError, blocks_of, marked_blocks, named_block, submitted_jobs


def _page(tmp_path: Path, text: str, name: str = "page.md") -> Path:
    page = tmp_path / name
    page.write_text(text, encoding="utf-8")
    return page


def test_only_marked_blocks_are_taken_whole_and_in_order(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        f"# Title\n\n```\nnot marked\n```\n\n{MARK}\n```\ngpuplat status --stack local\n"
        "podman exec gpuplat-local-head-0 \\\n  sinfo\n```\n\ntext\n\n"
        f"{MARK}\n```bash\n# a comment\necho two\n```\n",
    )
    blocks = blocks_of(page)
    assert [block.text for block in blocks] == [
        "gpuplat status --stack local\npodman exec gpuplat-local-head-0 \\\n  sinfo\n",
        "# a comment\necho two\n",
    ]
    assert [block.line for block in blocks] == [7, 16]


def test_a_block_repeated_on_another_page_runs_once(tmp_path: Path) -> None:
    block = f"{MARK}\n```\necho same\n```\n"
    first = _page(tmp_path, block, "a.md")
    second = _page(tmp_path, f"intro\n\n{block}{MARK}\n```\necho other\n```\n", "b.md")
    taken = marked_blocks([first, second])
    assert [(b.page.name, b.text) for b in taken] == [("a.md", "echo same\n"), ("b.md", "echo other\n")]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (f"{MARK}\n\n```\necho x\n```\n", "must be followed by a ```, ```bash or ```console fence"),
        (f"{MARK}\n```text\n$ echo x\n```\n", "must be followed by a ```, ```bash or ```console fence"),
        (f"{MARK}\n```console\nx\n$ echo x\n```\n", r"starts with a command \(`\$ \.\.\.`\), not `x`"),
        (f"{MARK}\n```console\n$ echo x \\\n```\n", "last command ends with a `\\\\`"),
        (f"{MARK}\n```\necho x\n", "has no closing ```"),
        (f"{MARK}\n```\n\n```\n", "is empty"),
    ],
    ids=[
        "blank line",
        "text block",
        "console output first",
        "console continued past its end",
        "unclosed",
        "empty",
    ],
)
def test_a_mark_that_names_no_runnable_block_is_refused(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(MarkError, match=problem):
        blocks_of(_page(tmp_path, text))


def test_the_shipped_pages_mark_the_tour_and_their_blocks_are_shell() -> None:
    blocks = marked_blocks()
    assert any("sbatch" in block.text for block in blocks), [b.where for b in blocks]
    assert any(block.where.startswith("README.md") for block in blocks)
    for block in blocks:
        parsed = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True, check=False)
        assert parsed.returncode == 0, (block.where, parsed.stderr)
        # A TTY the integration tier (and CI) does not have; the commands marked need none.
        assert " -it " not in block.text and " -ti " not in block.text, block.where


def test_a_named_block_is_handed_to_its_test_alone(tmp_path: Path) -> None:
    named = "<!-- gpuplat:run local validate -->\n```\ngpuplat validate --stack local\n```\n"
    page = _page(tmp_path, f"{named}\n{MARK}\n```\necho plain\n```\n")
    assert named_block("validate", [page]).text == "gpuplat validate --stack local\n"
    assert [block.name for block in marked_blocks([page])] == ["validate", None]
    with pytest.raises(MarkError, match="one block is marked for 'scale'"):
        named_block("scale", [page])
    other = named.replace("--stack local", "--stack local --json")
    twice = _page(tmp_path, f"{named}\n{other}", "twice.md")
    with pytest.raises(MarkError, match=r"distinct blocks found: .*twice\.md:1, .*twice\.md:6"):
        named_block("validate", [twice])


@pytest.mark.parametrize(
    "line",
    ["<!-- gpuplat:run locale -->", "<!--gpuplat:run local-->", f"Run this: {MARK}"],
    ids=["misspelt", "unspaced", "inside a paragraph"],  # as `code` in prose it is text (developing.md)
)
def test_a_mark_that_is_not_one_of_its_own_is_refused(tmp_path: Path, line: str) -> None:
    with pytest.raises(MarkError, match="a mark is a line of its own"):
        blocks_of(_page(tmp_path, f"{line}\n```\necho x\n```\n"))


def test_a_mark_shown_inside_another_block_is_text(tmp_path: Path) -> None:
    """An example of marking, in a ```markdown block: neither a mark nor a block to run."""
    example = f"````markdown\n{MARK}\n```\necho example\n```\n````\n"
    page = _page(tmp_path, f"{example}\nprose\n\n{MARK}\n```\necho run\n```\n")
    assert [block.text for block in blocks_of(page)] == ["echo run\n"]


def test_a_marked_block_that_runs_into_another_fence_is_refused(tmp_path: Path) -> None:
    """Its closing fence forgotten: the prose up to the next block's fence would be run as shell."""
    page = _page(tmp_path, f"{MARK}\n```\necho x\n\nSome prose.\n\n```bash\necho y\n```\n")
    with pytest.raises(MarkError, match="holds ````bash` before its closing"):
        blocks_of(page)


def test_every_named_block_of_the_pages_is_asked_for_by_an_integration_test() -> None:
    """A name no test asks for would never run: neither the runner of unnamed blocks nor its test."""
    integration = (ROOT / "tests" / "integration" / "test_local_platform.py").read_text(encoding="utf-8")
    for block in marked_blocks():
        if block.name is not None:
            assert f'named_block("{block.name}")' in integration, block.where


def test_sbatch_submissions_are_read_from_its_own_line() -> None:
    assert submitted_jobs("Submitted batch job 12\nother\nSubmitted batch job 3\n") == [12, 3]
    assert submitted_jobs("sbatch: error: Batch job submission failed\n") == []
    assert submitted_jobs("not Submitted batch job 5\nSubmitted batch job 6 twice\n") == []


def test_a_console_block_is_its_commands_with_the_output_shown_under_each(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        "<!-- gpuplat:run local session -->\n```console\n$ echo one\none\n$ printf '%s\\n' \\\n"
        "  two three\ntwo\nthree\n$ true\n```\n",
    )
    (block,) = blocks_of(page)
    assert block.commands == ["echo one", "printf '%s\\n' \\\n  two three", "true"]
    assert [step.shown for step in block.steps] == ["one", "two\nthree", ""]
    assert block.text == "echo one\nprintf '%s\\n' \\\n  two three\ntrue\n"
    plain = _page(tmp_path, f"{MARK}\n```\necho a\necho b\n```\n", "plain.md")
    assert blocks_of(plain)[0].commands == ["echo a\necho b\n"]  # one script, as the plain runner runs it


def test_the_loop_page_is_run_whole_by_the_loop_test() -> None:
    """Every command docs/loop.md shows (`$ ` lines) is in a console block handed to the integration
    test of the loop, in the page's order; each block's name is asked for by that test."""
    page = ROOT / "docs" / "loop.md"
    lines = page.read_text(encoding="utf-8").splitlines()
    shown = [line.removeprefix("$ ") for line in lines if line.startswith("$ ")]
    blocks = blocks_of(page)
    assert [command for block in blocks for command in block.commands] == shown
    assert all(block.name and block.name.startswith("loop-") and block.steps for block in blocks)
    assert _blocks_the_loop_test_runs() == [block.name for block in blocks], "the page's order, each once"
    users = {"alice": "research", "bob": "product"}
    for user, team in users.items():
        assert any(f"runuser -u {user} -- sbatch --parsable --account {team}" in c for c in shown), user


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("```\npodman exec x false && echo unseen\necho ends well\n```\n", "an && or || list before"),
        ("```\nfalse || echo fine \\\n  anyway\necho ends well\n```\n", "an && or || list before"),
        ("```console\n$ gpuplat validate --stack local || true\n```\n", r"hides a failure \(`\|\| true`\)"),
        ("```bash\nset +e\nfalse\n```\n", r"hides a failure \(`set \+e`\)"),
        ("```console\n$ set +o pipefail\n```\n", r"hides a failure \(`set \+o pipefail`\)"),
        ("```\nfalse || :\n```\n", r"hides a failure \(`\|\| :`\)"),
        ("```bash\n$ gpuplat status --stack local\n```\n", r"is run as a script: a transcript .* ```console"),
        (
            "```console\n$ cat > f <<EOF\nx\nEOF\n```\n",
            "reads a here-document, which a transcript cannot hold",
        ),
    ],
    ids=[
        "&& before the end",
        "|| continued",
        "|| true",
        "set +e",
        "set +o pipefail",
        "|| :",
        "prompt in bash",
        "heredoc in console",
    ],
)
def test_a_marked_command_whose_failure_the_runner_would_not_see_is_refused(
    tmp_path: Path, body: str, problem: str
) -> None:
    """`bash -e` goes on past an && list whose left side failed (the plain runner runs a block whole, so
    only its last line's status counts); `|| true` and `set +e` hide a failure from either runner."""
    with pytest.raises(MarkError, match=problem):
        blocks_of(_page(tmp_path, f"{MARK}\n{body}"))


def test_a_list_that_ends_its_block_or_stands_in_a_console_block_is_run_as_shown(tmp_path: Path) -> None:
    """Where a list's failure is its block's (the script's last line) or its command's (a console step,
    judged by its own status), it is allowed, as are `&&` and `||` inside quotes or comments."""
    page = _page(
        tmp_path,
        f"{MARK}\n```\necho '&& || true' # a && b || true\nmake pairs && wc -l pairs\n```\n\n"
        f"{MARK}\n```console\n$ make pairs && wc -l pairs\n147 pairs\n$ echo next\n```\n",
    )
    assert [block.commands for block in blocks_of(page)] == [
        ["echo '&& || true' # a && b || true\nmake pairs && wc -l pairs\n"],
        ["make pairs && wc -l pairs", "echo next"],
    ]


@pytest.mark.parametrize("page", ["README.md", "docs/training.md", "docs/loop.md"])
def test_every_shell_block_of_the_local_platforms_walkthroughs_is_marked(page: str) -> None:
    """These pages are sessions on the local platform: a fence without a mark there is a command the
    integration tier never runs (the loop page's test above only sees `$ ` lines)."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    opening = [index for index, line in enumerate(lines) if line.startswith("```")][::2]
    marked = {block.line for block in blocks_of(ROOT / page)}  # the mark's line, 1-based: the fence's index
    assert [f"{page}:{index + 1}" for index in opening if index not in marked] == []


def _blocks_the_loop_test_runs() -> list[str]:
    """The names in `step(session, named_block(NAME))` calls of the loop's integration test, in its order
    (code, not text: a call commented out is not a call)."""
    integration = ROOT / "tests" / "integration" / "test_local_platform.py"
    tree = ast.parse(integration.read_text(encoding="utf-8"))
    test = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and node.name == "test_the_loop_two_teams_train_register_and_release"
    )
    steps = [
        call
        for call in ast.walk(test)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "step"
    ]
    named = [
        (asked.lineno, str(asked.args[0].value))
        for call in steps
        for asked in call.args
        if isinstance(asked, ast.Call)
        and isinstance(asked.func, ast.Name)
        and asked.func.id == "named_block"
        and isinstance(asked.args[0], ast.Constant)
    ]
    return [name for _, name in sorted(named)]
