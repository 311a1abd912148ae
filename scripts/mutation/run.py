#!/usr/bin/env python3
"""`make mutation`: the mutation score of the modules that decide (issue 46), one mutmut session per module,
each running only the unit tests of that module; then the hand mutants (scripts/mutation/hand/*.patch),
the survivors found by hand that mutmut cannot make. Prints a table per part; not part of `make test`.

    scripts/mutation/run.py [SESSION ...] [--jobs N] [--keep] [--only GLOB ...] [--no-hand] [--hand-only]

Why mutmut 3.8.1 rather than cosmic-ray 8.7.0 (both on PyPI; read at github.com/boxed/mutmut, README.rst,
and github.com/sixty-north/cosmic-ray, docs/source/concepts.rst and tutorials/intro): cosmic-ray runs the
whole test command in a process of its own for every mutant and, with its local distributor, mutates the
files in place ("modifying an existing copy of the code in-place"; the tutorial asks for a commit before
`exec`). Here that is pytest and the project's imports again for each mutant: 3 to 14 s on this 2-core
machine (the canary judge's, job profile's and plan diff's tests), against 495 cosmic-ray mutants for
those three modules alone and 4048 for these files. mutmut forks each mutant's run from one process that
has imported everything and runs only the tests that call the mutated function: its 153 mutants of the
canary judge and the job profile took 39 s in all. What mutmut cannot do (module-level code, files that
are not Python) is covered by the hand mutants below.

How mutmut 3 is driven, from its README ("Configuration", "Modifying pytest arguments", "Process
isolation": fork, the default) and its source at 3.8.1 (mutmut/configuration.py,
mutmut/utils/file_utils.py, mutmut/runners/harness.py, mutmut/mutation/trampoline.py):

- mutmut reads `[mutmut]` from setup.cfg (or `[tool.mutmut]` of pyproject.toml) in the directory it runs
  in, copies `source_paths` and `also_copy` (tests/, setup.cfg and pyproject.toml always) into `mutants/`
  there, writes every mutant of a file into that copy (each function behind a trampoline that picks the
  mutant named by MUTANT_UNDER_TEST) and puts `mutants/` first on sys.path. So each session here is a
  directory build/mutation/<session>/ with its own setup.cfg and links to the repository's top-level
  entries; mutmut's copy, never this tree, is what it mutates (`mutmut apply` would write through the links:
  do not use it there).
- It runs pytest in its own process once to learn which tests call which function ("stats"), then forks a
  child per mutant that runs only those tests, `-x`: mutants of a function no selected test calls are
  "no tests". The selection is `pytest_add_cli_args_test_selection`, here the module's own test files.
  Module-level caches of the tests (the recorded programs of the policy and plan tests) survive from the
  stats run into every child: those tests record each stack once per process.
- It matches a test to a function by the function's module name, `infra.plan.diff` for infra/plan/diff.py,
  `roles.slurm_compute.files.gpuplat_dataset_cache` for a node program: tests load node programs and
  examples under that name (tests/conftest.py load_script). A node program run as a process of its own is
  `__main__` there and runs unmutated: its mutants are killed by the tests that import it. A node program
  that is a package (gpuplat_ec2_nodes) is imported by its own name, from the folder pytest's `pythonpath`
  names: its session links the package at the session's top (mutmut names it `gpuplat_ec2_nodes.resume`)
  and puts, where that folder has it in mutmut's copy, a link to the mutated package, so the tests and the
  program's own processes (`python -m gpuplat_ec2_nodes`) both run the mutant.
- It mutates function and method bodies only (module-level constants are left alone; mutmut 2 mutated
  them): the limits of the job profile and the like are held by tests checked with hand mutants, as are
  the files that are not Python (Ansible tasks, shell scripts, the Lua of job_submit).
- A process a test starts with the test's environment sees PYTHONPATH=<session>/mutants (set here) and the
  mutant's name in MUTANT_UNDER_TEST, so it runs the mutant too; the CLI tests' processes of their own
  (tests/unit/test_cli.py gpuplat_process) get a clean environment and run the installed tree.

Kill rate: (killed + timeout) / mutants; "survived" counts the mutants no test failed on, "no tests" those
no selected test reaches. Survivors, with their diffs: build/mutation/<session>/survivors.txt.

A hand mutant is a patch (scripts/mutation/hand/NAME.patch, `Killed-by:` lines naming the tests that must
fail) applied to a copy of the tree (build/mutation/hand/tree); it is killed when those tests fail there.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "mutation"
HAND = Path(__file__).resolve().parent / "hand"
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Session:
    name: str
    label: str
    source: str  # mutmut's source_paths: a folder or one file
    mutate: list[str]  # the files mutated (globs), relative to the repository root
    tests: list[str]  # pytest arguments selecting the module's tests
    functions: list[str] = field(default_factory=list)  # mutant-name globs (empty: every function)
    package_parent: str = ""  # the folder a package `source` is imported from (empty: none, by path)


SESSIONS = [
    Session(
        "canary",
        "canary gate and analysis (infra/serving/canary.py, analysis.py, statistics.py, counts.py)",
        "infra",
        [
            "infra/serving/canary.py",
            "infra/serving/analysis.py",
            "infra/serving/statistics.py",
            "infra/serving/counts.py",
        ],
        [
            "tests/unit/test_canary.py",
            "tests/unit/test_canary_statistics.py",
            "tests/unit/test_canary_steps.py",
            "tests/unit/test_canary_review48.py",
            "tests/unit/test_canary_verdicts.py",
            "tests/unit/test_serving_release.py",
        ],
    ),
    Session(
        "gateway-canary",
        "gateway canary share (gpuplat_gateway_canary.py)",
        "roles/inference_gateway/files/gpuplat_gateway_canary.py",
        ["roles/inference_gateway/files/gpuplat_gateway_canary.py"],
        ["tests/roles/test_gateway_canary.py"],
    ),
    Session(
        "placement",
        "placement (infra/scheduling/placement.py)",
        "infra",
        ["infra/scheduling/placement.py"],
        ["tests/unit/test_placement.py", "tests/roles/test_slurm_placement.py"],
    ),
    Session(
        "slurm",
        "Slurm layout (infra/scheduling/slurm.py)",
        "infra",
        ["infra/scheduling/slurm.py"],
        [
            "tests/unit/test_scheduler.py",
            "tests/unit/test_placement.py",
            "tests/roles/test_slurm_placement.py",
            "tests/roles/test_slurm_templates.py",
            "tests/roles/test_node_alone.py",
            "tests/unit/test_controller_names.py",
            "tests/unit/test_inventory.py",
        ],
    ),
    Session(
        "plan-diff",
        "plan diff (infra/plan/diff.py)",
        "infra",
        ["infra/plan/diff.py"],
        ["tests/unit/test_plan_diff.py"],
    ),
    Session(
        "ci-formats",
        "CI formats (infra/policy/ci_formats.py)",
        "infra",
        ["infra/policy/ci_formats.py"],
        ["tests/unit/test_check_ci_formats.py"],
    ),
    Session(
        "policy-rules",
        "policy rules (infra/policy/rules/)",
        "infra",
        ["infra/policy/rules/*.py"],
        [
            "tests/pulumi/test_policy_rules.py",
            "tests/pulumi/test_policy_slurm_pools.py",
            "tests/pulumi/test_k8s_policy.py",
            "tests/pulumi/test_eks.py::test_node_groups_read_eks_node_groups",
            "tests/pulumi/test_eks.py::test_the_shipped_stack_passes_every_rule",
            "tests/pulumi/test_eks.py::test_eks_node_groups_read_from_labels_templates_or_components",
            # Every unit test file of the rules (as for the EC2 node program below): the CLI's included.
            *sorted(test.relative_to(ROOT).as_posix() for test in ROOT.glob("tests/unit/test_policy_*.py")),
        ],
    ),
    Session(
        "dataset-cache",
        "dataset cache (gpuplat_dataset_cache.py)",
        "roles/slurm_compute/files/gpuplat_dataset_cache.py",
        ["roles/slurm_compute/files/gpuplat_dataset_cache.py"],
        # Not the tests of other users (root only): they run the program with the system's Python, which
        # has no mutmut to import the mutated copy with, so they fail whatever the mutant.
        [
            "tests/unit/test_dataset_cache.py",
            "tests/unit/test_dataset_cache_edges.py",
            "-k",
            "not (second_user or cannot_become or under_sudo or not_readable_by_every_user)",
        ],
    ),
    Session(
        "checkpoint-picker",
        "checkpoint picker (examples/train_dist/train.py)",
        "examples/train_dist/train.py",
        ["examples/train_dist/train.py"],
        ["tests/unit/test_train_dist.py", "-k", "not sigterm"],
        functions=[
            "examples.train_dist.train.x_step_dir__mutmut_*",
            "examples.train_dist.train.x_is_complete__mutmut_*",
            "examples.train_dist.train.x_checkpoints__mutmut_*",
            "examples.train_dist.train.x_newest_complete__mutmut_*",
            "examples.train_dist.train.x_prune__mutmut_*",
        ],
    ),
    Session(
        "ec2-nodes",
        "node program's decisions (gpuplat_ec2_nodes)",
        "gpuplat_ec2_nodes",
        [f"gpuplat_ec2_nodes/{decision}.py" for decision in ("resume", "suspend", "reconcile", "spot_watch")],
        # Every test file of the program: a list written by hand missed the files added after it (the
        # fleet's stop, the EC2 Fleet launch and the drain of outdated nodes all call resume in process).
        sorted(test.relative_to(ROOT).as_posix() for test in ROOT.glob("tests/roles/test_ec2_*.py")),
        package_parent="roles/slurm_elastic/files",
    ),
    Session(
        "guard-job-objects",
        "guard Job's objects (infra/serving/guard_job_objects.py)",
        "infra",
        ["infra/serving/guard_job_objects.py"],
        # Every test file of the Job (its objects' evaluators, the runner under the rendered Role, the CLI's
        # start): a list written by hand would miss the next one.
        sorted(test.relative_to(ROOT).as_posix() for test in ROOT.glob("tests/unit/test_guard_job*.py")),
    ),
    Session(
        "job-profile",
        "job profile (infra/validate/job_profile.py)",
        "infra",
        ["infra/validate/job_profile.py"],
        ["tests/unit/test_job_profile.py"],
    ),
]


# --- mutmut sessions ----------------------------------------------------------------------------------


def top_level_entries() -> list[str]:
    """The repository's top-level files and folders (tracked, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    return sorted({path.split("/", 1)[0] for path in listed if path and (ROOT / path).exists()})


