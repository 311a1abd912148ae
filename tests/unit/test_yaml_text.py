"""infra/backends/aws/yaml_text.py writes what yaml.safe_dump writes, byte for byte: a node image's
component text (its recorded inputs, a deployed stack's component) must not change with the emitter."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.backends.aws.yaml_text import SafeDumper, safe_dump

# Characters where PyYAML's analysis and double-quoted writer decide something: breaks, spaces, quotes,
# indicators, escapes of every length (\n, \x.., \u...., \U........), printable non-ASCII, the BOM.
_TRICKY = (
    " \n\t\r\"'\\#:-?,[]{}&*!|>%@`"
    + "\x00\x07\x1b\x7f\x85\xa0\xe9\u2014\u2028\u2029\ud800\ufeff\ufffe\U0001f600"
)
_CHARACTERS = st.text(alphabet=st.sampled_from(_TRICKY) | st.characters(max_codepoint=0x7E), max_size=400)
_PIECES = st.lists(
    st.sampled_from([" ", "  ", "\n", '"', "\\", "é", "\u2028", "\U0001f600", "x" * 7, "word", "\t"]),
    max_size=300,
).map("".join)
_TEXT = _CHARACTERS | _PIECES


def _documents(text: str) -> list[Any]:
    nested = {"a": [{"b": {"c": [text, "x"]}}]}
    return [text, [text], {"key": text}, {text: 1}, {"flow": [text, text]}, nested]


def _dumps(data: Any, **kwargs: Any) -> tuple[str, str]:
    return yaml.dump(data, Dumper=yaml.SafeDumper, **kwargs), yaml.dump(data, Dumper=SafeDumper, **kwargs)


@settings(max_examples=300, deadline=None)
@given(
    text=_TEXT,
    width=st.sampled_from([None, 10, 20, 40, 80, 1000]),
    allow_unicode=st.booleans(),
    flow=st.sampled_from([False, None, True]),
    style=st.sampled_from([None, None, '"']),
)
def test_the_text_is_pyyamls(
    text: str, width: int | None, allow_unicode: bool, flow: bool | None, style: str | None
) -> None:
    for document in _documents(text):
        pyyaml, fast = _dumps(
            document, width=width, allow_unicode=allow_unicode, default_flow_style=flow, default_style=style
        )
        assert fast == pyyaml


@settings(max_examples=300, deadline=None)
@given(text=_TEXT, allow_unicode=st.booleans())
def test_the_scalar_analysis_is_pyyamls(text: str, allow_unicode: bool) -> None:
    ours = SafeDumper(None, allow_unicode=allow_unicode).analyze_scalar(text)
    theirs = yaml.SafeDumper(None, allow_unicode=allow_unicode).analyze_scalar(text)
    assert vars(ours) == vars(theirs)


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "a",
        "ab",
        "- x",
        "---",
        "a: b",
        "a #b",
        "#!/bin/bash\nset -euo pipefail\n",
        '"' * 50,
        "\n" * 50,
        " \n" * 50,
        "x" * 995 + '"' + "y" * 20,  # an escape across the width
        "x" * 996 + "\U0001f600" + " z" * 20,  # a long escape across it, a space after
        "x" * 999 + "\n" + " " * 5 + "y",  # a fold right after an escape, before a space
        ("word " * 300 + '\n  {"k": "v"}\n') * 20,  # a build script's shape: many folds
    ],
)
@pytest.mark.parametrize("width", [20, 80, 1000])
def test_edges_are_pyyamls(text: str, width: int) -> None:
    for document in _documents(text):
        pyyaml, fast = _dumps(document, width=width, sort_keys=False)
        assert fast == pyyaml
    assert safe_dump({"commands": [text]}, width=width) == yaml.safe_dump({"commands": [text]}, width=width)


@pytest.mark.parametrize("text", ['"aws-prod-head-0", x\n y', "\n\t a\nb", "\U0001f600 a\n", "a\tb c\n"])
def test_a_scalar_that_starts_past_the_width(text: str) -> None:
    """Deep in a flow collection a scalar's first character is past the width: PyYAML folds at once."""
    document = {"a": [{"b": [{"c": [text, "x"]}]}]}
    for width in (10, 20):
        pyyaml, fast = _dumps(document, width=width, indent=4, default_flow_style=True)
        assert fast == pyyaml


def test_bytes_when_an_encoding_is_asked() -> None:
    document = {"commands": ["é \U0001f600 " * 200]}
    pyyaml, fast = _dumps(document, width=40, encoding="utf-8")
    assert isinstance(fast, bytes) and fast == pyyaml
