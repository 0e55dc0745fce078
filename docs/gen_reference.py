"""Rewrite the reference parts of the docs from the code: config fields, method parameters, CLI options.

    python docs/gen_reference.py          # rewrite the reference blocks in place
    python docs/gen_reference.py --check  # exit 1 naming the stale files when the docs differ from the code

A reference block sits between two marker comments in any Markdown file under docs/:

    <!-- reference:KIND ARG -->
    ...
    <!-- end reference -->

Kinds: `params METHOD` (a method's parameter table), `methods` (the registry), `config SECTION` (one
section of `TrainConfig`), `config-yaml` (the config a demo run writes to `<out>/config.yaml`) and
`cli COMMAND [SUBCOMMAND]` (one command's options, from `bigslide.cli.main.build_parser()`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import tempfile
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml

from bigslide.cli.demo import demo_config
from bigslide.cli.main import bench_parser, build_parser
from bigslide.engine.config import TrainConfig
from bigslide.methods import available_methods, get_method

DOCS = Path(__file__).resolve().parent
BLOCK = re.compile(
    r"(?P<open><!-- reference:(?P<kind>[\w-]+)(?: (?P<arg>[^>]*?))? -->\n)"
    r"(?P<body>.*?)(?P<close><!-- end reference -->)",
    re.S,
)


class StaleDocsError(Exception):
    """A reference block cannot be made (unknown method, section or command; undocumented field)."""


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell (no HTML tags, column breaks or link brackets)."""
    return (
        text.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("|", "\\|")
        .replace("[", "\\[")
        .replace("]", "\\]")
        .strip()
    )


def type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        inner = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(inner) + (" or `null`" if type(None) in args else "")
    if origin is dict:
        return "mapping"
    return getattr(hint, "__name__", str(hint))


def yaml_value(value: Any) -> str:
    """A default as it is written in a YAML config or a `--set KEY=VALUE` override."""
    if isinstance(value, str) and value == "":
        return '`""`'
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    text = text.removesuffix("...").strip()
    return f"`{text}`"


def field_rows(cls: type, prefix: str) -> list[str]:
    hints = typing.get_type_hints(cls)
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}"
        help_text = f.metadata.get("help")
        if not help_text:
            raise StaleDocsError(f"{key} has no help: add metadata={{'help': ...}} to the field")
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise StaleDocsError(f"{key} has no default")
        rows.append(f"| `{key}` | {type_name(hints[f.name])} | {yaml_value(default)} | {cell(help_text)} |")
    return rows


def render_params(arg: str) -> str:
    if arg not in available_methods():
        raise StaleDocsError(f"params {arg}: no such method; registered: {available_methods()}")
    method = get_method(arg)
    head = [f"`{arg}` ({method.kind} method, `{method.Params.__name__}`): {cell(method.summary)}", ""]
    return "\n".join(head + field_rows(method.Params, "method.params"))


def render_methods(arg: str) -> str:
    rows = ["| name | kind | what it does |", "|---|---|---|"]
    for name in available_methods():
        method = get_method(name)
        rows.append(f"| `{name}` | {method.kind} | {cell(method.summary)} |")
    return "\n".join(rows)


def render_config(arg: str) -> str:
    sections = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    if arg not in sections:
        raise StaleDocsError(f"config {arg}: no such section; TrainConfig has {sorted(sections)}")
    cls = typing.get_type_hints(TrainConfig)[arg]
    return "\n".join(field_rows(cls, arg))