def _cfg_list(key: str, values: list[str]) -> str:
    return f"{key}=\n" + "".join(f"    {v}\n" for v in values)


def prepare(session: Session, keep: bool) -> Path:
    directory = BUILD / session.name
    if directory.exists() and not keep:
        shutil.rmtree(directory)
    # mutants/ is on PYTHONPATH from mutmut's start: a folder missing then would stay unimportable.
    mutants = directory / "mutants"
    mutants.mkdir(parents=True, exist_ok=True)
    # A repository of its own whose one commit holds the stacks, for the tests that read a stack at a git
    # revision (`gpuplat plan --base HEAD`): from the copy, git would otherwise find this repository, where
    # build/mutation/... is no path of any commit. Whatever a test writes with git stays there.
    if not (mutants / ".git").exists():
        shutil.copytree(ROOT / "stacks", mutants / "stacks", dirs_exist_ok=True)
        git = ["git", "-C", str(mutants), "-c", "user.name=mutation", "-c", "user.email=mutation@localhost"]
        for command in (["init", "-q"], ["add", "stacks"], ["commit", "-q", "-m", "the stacks"]):
            subprocess.run([*git, *command], capture_output=True, check=True)
    entries = top_level_entries()
    for entry in entries:
        link = directory / entry
        if not link.is_symlink():
            link.symlink_to(ROOT / entry)
    if session.package_parent:
        package = directory / session.source
        if not package.is_symlink():
            package.symlink_to(ROOT / session.package_parent / session.source)
        # Made before mutmut copies the parent's top-level folder: that copy writes through the link (the
        # original files, then mutated again by mutmut, as their times are the originals').
        inner = mutants / session.package_parent / session.source
        inner.parent.mkdir(parents=True, exist_ok=True)
        if not inner.is_symlink():
            inner.symlink_to(os.path.relpath(mutants / session.source, inner.parent))
    source_top = session.source.split("/", 1)[0]
    # The source's own top-level folder is copied too when the source is one file in it (its neighbours,
    # the other programs of a role, the other files of an example, are read by the tests).
    also_copy = [e for e in entries if e != "tests" and (e != source_top or session.source != source_top)]
    (directory / "setup.cfg").write_text(
        "[mutmut]\n"
        + _cfg_list("source_paths", [session.source])
        + _cfg_list("only_mutate", session.mutate)
        + _cfg_list("also_copy", also_copy)
        + _cfg_list("pytest_add_cli_args_test_selection", session.tests)
        # No unraisable-exception plugin: at the end of every run it calls gc.collect(), which in a child
        # forked from a process holding the recordings and pulumi_aws took 1 of a trivial run's 1.6 s.
        + _cfg_list("pytest_add_cli_args", ["-p", "no:cacheprovider", "-p", "no:unraisableexception"])
        # This folder is not a repository of its own: mutmut's git-based change detection has nothing to see.
        + "use_git_change_detection=false\n"
    )
    return directory


