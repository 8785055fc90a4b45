"""The one flag table (ppmulti/common/flags.py): every tool that takes a table flag takes it in every spelling with
the table's dest and type, tools that do not take it take none of its spellings, and no file defines one itself."""

from __future__ import annotations

import argparse
import ast
import importlib.util
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest

from ppmulti.common import flags, ppdet_flags
from ppmulti.common.errors import UserError

REPO = Path(__file__).resolve().parents[1]
# what a tool needs besides the flag under test (argparse refuses the line without it)
REQUIRED = {"infer": ["-c", "r.yml"], "export_model": ["-c", "r.yml"], "convert_yolov5": ["w.pt", "o.pdparams"],
            "data_demo": ["d"]}


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"_flags_table_{name}", REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tool(name: str) -> argparse.ArgumentParser:
    return _module(name).build_parser()


def _sub(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


@lru_cache(maxsize=None)
def parsers() -> dict[str, tuple[tuple[str, argparse.ArgumentParser], ...]]:
    """Each tool of flags.TOOLS -> its real parsers (tools/val.py is eval's second name)."""
    from ppmulti.cli import build_parser as cli
    from ppmulti.common.train_flags import build_parser as train
    from ppmulti.procs.launch.flags import build_parser as launch
    from ppmulti.procs.runs.evolve_run import build_parser as evolve

    root = cli()
    out = {"train": (("tools/train.py", train()),), "eval": (("tools/eval.py", _tool("eval")),
                                                             ("tools/val.py", _tool("val"))),
           "demo": (("ppmulti demo", _sub(root, "demo")),), "data_demo": (("ppmulti data demo",
                                                                          _sub(root, "data", "demo")),),
           "bench": (("ppmulti bench", _sub(root, "bench")),), "board": (("ppmulti board", _sub(root, "board")),),
           "evolve": (("ppmulti evolve", evolve()),), "launch": (("ppmulti launch", launch()),)}
    for name in ("detect", "infer", "export", "export_model", "convert_yolov5"):
        out[name] = ((f"tools/{name}.py", _tool(name)),)
    assert set(out) == set(flags.TOOLS)
    return out


def _shape(action: argparse.Action) -> tuple:
    return type(action), action.type, action.nargs, action.const, action.choices


def _reference(flag: flags.Flag) -> argparse.Action:
    return flags.add(argparse.ArgumentParser(), flag.dest)


def _argv(flag: flags.Flag, spelling: str) -> tuple[list[str], object]:
    """A small command line giving ``flag`` by ``spelling``, and the value it must parse to."""
    action = _reference(flag)
    if action.nargs == 0:
        return [spelling], action.const
    if flag.dest == "opt":
        return [spelling, "a=1", "b=2"], [["a=1", "b=2"]]
    if flag.dest == "imgsz":
        return [spelling, "64", "64"], 64
    if action.type is int:
        return [f"{spelling}=3"], 3
    if action.type is float:
        return [spelling, "0.5"], 0.5
    if action.choices:
        return [spelling, action.choices[0]], action.choices[0]
    return [spelling, "x.yml"], "x.yml"


@pytest.mark.parametrize("tool", flags.TOOLS)
def test_a_tool_takes_each_table_flag_in_every_spelling_or_in_none(tool):
    for prog, parser in parsers()[tool]:
        for flag in flags.FLAGS:
            actions = [a for a in parser._actions if set(a.option_strings) & set(flag.spellings)]
            if tool not in flag.tools:
                assert not actions, f"{prog} takes {actions[0].option_strings}, not in the table's tools for it"
                continue
            assert len(actions) == 1, f"{prog} lacks {flag.spellings[0]} (the table says it takes it)"
            action = actions[0]
            assert tuple(action.option_strings) == flag.spellings and action.dest == flag.dest, prog
            assert _shape(action) == _shape(_reference(flag)), f"{prog} {flag.spellings[0]}"
            for spelling in flag.spellings:
                argv, want = _argv(flag, spelling)
                if flag.dest != "config":
                    argv = REQUIRED.get(tool, []) + argv
                got = getattr(parser.parse_args(argv), flag.dest)
                assert got == want, f"{prog} {' '.join(argv)}: {flag.dest} = {got!r}"


PPDET_TOOLS = {"train": "train", "eval": "eval", "infer": "infer", "export": "export_model"}


def test_paddledetections_own_flags_read_alike_in_every_tool_that_takes_them():
    """ppdet_flags' table (what each PaddleDetection flag does per tool) under the same dialect rule: one dest and
    shape in every tool, its spelling and the dash twin."""
    values = ((ppdet_flags.BOOL, (["false"], False)), (ppdet_flags.STR, (["x"], "x")),
              (ppdet_flags.ANY, (["1", "2"], ["1", "2"])))
    for flag in ppdet_flags.FLAGS:
        assert flag.spellings == flags.twins(flag.names) and not set(flag.spellings) & set(flags.BY_NAME)
        tail, want = next(v for shape, v in values if flag.value is shape)
        shapes = set()
        for tool in flag.uses:
            for prog, parser in parsers()[PPDET_TOOLS[tool]]:
                action = next(a for a in parser._actions if flag.names[0] in a.option_strings)
                assert (tuple(action.option_strings), action.dest) == (flag.spellings, flag.dest), prog
                shapes.add(_shape(action))
                for spelling in flag.spellings:
                    got = getattr(parser.parse_args(REQUIRED.get(PPDET_TOOLS[tool], []) + [spelling, *tail]),
                                  flag.dest)
                    assert got == want, f"{prog} {spelling} {' '.join(tail)}: {got!r}"
        assert len(shapes) == 1, flag.names[0]


def test_dialects_come_in_pairs_and_spellings_are_unique():
    seen: dict[str, str] = {}
    for flag in flags.FLAGS:
        for name in flag.spellings:
            assert seen.setdefault(name, flag.dest) == flag.dest, f"{name}: {seen[name]} and {flag.dest}"
            if name.startswith("--") and ("-" in name[2:] or "_" in name[2:]):
                assert {"--" + name[2:].replace("_", "-"), "--" + name[2:].replace("-", "_")} <= set(flag.spellings)
        assert set(flag.ppdet) <= set(flag.names) and set(flag.tools) <= set(flags.TOOLS)


def test_a_spelling_several_tools_take_is_in_a_table_or_a_named_homonym():
    ppdet = {name for flag in ppdet_flags.FLAGS for name in flag.spellings}
    tools_of: dict[str, set[str]] = {}
    for tool, found in parsers().items():
        for _, parser in found:
            for action in parser._actions:
                for name in action.option_strings:
                    tools_of.setdefault(name, set()).add(tool)
    loose = {name: sorted(tools) for name, tools in tools_of.items() if len(tools) > 1 and name not in ("-h", "--help")
             and name not in flags.BY_NAME and not (name in ppdet and name not in flags.HOMONYMS)}
    assert set(loose) == set(flags.HOMONYMS), loose


def test_an_image_size_is_one_side_or_yolov5s_square_pair():
    parser = parsers()["train"][0][1]
    assert parser.parse_args(["--img-size", "320"]).imgsz == 320
    assert parser.parse_args(["--img_size", "320", "320"]).imgsz == 320
    with pytest.raises(UserError, match=r"--imgsz 320 640: give one size \(square inputs only\), e.g. --imgsz 640"):
        parser.parse_args(["--imgsz", "320", "640"])


def _literal_names(node: ast.AST) -> list[str]:
    out = []
    for arg in getattr(node, "args", []):
        items = arg.elts if isinstance(arg, (ast.Tuple, ast.List)) else [arg]
        out += [item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)]
    return out


