"""Environment values kept out of what a run prints and leaves: which values count, hiding them, env dumps.

Paddle's launcher writes a worker's whole environment in several places (``env {...}`` when a rank fails,
``environ({...})`` atop ``LOG_DIR/JOB.POD.log``, ``envlog.N``, ``backup_env.N.json``), and a traceback may
quote a value. A dump is replaced by its variable names; any other text has each environment value that
could be a secret replaced by ``<hidden $NAME>``. Values that cannot be told from ordinary text (short ones,
numbers, paths) are left alone: a dump is hidden whole, so they only stay where something else printed them.
"""

from __future__ import annotations

import ast
import json
import os
import re
from typing import Iterable, Mapping

MIN_LEN = 8            # shorter values ("1", "true", "gloo", "root") are everywhere in ordinary text
_NUMBER = re.compile(r"^[\d.,:\s+-]*$")
# Paddle's dumps: ``env {...}`` (a failed container, job/container.py) and ``environ({...})`` (controller.py)
_DUMP = re.compile(r"(?P<head>\benv |\benviron\()(?P<body>\{.*\})\)?\s*$")


def _path_like(value: str) -> bool:
    """An absolute or home path (or a list of them), or a relative one that names an existing file."""
    parts = [p for p in value.split(os.pathsep) if p]
    return bool(parts) and all(p.startswith(("/", "~", "./", "../")) or os.path.exists(p) for p in parts)


def secret_values(environ: Mapping[str, str]) -> dict[str, str]:
    """value -> name for every value of ``environ`` that could be a secret (long enough, not a number or path)."""
    found: dict[str, str] = {}
    for name, value in sorted(environ.items()):
        value = value.strip()
        if len(value) >= MIN_LEN and not _NUMBER.match(value) and not _path_like(value):
            found.setdefault(value, name)
    return found


class Redactor:
    """Hides environment values (and Paddle's env dumps) in text; built once per run from its environment."""

    def __init__(self, environ: Mapping[str, str] | None = None):
        self.values = secret_values(os.environ if environ is None else environ)
        longest_first = sorted(self.values, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, longest_first))) if longest_first else None

    def line(self, text: str) -> str:
        """One line (or any text) with every dump and value hidden."""
        text = "\n".join(hide_dump(part) for part in text.split("\n")) if ("env" in text) else text
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: f"<hidden ${self.values[m.group(0)]}>", text)

    def found(self, text: str) -> bool:
        return self._pattern is not None and self._pattern.search(text) is not None


def _names(body: str) -> list[str] | None:
    try:
        data = ast.literal_eval(body)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return sorted(str(k) for k in data) if isinstance(data, dict) else None


def hide_dump(line: str) -> str:
    """A line holding Paddle's ``env {...}`` / ``environ({...})`` dump -> the same line with names only."""
    match = _DUMP.search(line)
    if match is None:
        return line
    names = _names(match.group("body"))
    shown = f"{len(names)} variables: {', '.join(names)}" if names is not None else "a dump"
    return f"{line[:match.start()]}env (values hidden by ppmulti; {shown})"


def names_only_env_file(text: str) -> str:
    """``envlog.N`` (NAME=VALUE lines) -> NAME=<hidden> lines."""
    return "".join(f"{line.split('=', 1)[0]}=<hidden>\n" for line in text.splitlines() if line.strip())


def trim_backup_env(path: str, environ: Mapping[str, str]) -> None:
    """Keep in Paddle's ``backup_env.N.json`` only what this worker's environment lacks.

    Paddle reads the file (paddle/distributed/backup_env.py) only for a variable missing from the worker's
    environment: the long endpoint lists it leaves out beyond PADDLE_ENV_LIMIT_LEN. Those stay; every value
    the worker has anyway (the user's whole environment) goes. Written atomically; a missing or unreadable
    file is left as it is.
    """
    from ppmulti.common.atomic import atomic_write_text

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return
    if not isinstance(data, dict):
        return
    kept = {k: v for k, v in data.items() if k not in environ}
    if kept != data:
        atomic_write_text(path, json.dumps(kept, indent=4, sort_keys=True) + "\n")


def any_value_in(paths: Iterable[str], environ: Mapping[str, str]) -> list[str]:
    """The files among ``paths`` that hold a secret-looking environment value (for checks and tests)."""
    redactor = Redactor(environ)
    hits = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                if redactor.found(f.read()):
                    hits.append(path)
        except OSError:
            continue
    return hits