@dataclass
class Row:
    label: str
    mutants: int = 0
    killed: int = 0
    survived: int = 0
    no_tests: int = 0
    timeout: int = 0
    not_run: int = 0

    @property
    def rate(self) -> float:
        return (self.killed + self.timeout) / self.mutants if self.mutants else 0.0

    def add(self, other: Row) -> None:
        for name in ("mutants", "killed", "survived", "no_tests", "timeout", "not_run"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def results(session: Session, directory: Path, untested: bool = False) -> tuple[list[Row], list[str]]:
    """One row per mutated file, and the names of the surviving mutants (`untested`: mutmut stopped before
    running any, as no selected test calls a mutated function: every mutant is "no tests")."""
    from mutmut.stats import status_by_exit_code

    rows, survivors = [], []
    for meta in sorted((directory / "mutants").rglob("*.py.meta")):
        relative = meta.relative_to(directory / "mutants").as_posix()[: -len(".meta")]
        if not any(fnmatch.fnmatch(relative, pattern) for pattern in session.mutate):
            continue
        row = Row(relative)
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        for name, code in sorted(codes.items()):
            if session.functions and not any(fnmatch.fnmatch(name, g) for g in session.functions):
                continue
            status = "no tests" if untested else status_by_exit_code[code]
            row.mutants += 1
            if status in ("killed", "caught by type check", "segfault"):
                row.killed += 1  # segfault: the test process died (SIGKILL at mutmut's CPU limit included)
            elif status == "timeout":
                row.timeout += 1
            elif status == "no tests":
                row.no_tests += 1
                survivors.append(name)
            elif status in ("survived", "suspicious"):
                row.survived += 1
                survivors.append(name)
            else:
                row.not_run += 1
        rows.append(row)
    return rows, survivors


def write_survivors(directory: Path, survivors: list[str]) -> Path:
    """Each surviving mutant with its diff (mutmut show), into survivors.txt."""
    out = directory / "survivors.txt"
    script = (
        "import sys\n"
        "from mutmut.__main__ import find_mutant, get_diff_for_mutant\n"
        "for name in sys.argv[1:]:\n"
        "    m = find_mutant(name)\n"
        "    print(f'# {name}')\n"
        "    print(get_diff_for_mutant(name, path=m.path))\n"
        "    print()\n"
    )
    with out.open("w") as handle:
        if survivors:
            command = [sys.executable, "-c", script, *survivors]
            subprocess.run(command, cwd=directory, stdout=handle, stderr=handle, check=False)
    return out


def run_session(session: Session, jobs: int, keep: bool) -> tuple[list[Row], float, bool]:
    directory = prepare(session, keep)
    environment = {**os.environ, "PYTHONPATH": str(directory / "mutants")}
    log = directory / "mutmut.log"
    started = time.monotonic()
    with log.open("w") as handle:
        done = subprocess.run(
            [str(BIN / "mutmut"), "run", "--max-children", str(jobs), *session.functions],
            cwd=directory,
            env=environment,
            stdout=handle,
            stderr=subprocess.STDOUT,
            check=False,
        )
    elapsed = time.monotonic() - started
    output = log.read_text(errors="replace")
    untested = "could not find any test case for any mutant" in output
    if done.returncode != 0 and not untested:
        spinner = re.compile("[\u2800-\u28ff]")  # mutmut's progress lines
        lines = [line for line in output.replace("\r", "\n").splitlines() if not spinner.search(line)]
        print(f"mutmut failed on {session.name} (exit {done.returncode}); the end of {log}:", file=sys.stderr)
        print("\n".join(lines[-40:]), file=sys.stderr)
        return [Row(session.label)], elapsed, False
    rows, survivors = results(session, directory, untested)
    write_survivors(directory, survivors)
    return rows, elapsed, True


# --- hand mutants -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HandMutant:
    name: str
    patch: Path
    what: str
    tests: list[str]


def hand_mutants() -> list[HandMutant]:
    found = []
    for patch in sorted(HAND.glob("*.patch")):
        header = patch.read_text().split("\ndiff --git ", 1)[0].splitlines()
        what = next((line[len("Mutant:") :].strip() for line in header if line.startswith("Mutant:")), "")
        tests = [line[len("Killed-by:") :].strip() for line in header if line.startswith("Killed-by:")]
        found.append(HandMutant(patch.stem, patch, what, tests))
    return found


def copy_tree(target: Path) -> None:
    """The working tree's files (tracked, or new and not ignored) under `target`."""
    if target.exists():
        shutil.rmtree(target)
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for relative in listed:
        source = ROOT / relative
        if relative and source.is_file():
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / relative, follow_symlinks=False)