# the helpers that make a table's rows (ppdet_flags' _p, launch's _l, train_flags' _t): a row spelling a shared flag
# is a copy too
ROW_MAKERS = ("_p", "_l", "_t")

# PaddleDetection flags some tool honours (a refusal-only one, eval's --amp, may be another tool's own flag)
PPDET_NAMES = {name for flag in ppdet_flags.FLAGS if any(u.kind != "refuse" for u in flag.uses.values())
               for name in flag.spellings}


def test_no_file_defines_a_table_flag_itself():
    """An add_argument (or a launcher Flag entry) spelling a table flag anywhere but its table is a copy."""
    copies = []
    for path in sorted([*(REPO / "ppmulti").rglob("*.py"), *(REPO / "tools").glob("*.py")]):
        if path == REPO / "ppmulti" / "common" / "flags.py":
            continue
        text = path.read_text()
        if "add_argument" not in text and "Flag(" not in text:
            continue
        for node in ast.walk(ast.parse(text, str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in ("add_argument", "Flag", *ROW_MAKERS):
                continue
            table = set(flags.BY_NAME) | (set() if path.name == "ppdet_flags.py" else PPDET_NAMES)
            copies += [f"{path.relative_to(REPO)}:{node.lineno} {item}" for item in _literal_names(node)
                       if item in table]
    assert not copies, "table flags defined outside ppmulti/common/flags.py: " + ", ".join(copies)


def test_the_three_tables_are_rows_of_one_flag_class():
    """The shared table, PaddleDetection's and launch's (its refusals too) are made of the one Flag
    (common/flags.py): each row says its spellings, dest, help, value and use once, launch's spellings follow the
    same dialect rule (twins, plus Paddle's exact old names), and each table builds its parser from its rows."""
    from ppmulti.procs.launch import flags as launch

    for table in (flags.FLAGS, ppdet_flags.FLAGS, launch.FLAGS, launch.REFUSED):
        assert all(type(flag) is flags.Flag for flag in table)
    assert all(flag.uses["launch"].kind == "refuse" for flag in launch.REFUSED)   # refused by name, with why
    parser = launch.build_parser()
    for flag in launch.FLAGS:
        assert flag.spellings == flags.twins(flag.names) + flag.exact and "launch" in flag.tools
        action = next(a for a in parser._actions if a.dest == flag.dest)
        assert tuple(action.option_strings) == flag.spellings and action.help == flag.help
        assert flag.takes_value == (action.nargs != 0), flag.dest
    # the shared flags launch takes are the shared table's rows, with launch's own help text
    for dest in ("device", "devices", "host", "verbose"):
        row = next(f for f in launch.FLAGS if f.dest == dest)
        assert row.spellings == flags.BY_DEST[dest].spellings and row.help != flags.BY_DEST[dest].help


def test_train_flags_are_rows_of_the_one_flag_class():
    """tools/train.py's parser is built from train_flags.TRAIN alone (no add_argument of its own): each row once, in
    the table's order and --help section, with its spellings, dest and help; the shared flags are the shared table's
    rows told train's help; YOLOv5's flags ppmulti lacks are refuse rows, kept out of the parser and refused by name."""
    from ppmulti.common import train_flags as train

    assert all(type(flag) is flags.Flag and "train" in flag.tools for flag in train.TRAIN)
    source = (REPO / "ppmulti" / "common" / "train_flags.py").read_text()
    assert "add_argument(" not in source
    parser = train.build_parser()
    ppdet = {name for flag in ppdet_flags.flags_for("train") for name in flag.spellings}
    actions = [a for a in parser._actions if a.option_strings and a.dest != "help"
               and not set(a.option_strings) & ppdet]
    rows = [flag for flag in train.TRAIN if not train.refused(flag)]
    assert [a.dest for a in actions] == [flag.dest for flag in rows]
    sections = {group.title: group for group in parser._action_groups}
    for flag, action in zip(rows, actions):
        negated = ["--no-" + n[2:] for n in flag.names if isinstance(action, argparse.BooleanOptionalAction)]
        assert action.option_strings == [*flag.spellings, *negated] and action.help == flag.help, flag.dest
        assert flag.spellings == flags.twins(flag.names) and flag.takes_value == (action.nargs != 0), flag.dest
        assert action in sections[flag.group or parser._optionals.title]._group_actions, flag.dest
        if flag.dest in flags.BY_DEST:
            assert flag.names == flags.BY_DEST[flag.dest].names and _shape(action) == _shape(_reference(flag))
    assert {flag.group for flag in rows} == {"", train.YOLOV5}
    # the refused ones: exact YOLOv5 spellings, none a flag some table honours, each refused in one line with why
    taken = {s for a in parser._actions for s in a.option_strings} | set(flags.BY_NAME)
    refused = [flag for flag in train.TRAIN if train.refused(flag)]
    assert refused and set(train.UNSUPPORTED) == {name for flag in refused for name in flag.spellings}
    for flag in refused:
        assert not flag.names and flag.spellings == flag.exact and not set(flag.spellings) & taken
        for name in flag.spellings:
            with pytest.raises(UserError) as err:
                train.parse(["-c", "x.yml", name, *(["1"] if flag.takes_value else [])])
            assert str(err.value) == (f"{name} is a YOLOv5 flag that ppmulti does not support "
                                      f"({flag.uses['train'].text}); remove it")


# tools/NAME.py -> (its tool in flags.TOOLS, the YOLOv5 script whose flags it refuses)
TOOL_REFUSALS = {"eval": ("eval", "val.py"), "val": ("eval", "val.py"), "detect": ("detect", "detect.py"),
                 "export": ("export", "export.py")}


@pytest.mark.parametrize("script", sorted(TOOL_REFUSALS))
def test_the_tools_refusals_are_rows_of_the_one_flag_class(script):
    """tools/eval.py (val.py), detect.py and export.py refuse YOLOv5's flags they lack as rows of the one Flag class,
    made by flags.refusal as train's and launch's are: exact YOLOv5 spellings, kept out of the parser, UNSUPPORTED
    derived from the rows, each spelling refused in its one line with why."""
    tool, yolov5 = TOOL_REFUSALS[script]
    module, table = _module(script), _module(tool)   # tools/val.py: eval.py's parser and rows under its own prog
    rows = table.REFUSED
    assert rows and all(type(flag) is flags.Flag and flag.tools == (tool,) and flag.refuses(tool) for flag in rows)
    assert table.UNSUPPORTED == flags.refusals(rows, tool)
    assert set(table.UNSUPPORTED) == {name for flag in rows for name in flag.spellings}
    parser = module.build_parser()
    taken = {s for a in parser._actions for s in a.option_strings}
    for flag in rows:
        assert flag == flags.refusal(tool, flag.exact, flag.uses[tool].text, **flag.value), flag.dest
        assert not flag.names and flag.spellings == flag.exact and not set(flag.spellings) & taken, flag.dest
        for name in flag.spellings:
            with pytest.raises(UserError) as err:
                module.parse([name, *(["1"] if flag.takes_value else [])])
            assert str(err.value) == (f"{name} is a YOLOv5 {yolov5} flag that ppmulti does not support "
                                      f"({flag.uses[tool].text}); remove it")


def test_every_refused_flag_of_every_tool_is_a_refusal_row():
    """No tool keeps a hand-written table of refused flags or a refusal row maker of its own: each refused flag of
    train, launch, eval/val, detect and export is a flags.refusal row (PaddleDetection's own refused flags are
    ppdet_flags' rows, added to the parser so that --help names them)."""
    from ppmulti.common import train_flags as train
    from ppmulti.procs.launch import flags as launch

    tables = {"train": train.TRAIN, "launch": launch.REFUSED,
              **{tool: _module(tool).REFUSED for tool, _ in TOOL_REFUSALS.values()}}
    for tool, table in tables.items():
        refused = [flag for flag in table if flag.refuses(tool)]
        assert refused, tool
        for flag in refused:
            made = flags.refusal(tool, flag.exact, flag.uses[tool].text, **flag.value)
            assert flag == replace(made, group=flag.group), (tool, flag.dest)   # train's show under YOLOv5's section
    makers = []
    for path in sorted([*(REPO / "ppmulti").rglob("*.py"), *(REPO / "tools").glob("*.py")]):
        if path.name in ("flags.py", "ppdet_flags.py") and path.parent.name == "common":
            continue
        text = path.read_text()
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "UNSUPPORTED" for t in node.targets) \
                    and isinstance(node.value, ast.Dict):
                makers.append(f"{path.relative_to(REPO)}:{node.lineno} UNSUPPORTED = {{...}}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "refuse":
                makers.append(f"{path.relative_to(REPO)}:{node.lineno} refuse(...)")
    assert not makers, "refused flags outside flags.refusal rows: " + ", ".join(makers)
