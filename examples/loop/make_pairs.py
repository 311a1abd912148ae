#!/usr/bin/env python3
"""A dataset of text pairs for the loop, from a folder of Markdown pages (this project's manual, say):
one pair per section, its query the page's title and the section's heading, its passage the section's
first paragraph. Writes JSON Lines ({"query": ..., "passage": ...}) to stdout, in a stable order.

    python3 examples/loop/make_pairs.py docs > pairs.jsonl
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HEADING = re.compile(r"^(#{1,4})\s+(.+?)\s*#*\s*$")
LEAD = re.compile(r"^- \*\*(.+?)[.:]?\*\*[.:]?\s*(.*)$")
MIN_PASSAGE, MAX_PASSAGE = 80, 600


def sections(text: str) -> list[tuple[str, str]]:
    """Pairs of a page: (its title and a heading, the first paragraph or list under the heading), and for a
    list item that starts with a bold phrase, (its title and that phrase, the rest of the item)."""
    title, query, paragraph, found = "", "", [], []
    in_code = False

    def flush() -> None:
        passage = " ".join(" ".join(paragraph).split())
        if query and len(passage) >= MIN_PASSAGE:
            found.append((f"{title}: {query}" if title and title != query else query, passage[:MAX_PASSAGE]))

    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        heading = None if in_code else HEADING.match(line)
        item = None if in_code else LEAD.match(line)
        if heading or item:
            flush()
            paragraph = []
            if heading:
                query = heading.group(2).strip("`* ")
                title = query if len(heading.group(1)) == 1 else title
            elif item:
                query, paragraph = item.group(1).strip(), [item.group(2)]
        elif in_code or not query or line.lstrip().startswith(("|", "<", "!", ">")):
            continue
        elif line.strip():
            paragraph.append(line.strip().removeprefix("- "))
        elif paragraph:
            flush()
            query, paragraph = "", []
    flush()
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: make_pairs.py FOLDER  (a folder of Markdown pages, e.g. docs)", file=sys.stderr)
        return 64
    seen: set[str] = set()
    for page in sorted(Path(argv[0]).rglob("*.md")):
        for query, passage in sections(page.read_text(encoding="utf-8")):
            if query not in seen:
                seen.add(query)
                print(json.dumps({"query": query, "passage": passage}, ensure_ascii=False))
    return 0 if seen else 65


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