def render_config_yaml(arg: str) -> str:
    config = demo_config(Path("runs/demo"), "abmil_acc", 3)
    text = yaml.safe_dump(config.to_dict(), sort_keys=False)
    return f"```yaml\n{text}```"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _subcommand_help(parser: argparse.ArgumentParser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def _default(value: Any) -> str:
    text = str(value)
    tmp = tempfile.gettempdir()
    if text.startswith(tmp + os.sep):  # machine-dependent: the reference must not change per machine
        text = "$TMPDIR" + text[len(tmp) :]
    if isinstance(value, list):
        text = " ".join(str(v) for v in value)
    return f"`{text}`"


def option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| option | value | default | description |", "|---|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        name = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}` (positional)"
        if action.nargs == 0:
            value = "flag"
        elif action.metavar:
            value = f"`{action.metavar}`"
        elif action.choices:
            value = "one of " + ", ".join(f"`{c}`" for c in action.choices)
        else:
            value = getattr(action.type, "__name__", "str") if action.type else "str"
            if action.nargs in ("*", "+"):
                value += " (several)"
        if action.required:
            default = "required"
        elif action.nargs == 0 or action.default is None:
            default = ""
        else:
            default = _default(action.default)
        rows.append(f"| {name} | {value} | {default} | {cell(action.help or '')} |")
    return rows


def render_cli(arg: str) -> str:
    parser = build_parser()
    path = arg.split()
    for part in path:
        commands = _subparsers(parser)
        if part not in commands:
            raise StaleDocsError(f"cli {arg}: no command {part!r}; known: {sorted(commands)}")
        summary = _subcommand_help(parser).get(part, "")
        parser = bench_parser(part) if path[:1] == ["bench"] and part != "bench" else commands[part]
    lines = [cell(summary), ""] if summary else []
    if len(option_rows(parser)) > 2:
        lines += option_rows(parser)
    else:
        lines.append("No options.")
    nested = _subparsers(parser)
    if nested:
        lines += ["", "| subcommand | what it runs |", "|---|---|"]
        helps = _subcommand_help(parser)
        lines += [f"| `{name}` | {cell(helps.get(name, ''))} |" for name in nested]
    return "\n".join(lines)


RENDERERS: dict[str, Callable[[str], str]] = {
    "params": render_params,
    "methods": render_methods,
    "config": render_config,
    "config-yaml": render_config_yaml,
    "cli": render_cli,
}


def refresh(text: str, where: str) -> str:
    def replace(match: re.Match[str]) -> str:
        kind, arg = match["kind"], (match["arg"] or "").strip()
        if kind not in RENDERERS:
            raise StaleDocsError(f"{where}: unknown reference block kind {kind!r}")
        return f"{match['open']}{RENDERERS[kind](arg).rstrip()}\n{match['close']}"

    return BLOCK.sub(replace, text)


def markdown_files() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def command_paths(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
    """Every subcommand as "train", "bench grid", ..."""
    paths: list[str] = []
    for name, sub in _subparsers(parser).items():
        path = f"{prefix} {name}".strip()
        paths += [path, *command_paths(sub, path)]
    return paths


def missing_blocks(texts: list[str]) -> list[str]:
    """Reference blocks the code calls for that no page has: a new method, config section or command."""
    present = {(m["kind"], (m["arg"] or "").strip()) for text in texts for m in BLOCK.finditer(text)}
    wanted = [("params", name) for name in available_methods()]
    wanted += [("config", f.name) for f in dataclasses.fields(TrainConfig)]
    wanted += [("cli", path) for path in command_paths(build_parser())]
    return [f"<!-- reference:{kind} {arg} -->" for kind, arg in wanted if (kind, arg) not in present]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files; change nothing")
    args = parser.parse_args(argv)
    stale: list[str] = []
    texts = [path.read_text(encoding="utf-8") for path in markdown_files()]
    missing = missing_blocks(texts)
    if missing:
        print("gen_reference: no page has " + ", ".join(missing), file=sys.stderr)
        return 2
    for path in markdown_files():
        old = path.read_text(encoding="utf-8")
        try:
            new = refresh(old, str(path.relative_to(DOCS.parent)))
        except StaleDocsError as err:
            print(f"gen_reference: {err}", file=sys.stderr)
            return 2
        if new != old:
            stale.append(str(path.relative_to(DOCS.parent)))
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if args.check and stale:
        print(
            "out of date with the code: " + ", ".join(stale) + "; run `python docs/gen_reference.py`",
            file=sys.stderr,
        )
        return 1
    for name in stale:
        print(f"rewrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
