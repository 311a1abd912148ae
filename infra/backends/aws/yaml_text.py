"""`yaml.safe_dump`'s text, byte for byte, without PyYAML's character-by-character loops over long scalars.

A node image's Image Builder component (node_image.component_document) holds the pool's whole build
script, the platform's values included (every training node's Slurm line), as one double-quoted scalar:
a stack of 50 pools and 1,000 nodes dumps 2.2 MB of such text (7.2 MB at 5,000 nodes), and PyYAML's
pure-Python emitter analysed and wrote it one character at a time (the largest part of the offline plan's
time). libyaml's emitter is fast but folds long double-quoted lines differently: the component's text,
and so its recorded inputs and every deployed stack's component, would change.

`SafeDumper` is PyYAML's own, with the two per-character methods replaced by ones that reach the same
result with regular expressions and string methods: `analyze_scalar` (which style a scalar may take) and
`write_double_quoted` (escapes, and folding at `best_width` with PyYAML's exact rules). Everything else
(representing, the other styles, indentation, line breaks) is PyYAML's.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from typing import Any

import yaml
from yaml.emitter import ScalarAnalysis

_BREAKS = "\n\x85\u2028\u2029"
_WHITESPACE = "\0 \t\r\n\x85\u2028\u2029"
_ANY_BREAK = re.compile(r"[\n\x85\u2028\u2029]")
_BREAK_SPACE = re.compile(r"[\n\x85\u2028\u2029] ")
_SPACE_BREAK = re.compile(r" [\n\x85\u2028\u2029]")
_FLOW_INDICATOR = re.compile(r"[,?\[\]{}:]")
_COLON_BEFORE_SPACE = re.compile(r":(?:[\x00 \t\r\n\x85\u2028\u2029]|\Z)")
_COMMENT = re.compile(r"[\x00 \t\r\n\x85\u2028\u2029]#")
# What analyze_scalar calls special whatever allow_unicode says, and what only without it (printable
# non-ASCII: NEL, the BMP but surrogates and the BOM, the planes above but U+10FFFF).
_SPECIAL = re.compile(r"[^\n\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010fffe]")
_UNICODE = re.compile(r"[\x85\xa0-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010fffe]")
# What write_double_quoted escapes: all but printable ASCII (and, with allow_unicode, printable non-ASCII of
# the BMP), and always '"', '\\', NEL, the line and paragraph separators and the BOM.
_ESCAPED = re.compile(r"[^\x20\x21\x23-\x5b\x5d-\x7e]")
_ESCAPED_UNICODE = re.compile(
    r"[^\x20\x21\x23-\x5b\x5d-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd]"
)


class SafeDumper(yaml.SafeDumper):
    def analyze_scalar(self, scalar: str) -> ScalarAnalysis:
        """PyYAML's Emitter.analyze_scalar, each of its flags found by a search instead of a loop."""
        if not scalar:
            return super().analyze_scalar(scalar)
        first = scalar[0]
        followed_by_whitespace = len(scalar) == 1 or scalar[1] in _WHITESPACE
        block_indicators = flow_indicators = scalar.startswith(("---", "..."))
        if first in "#,[]{}&*!|>'\"%@`" or (first == "-" and followed_by_whitespace):
            flow_indicators = block_indicators = True
        if first in "?:":
            flow_indicators = True
            block_indicators = block_indicators or followed_by_whitespace
        if _FLOW_INDICATOR.search(scalar, 1):
            flow_indicators = True
        if _COLON_BEFORE_SPACE.search(scalar, 1):
            block_indicators = True
        if _COMMENT.search(scalar):  # a '#' after whitespace (so never the first character)
            flow_indicators = block_indicators = True
        line_breaks = _ANY_BREAK.search(scalar) is not None
        special_characters = _SPECIAL.search(scalar) is not None or (
            not self.allow_unicode and _UNICODE.search(scalar) is not None
        )
        leading_space, trailing_space = first == " ", scalar[-1] == " "
        leading_break, trailing_break = first in _BREAKS, scalar[-1] in _BREAKS
        break_space = _BREAK_SPACE.search(scalar) is not None
        space_break = _SPACE_BREAK.search(scalar) is not None

        # From here on as PyYAML decides.
        allow_flow_plain = allow_block_plain = allow_single_quoted = allow_double_quoted = allow_block = True
        if leading_space or leading_break or trailing_space or trailing_break:
            allow_flow_plain = allow_block_plain = False
        if trailing_space:
            allow_block = False
        if break_space:
            allow_flow_plain = allow_block_plain = allow_single_quoted = False
        if space_break or special_characters:
            allow_flow_plain = allow_block_plain = allow_single_quoted = allow_block = False
        if line_breaks:
            allow_flow_plain = allow_block_plain = False
        if flow_indicators:
            allow_flow_plain = False
        if block_indicators:
            allow_block_plain = False
        return ScalarAnalysis(
            scalar=scalar,
            empty=False,
            multiline=line_breaks,
            allow_flow_plain=allow_flow_plain,
            allow_block_plain=allow_block_plain,
            allow_single_quoted=allow_single_quoted,
            allow_double_quoted=allow_double_quoted,
            allow_block=allow_block,
        )

    def _escape(self, char: str) -> str:
        if char in self.ESCAPE_REPLACEMENTS:
            return "\\" + self.ESCAPE_REPLACEMENTS[char]
        if char <= "\xff":
            return f"\\x{ord(char):02X}"
        if char <= "\uffff":
            return f"\\u{ord(char):04X}"
        return f"\\U{ord(char):08X}"

    def _write(self, data: str) -> None:
        self.column += len(data)
        self.stream.write(data.encode(self.encoding) if self.encoding else data)

    def write_double_quoted(self, text: str, split: bool = True) -> None:
        """PyYAML's Emitter.write_double_quoted, line by line instead of character by character.

        PyYAML folds a line (a backslash, a line break, the indent, and a backslash again when the next
        character is a space) at the first position `end`, 0 < end < len(text) - 1, where its check holds:
        at a space, at an escaped character once written, and right after one; the check is that the
        column the pending text reaches is past best_width: for a space or the character after an escape,
        the column where that character starts; for an escape, where it ends, less one. Here `out(x)` is
        where text[x] starts in the escaped text, so the column of text[x] on a line that began at p in
        column c is c + out(x) - out(p); the first position past the width is found by bisection and the
        first place to fold from there by a search."""
        self.write_indicator('"', True)
        pattern = _ESCAPED_UNICODE if self.allow_unicode else _ESCAPED
        escapes = {char: self._escape(char) for char in set(pattern.findall(text))}
        escaped = _replace(text, escapes)
        last = len(text) - 2  # PyYAML checks positions 0 < end < len(text) - 1
        if not split or last < 1:
            self._write(escaped)
            self.write_indicator('"', False)
            return
        positions = [match.start() for match in pattern.finditer(text)]
        # out(x) = x + what the escapes before x add; all of them two characters long is the usual case
        added: list[int] | None = None
        if any(len(escape) != 2 for escape in escapes.values()):
            added = [0]
            for position in positions:
                added.append(added[-1] + len(escapes[text[position]]) - 1)

        def out(x: int) -> int:
            index = bisect_left(positions, x)
            return x + (index if added is None else added[index])

        def is_escaped(x: int) -> bool:
            return text[x] in escapes

        start = 0  # where the current line's text begins
        check_from = 1  # the first position not yet checked
        width = self.best_width
        while check_from <= last:
            base = out(start)
            limit = base + width - self.column  # text[x] starts past the width when out(x) > limit
            low, high = start, min(len(text), start + max(limit - base, 0) + 1)
            if out(high) <= limit:
                break  # the rest of the text fits on this line
            while low < high:  # the first x with out(x) > limit
                middle = (low + high) // 2
                if out(middle) > limit:
                    high = middle
                else:
                    low = middle + 1
            past = low
            escape = past - 1  # an escape that starts within the width and ends past it
            if check_from <= escape <= last and is_escaped(escape) and out(past) - 1 > limit:
                fold, resume = escape, escape + 1
            else:
                at = max(past, check_from)
                if at > last:
                    break
                if is_escaped(at - 1) or is_escaped(at):
                    fold = at
                else:
                    space = text.find(" ", at, last + 1)
                    index = bisect_left(positions, at)
                    following = positions[index] if index < len(positions) else -1
                    found = [x for x in (space, following) if 0 <= x <= last]
                    if not found:
                        break
                    fold = min(found)
                resume = fold + 1 if is_escaped(fold) else fold
            self._write(escaped[base : out(resume)] + "\\")
            self.write_indent()
            self.whitespace = False
            self.indention = False
            if text[resume] == " ":
                self._write("\\")
            start, check_from = resume, fold + 1
        self._write(escaped[out(start) :])
        self.write_indicator('"', False)


def _replace(text: str, escapes: dict[str, str]) -> str:
    """`text` with each character of `escapes` replaced by its escape. A few kinds (a script: the line
    breaks, quotes and backslashes) are one str.replace each, several times faster than str.translate."""
    if len(escapes) > 8:
        return text.translate({ord(char): escape for char, escape in escapes.items()})
    if "\\" in escapes:  # first: the other escapes add backslashes
        text = text.replace("\\", escapes["\\"])
    for char, escape in escapes.items():
        if char != "\\":
            text = text.replace(char, escape)
    return text


def safe_dump(data: Any, **kwargs: Any) -> str:
    """yaml.safe_dump(data, **kwargs) to a string: the same text."""
    text: str = yaml.dump(data, Dumper=SafeDumper, **kwargs)
    return text
