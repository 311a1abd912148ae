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
# The same for ASCII text as bytes to delete (bytes.translate beats a regular expression over a long text):
# what is left is special, or escaped.
_PRINTABLE_ASCII = bytes(range(0x20, 0x7F))
_NOT_SPECIAL_ASCII = b"\n" + _PRINTABLE_ASCII
_NOT_ESCAPED_ASCII = _PRINTABLE_ASCII.replace(b'"', b"").replace(b"\\", b"")


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
        if scalar.isascii():
            special_characters = bool(scalar.encode("ascii").translate(None, _NOT_SPECIAL_ASCII))
        else:
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
        character is a space) at the first character, neither the first nor the last, where its check
        holds: at a space, at an escaped character once written, and at the character right after one;
        the check is that the pending text reaches past best_width: for a space or the character after
        an escape, the column where that character starts; for an escape, the column where it ends, less
        one. Here the search runs on the escaped text and its shadow, where an escape is NUL and then
        SOH for each of its other characters (NUL and SOH themselves are always escaped): a character
        starts at an offset whose shadow is not SOH, and its column is the line's first column plus its
        offset from the line's start."""
        self.write_indicator('"', True)
        if text.isascii():
            escaped_chars = {
                chr(byte) for byte in set(text.encode("ascii").translate(None, _NOT_ESCAPED_ASCII))
            }
        else:
            escaped_chars = set((_ESCAPED_UNICODE if self.allow_unicode else _ESCAPED).findall(text))
        escapes = {char: self._escape(char) for char in escaped_chars}
        escaped = _replace(text, escapes)
        if not split or len(text) < 3:
            self._write(escaped)
            self.write_indicator('"', False)
            return
        shadow = _replace(text, {char: _NUL + _SOH * (len(escape) - 1) for char, escape in escapes.items()})
        last = shadow.rfind(_NUL) if shadow[-1] == _SOH else len(shadow) - 1  # the last character's offset
        start = 0  # the offset where the current line's text begins
        check_from = _next_character(shadow, 1)  # the first offset to check: the second character's
        while check_from < last:
            past = start + self.best_width - self.column + 1  # the first offset past the width
            fold = -1
            if past < check_from:
                at = check_from
            elif past < len(shadow) and shadow[past] == _SOH:  # within an escape: it ends past the width
                fold = shadow.rfind(_NUL, 0, past)
                at = _next_character(shadow, past)
            else:
                at = past
            if fold < check_from or fold >= last:  # else the escape across the width
                if at >= last:
                    break
                if shadow[at] == _NUL or shadow[at - 1] == _SOH:  # an escape, or the character after one
                    fold = at
                else:
                    found = [i for i in (shadow.find(" ", at, last), shadow.find(_NUL, at, last)) if i >= 0]
                    if not found:
                        break
                    fold = min(found)
            escape = shadow[fold] == _NUL
            resume = _next_character(shadow, fold + 1) if escape else fold
            self._write(escaped[start:resume] + "\\")
            self.write_indent()
            self.whitespace = False
            self.indention = False
            if shadow[resume] == " ":
                self._write("\\")
            start, check_from = resume, resume if escape else fold + 1
        self._write(escaped[start:])
        self.write_indicator('"', False)


_NUL, _SOH = "\x00", "\x01"


def _next_character(shadow: str, offset: int) -> int:
    """The offset of the first character at or after `offset` (past the rest of an escape)."""
    while offset < len(shadow) and shadow[offset] == _SOH:
        offset += 1
    return offset


def _replace(text: str, replacements: dict[str, str]) -> str:
    """`text` with each character of `replacements` replaced. A few kinds (a script's escapes: line breaks,
    quotes and backslashes) are one str.replace each, several times faster than str.translate."""
    if len(replacements) > 8 or _NUL in replacements or _SOH in replacements:
        return text.translate({ord(char): replacement for char, replacement in replacements.items()})
    if "\\" in replacements:  # first: the escapes of the other characters hold backslashes
        text = text.replace("\\", replacements["\\"])
    for char, replacement in replacements.items():
        if char != "\\":
            text = text.replace(char, replacement)
    return text


def safe_dump(data: Any, **kwargs: Any) -> str:
    """yaml.safe_dump(data, **kwargs) to a string: the same text."""
    text: str = yaml.dump(data, Dumper=SafeDumper, **kwargs)
    return text
