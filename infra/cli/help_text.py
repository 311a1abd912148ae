"""Help in click's plain words: typer 0.29 prints a type after every argument (`NAME <str>`), braces
around required ones in the usage line (`{NAME}`, `[[NAME]]` for optional lists) and `<int range>` for
options without a metavar (typer/core.py: TyperArgument._usage_display_name, display_type). Here an
argument shows its name (`[NAME]` when optional, `...` when repeated) and an option its kind of value
(TEXT, INTEGER, NUMBER, PATH), the ranges and defaults staying in the help text."""

from __future__ import annotations

from typing import Any

_KIND = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "path": "PATH", "bool": "BOOLEAN"}


def _kind(label: str) -> str:
    bare = label.strip("<>").removeprefix("list[").removesuffix("]").removesuffix(" range")
    return _KIND.get(bare, "TEXT" if "|" not in bare else bare.upper())


def _argument_usage(param: Any) -> str:
    name = str(param.display_name_raw)
    name = name if param.required or name.startswith("[") else f"[{name}]"
    return name + ("..." if param.nargs != 1 else "")


def plain_placeholders(command: Any, context: Any = None) -> None:
    """Give every argument and option of `command` (and its subcommands) click's plain placeholders."""
    for param in getattr(command, "params", []):
        kind = type(param).__name__
        if kind == "TyperArgument":
            param.display_type_rich = lambda ctx: None
            param._usage_display_name = lambda param=param: _argument_usage(param)
        elif kind == "TyperOption" and param.metavar is None and not param.is_flag and not param.count:
            param.metavar = _kind(param.display_type(context))
    for sub in getattr(command, "commands", {}).values():
        plain_placeholders(sub, context)
