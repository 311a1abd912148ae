"""Slurm hostlists (``train-[0-3,5],infer-1``) expanded to node names."""

from __future__ import annotations

import re
from itertools import product

from .exit_codes import UsageError

_BRACKET_GROUP = re.compile(r"\[([^\[\]]*)\]")


def expand_hostlist(hostlist: str) -> list[str]:
    """``a-[0-3,5],b-1`` -> a-0 a-1 a-2 a-3 a-5 b-1 (zero padding and several groups kept)."""
    names: dict[str, None] = {}
    for pattern in split_outside_brackets(hostlist):
        names.update(dict.fromkeys(expand_pattern(pattern)))
    if not names:
        raise UsageError(f"empty hostlist {hostlist!r}")
    return list(names)


def split_outside_brackets(hostlist: str) -> list[str]:
    patterns: list[str] = []
    current: list[str] = []
    depth = 0
    for char in hostlist:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise UsageError(f"malformed hostlist {hostlist!r}: unbalanced or nested brackets")
        if char == "," and depth == 0:
            patterns.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise UsageError(f"malformed hostlist {hostlist!r}: unclosed bracket")
    patterns.append("".join(current))
    return [pattern.strip() for pattern in patterns if pattern.strip()]


def expand_pattern(pattern: str) -> list[str]:
    pieces = _BRACKET_GROUP.split(pattern)
    literals, ranges = pieces[0::2], pieces[1::2]
    if any("[" in literal or "]" in literal for literal in literals):
        raise UsageError(f"malformed host pattern {pattern!r}")
    choices = [expand_ranges(spec, pattern) for spec in ranges]
    return [
        literals[0] + "".join(value + literal for value, literal in zip(combo, literals[1:], strict=True))
        for combo in product(*choices)
    ]


def expand_ranges(spec: str, pattern: str) -> list[str]:
    values: list[str] = []
    for item in spec.split(","):
        low, dash, high = item.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise UsageError(f"malformed range {item!r} in {pattern!r}")
        if not dash:
            values.append(low)
            continue
        if int(high) < int(low):
            raise UsageError(f"descending range {item!r} in {pattern!r}")
        values.extend(str(index).zfill(len(low)) for index in range(int(low), int(high) + 1))
    return values
