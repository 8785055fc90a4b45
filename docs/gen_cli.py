"""Writes the CLI reference (docs/cli.md) from the argparse parsers of `ppmulti`, its subcommands and tools/*.py.

Run `python docs/gen_cli.py > docs/cli.md` after changing a flag; tests/test_docs.py regenerates the page and
fails when it differs. The page is rendered from the parsers' actions (not from `--help` text), so it reads the
same on every Python that argparse's help layout differs between. No import here reaches paddle or ppdet.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
TOOLS = ("train", "eval", "val", "infer", "detect", "export", "convert_yolov5")   # this order, then any other


def tools() -> list[str]:
    """The scripts in tools/: TOOLS in its order, then any other script there, by name."""
    found = sorted(p.stem for p in (REPO / "tools").glob("*.py"))
    return [t for t in TOOLS if t in found] + [t for t in found if t not in TOOLS]


def _passthrough_parsers() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    """Subcommands whose `ppmulti` subparser takes the rest of the line as data, and the parser that reads it."""
    from ppmulti.procs.launch.flags import build_parser as launch_parser
    from ppmulti.procs.runs.evolve_run import build_parser as evolve_parser

    return {"launch": launch_parser, "evolve": evolve_parser}


def tool_parser(name: str) -> argparse.ArgumentParser:
    """tools/NAME.py's parser; tools/train.py's lives with the train flags it shares with `ppmulti demo`."""
    if name == "train":
        from ppmulti.common.train_flags import build_parser

        return build_parser()
    path = REPO / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_ppmulti_tool_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_parser()


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            out += [(name, sub, helps.get(name) or "") for name, sub in action.choices.items()]
    return out


def _esc(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*")


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if "%(" in text:
        text = text % {**vars(action), "default": action.default}
    text = " ".join(text.split())   # the whole help, as `--help` prints it
    default = action.default
    if (action.option_strings and default not in (None, False, [], argparse.SUPPRESS)
            and not isinstance(action, (argparse._StoreTrueAction, argparse._VersionAction))
            and "default" not in text):
        text = f"{text} (default: {default})" if text else f"default: {default}"
    return _esc(text)


def _flag(action: argparse.Action) -> str:
    if action.nargs == 0:
        value = ""
    elif action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        value = " {" + ",".join(str(c) for c in action.choices) + "}"
    else:
        metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
        value = f" {metavar}" if action.option_strings else metavar
        if action.nargs in ("+", "*"):
            value += " ..."
        elif action.nargs == "?":
            value = f" [{value.strip()}]"
    if not action.option_strings:
        return f"`{value.strip()}`"
    return "`" + ", ".join(action.option_strings) + value + "`"


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    """One list item a flag: its spellings and value, then its whole help."""
    rows = [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and a.help != argparse.SUPPRESS]
    if not rows:
        return []
    items: list[tuple[list[str], str]] = []   # flags that share one help text (refusals, mostly) share a row
    for a in rows:
        text = _help(a).replace("\\|", "|")
        if items and text and items[-1][1] == text:
            items[-1][0].append(_flag(a))
        else:
            items.append(([_flag(a)], text))
    return [f"- {', '.join(flags)}" + (f": {text}" if text else "") for flags, text in items] + [""]


def _section(title: str, parser: argparse.ArgumentParser, summary: str = "") -> list[str]:
    lines = [f"## `{title}`", ""]
    text = _esc(parser.description or summary)
    if text:
        lines += [text[0].upper() + text[1:] + ("" if text.endswith(".") else "."), ""]
    if parser.usage:
        lines += ["```text", parser.usage.replace("%(prog)s", title), "```", ""]
    lines += _arguments(parser)
    if parser.epilog:
        lines += ["```text", parser.epilog.strip(), "```", ""]
    return lines


def render() -> str:
    from ppmulti.cli import build_parser

    root = build_parser()
    lines = ["# Command-line reference", "",
             "Generated from the argparse parsers by `python docs/gen_cli.py > docs/cli.md`; "
             "`tests/test_docs.py` fails when this page and the parsers differ. "
             "Every command also prints its own `--help`.", ""]
    lines += _section("ppmulti", root)
    passthrough = _passthrough_parsers()
    for name, sub, summary in _subparsers(root):
        full = passthrough.get(name)
        lines += _section(f"ppmulti {name}", full() if full else sub, summary)
        for child, subsub, child_summary in _subparsers(sub):
            lines += _section(f"ppmulti {name} {child}", subsub, child_summary)
    tables: dict[str, str] = {}
    for tool in tools():
        title = f"python tools/{tool}.py"
        section = _section(title, tool_parser(tool))
        body = "\n".join(section[2:])
        if body in tables:   # tools/val.py is tools/eval.py under YOLOv5's name
            section = [f"## `{title}`", "", f"The same flags as `{tables[body]}`.", ""]
        tables.setdefault(body, title)
        lines += section
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
