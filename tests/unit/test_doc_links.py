"""Links of the README and the manual: every relative link names a file of the repository, and every
`#anchor` into a Markdown page names one of its headings. MkDocs checks the links between the pages of
docs/ (`mkdocs build --strict` in make lint); the README lies outside docs/, so it is checked here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def heading_anchor(heading: str) -> str:
    """The anchor GitHub and MkDocs' toc extension give a heading: lower case, code and emphasis marks
    dropped, punctuation other than hyphens removed, spaces as hyphens."""
    text = re.sub(r"[`*]", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        if match := re.match(r"#{1,6}\s+(.*?)\s*#*$", line):
            anchor = heading_anchor(match.group(1))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z+.-]*:", target):
            continue
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_links_resolve(page: Path) -> None:
    assert not broken_links(page)


def test_the_readme_maps_every_page_of_the_manual() -> None:
    mapped = {
        Path(target.partition("#")[0]).name for target in LINK.findall((ROOT / "README.md").read_text())
    }
    missing = sorted(page.name for page in PAGES[1:] if page.name not in mapped)
    assert not missing, f"docs pages the README does not link: {missing}"


def test_a_broken_link_and_a_missing_anchor_are_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Suite times\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#suite-times) [gone](missing.md) [bad](other.md#not-a-heading) "
        "[web](https://example.org/x) [self](#top)\n\n# Top\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#not-a-heading: no heading with that anchor",
    ]