def run_hand(mutant: HandMutant, tree: Path) -> str:
    def patch(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["patch", "-p1", "--batch", "--silent", "--no-backup-if-mismatch", "-d", str(tree), *extra,
             "-i", str(mutant.patch)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip

    if patch("--dry-run").returncode != 0:
        return "stale patch"
    patch()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        patch("-R")
    log = BUILD / "hand" / f"{mutant.name}.log"
    log.write_text(done.stdout + done.stderr)
    if done.returncode == 1:
        return "killed"
    return "survived" if done.returncode == 0 else f"error (pytest exit {done.returncode})"


# --- main ---------------------------------------------------------------------------------------------


def table(rows: list[tuple[Row, str]]) -> str:
    header = (
        f"{'module':<52} {'mutants':>7} {'killed':>6} {'survived':>8} {'no tests':>8} {'timeout':>7} "
        f"{'kill rate':>9}"
    )
    lines = [header, "-" * len(header)]
    for row, note in rows:
        rate = f"{row.rate:.1%}" if row.mutants else "-"
        lines.append(
            f"{row.label:<52} {row.mutants:>7} {row.killed:>6} {row.survived:>8} {row.no_tests:>8} "
            f"{row.timeout:>7} {rate:>9}{note}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    names = ", ".join(s.name for s in SESSIONS)
    parser.add_argument("sessions", nargs="*", help=f"sessions to run (default all: {names})")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MUTATION_JOBS", "2")))
    parser.add_argument(
        "--keep", action="store_true", help="keep earlier results: mutmut reruns what changed"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=[],
        metavar="GLOB",
        help="only the mutants whose names match (mutmut's, such as roles.slurm_compute.files."
        "gpuplat_dataset_cache.x_run__mutmut_*): part of a session too slow to run whole",
    )
    parser.add_argument("--no-hand", action="store_true", help="skip the hand mutants")
    parser.add_argument("--hand-only", action="store_true", help="only the hand mutants")
    args = parser.parse_args()
    unknown = set(args.sessions) - {s.name for s in SESSIONS}
    if unknown:
        parser.error(f"unknown sessions: {', '.join(sorted(unknown))}")
    BUILD.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    failed = False
    sessions: dict[str, object] = {}
    hand: dict[str, str] = {}

    if not args.hand_only:
        rows: list[tuple[Row, str]] = []
        for session in SESSIONS:
            if args.sessions and session.name not in args.sessions:
                continue
            if args.only:
                session = replace(session, functions=args.only)
            print(f"== {session.name}: mutmut on {', '.join(session.mutate)}", flush=True)
            file_rows, elapsed, ok = run_session(session, args.jobs, args.keep)
            failed |= not ok
            total = Row(session.label)
            for row in file_rows:
                total.add(row)
            if len(file_rows) > 1:
                rows += [(row, "") for row in file_rows]
            rows.append((total, f"  ({elapsed:.0f} s)" if ok else "  (mutmut failed)"))
            counts = {k: getattr(total, k) for k in ("mutants", "killed", "survived", "no_tests", "timeout")}
            sessions[session.name] = {
                "label": session.label,
                "seconds": round(elapsed),
                **counts,
                "kill_rate": round(total.rate, 4),
                "files": {r.label: round(r.rate, 4) for r in file_rows},
            }
            print(f"   {total.rate:.1%} killed of {total.mutants} in {elapsed:.0f} s", flush=True)
        print()
        print(table(rows))
        print(f"(survivors with their diffs: {BUILD.relative_to(ROOT)}/<session>/survivors.txt)")

    if not args.no_hand and not args.sessions:
        print()
        print("Hand mutants (scripts/mutation/hand/*.patch): each must make its tests fail")
        tree = BUILD / "hand" / "tree"
        copy_tree(tree)
        for mutant in hand_mutants():
            outcome = run_hand(mutant, tree)
            failed |= outcome != "killed"
            hand[mutant.name] = outcome
            print(f"  {outcome:<9} {mutant.name}: {mutant.what}", flush=True)

    summary = {"date": date.today().isoformat(), "sessions": sessions, "hand": hand}
    (BUILD / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\nmake mutation took {time.monotonic() - started:.0f} s ({date.today().isoformat()})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
