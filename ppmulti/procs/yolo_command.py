"""`ppmulti yolo [TASK] MODE key=value ...`: ultralytics' command line, resolved by ppmulti.common.ultra_keys into
ppmulti's own train, val, detect or export tool (training on several devices goes through `ppmulti launch`)."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

from ppmulti.common.errors import UserError
from ppmulti.common.paths import ROOT
from ppmulti.common.ultra_keys import (DEFAULT_PROJECT, HELP, YoloCommand, args_record, dialect_environ, resolve_line,
                                      ultra_dialect)

TOOL_SCRIPTS = {"eval": "eval.py", "detect": "detect.py", "export": "export.py"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("yolo", help="ultralytics' command line: ppmulti yolo detect train model=yolo11n.yaml "
                                    "data=coco8.yaml epochs=100 imgsz=640 device=0,1",
                       description=f"ultralytics' command line: {HELP}; cfg=FILE reads keys from a yaml.")
    p.add_argument("words", nargs="*", metavar="[TASK] MODE key=value",
                   help="e.g. train model=yolo11n.yaml data=data.yaml")
    p.set_defaults(func=run)


def cfg_file_keys(words: list[str]) -> dict:
    """The keys of ``cfg=FILE`` on the line (ultralytics' custom config yaml), {} without one."""
    import yaml

    from ppmulti.common.errors import first_line
    from ppmulti.common.ultra_keys import KEYS, parse_value

    for word in words:
        if word.startswith("cfg="):
            path = parse_value(word[4:])
            if path is None:
                return {}
            if not Path(str(path)).is_file():
                raise UserError(f"cfg={path}: file not found")
            try:
                keys = yaml.safe_load(Path(str(path)).read_text()) or {}
            except yaml.YAMLError as exc:
                raise UserError(f"cfg={path} is not valid YAML: {first_line(exc)}") from None
            if not isinstance(keys, dict):
                raise UserError(f"cfg={path}: expected a mapping of keys (epochs: 100, ...)")
            unknown = [k for k in keys if k not in KEYS]
            if unknown:
                raise UserError(f"cfg={path}: '{unknown[0]}' is not a valid YOLO argument")
            return {k: v for k, v in keys.items() if k not in ("cfg", "task", "mode")}
    return {}


def tool_argv(command: YoloCommand, hyp_file: str | None) -> list[str]:
    """The tool's argv, with the hyperparameters' file when the line gave any."""
    argv = list(command.argv)
    if hyp_file is not None:
        argv += ["--hyp", hyp_file]
    return argv


def train(argv: list[str], given: dict | None = None) -> int:
    """The train tool on ``argv``; a value it refuses is said back in ultralytics' words (``epochs=-1: ...``,
    not ``--epochs -1: ...``), the user's line being ``key=value``."""
    from ppmulti.common.train_flags import parse
    from ppmulti.procs import train_command

    try:
        with contextlib.redirect_stderr(DialectWarnings(sys.stderr, given)):
            return train_command.run(parse(argv), argv)
    except UserError as exc:
        raise UserError(ultra_dialect(str(exc), "train", given)) from None


class DialectWarnings(io.TextIOBase):
    """stderr whose ``WARNING: --imgsz 100 ...`` messages (the checks' notes, printed before training) read in
    ultralytics' dialect; everything else passes as written, unbuffered (print writes a message in one call)."""

    def __init__(self, stream, given: dict | None = None):
        self._stream, self._given = stream, given

    def write(self, text: str) -> int:
        self._stream.write(ultra_dialect(text, "train", self._given) if text.startswith("WARNING: ") else text)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()


def args_environ(command: YoloCommand) -> dict[str, str]:
    """The variable that carries ultralytics' keys as resolved into the run's plan (entry.plan_of): rank 0 writes
    them as the run's args.yaml, with the run's numbered name and place."""
    import json

    from ppmulti.common.envvars import PPMULTI_ULTRA_ARGS

    place = f"{command.keys.get('project') or DEFAULT_PROJECT}/{command.keys.get('name') or command.mode}"
    return {PPMULTI_ULTRA_ARGS: json.dumps(args_record(command, place))}


def run(args: argparse.Namespace) -> int:
    command = resolve_line(list(args.words), cfg_file_keys(list(args.words)))
    print(f"ppmulti yolo: {command.mode} -> {_shown(command)}", file=sys.stderr, flush=True)
    if command.tool == "train":
        os.environ.update(args_environ(command))   # this process resolves the plan; its ranks inherit it too
        if not command.hyp:
            return train(tool_argv(command, None), command.keys)
        import yaml

        with tempfile.TemporaryDirectory(prefix="ppmulti-yolo-") as tmp:
            hyp_file = os.path.join(tmp, "hyp.yaml")
            Path(hyp_file).write_text(yaml.safe_dump(command.hyp, sort_keys=False))
            return train(tool_argv(command, hyp_file), command.keys)
    script = ROOT / "tools" / TOOL_SCRIPTS[command.tool]
    if not script.is_file():
        raise UserError(f"{script} not found: install ppmulti from a clone with `pip install -e .`")
    sys.stdout.flush()
    os.environ.update(dialect_environ(command))   # the tool's errors name the keys typed (conf=2), not its flags
    os.execv(sys.executable, [sys.executable, str(script), *tool_argv(command, None)])
    return 0   # not reached


def _shown(command: YoloCommand) -> str:
    script = "tools/train.py" if command.tool == "train" else f"tools/{TOOL_SCRIPTS[command.tool]}"
    words = [w if w and " " not in w else repr(w) for w in command.argv]
    hyp = f" --hyp <{', '.join(f'{k}={v:g}' for k, v in command.hyp.items())}>" if command.hyp else ""
    return f"python {script} {' '.join(words)}{hyp}"
