"""What ``ppmulti launch`` shows of Paddle's launcher, what it keeps in the log dir, and the env dumps it scrubs.

Paddle's launcher prints its configuration and pod states on stderr and copies rank 0's ``workerlog.0`` (and,
when a rank fails, that rank's last lines) to stdout. ppmulti reads both through pipes: every line, with the
environment's values hidden (``ppmulti.common.secrets``), goes to ``LOG_DIR/launcher.log``; the console gets
the same lines minus Paddle's chatter (``noise``), or all of them with ``--verbose``. What is hidden from the
console is never lost: rank output stays in Paddle's ``workerlog.N``, the launcher's own lines in launcher.log.

After each attempt ``scrub_log_dir`` removes what Paddle's launcher left of the environment there:
``backup_env.N.json`` (read only by a running worker) is deleted, ``envlog.N`` keeps names only, and the
env dumps in its log files and any value quoted in a worker's log (a traceback) are hidden.
"""

from __future__ import annotations

import collections
import glob
import os
import re
import sys
import threading
from typing import IO, Mapping, TextIO

from ppmulti.common import envvars as E
from ppmulti.common.atomic import atomic_write_text
from ppmulti.common.compat import launcher_spec
from ppmulti.common.secrets import Redactor, names_only_env_file

LAUNCHER_LOG = "launcher.log"

# Lines of Paddle's that say nothing a user acts on. Each pattern names where it comes from.
_NOISE = [
    re.compile(r"^LAUNCH (INFO|DEBUG|WARNING) "),                            # the launcher's logger
    re.compile(r"^[IW]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [\w./-]+:\d+\] "),      # glog INFO/WARNING from C++
    re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+\] \[\s*(INFO|DEBUG)\] \S+\.py:\d+ - "),   # paddle's Python logger
    re.compile(r"^-+ ERROR LOG DETAIL -+$"),
]
# A Python warning raised inside Paddle's own files (its source line follows, indented).
_PADDLE_WARNING = re.compile(r"^\S*[/\\](site|dist)-packages[/\\]paddle[/\\]\S+:\d+: \w+: ")
# "LAUNCH ERROR ... Container failed !!!" is followed by the container's description and its env dump;
# ppmulti names the failed rank itself (runner._RankWatch).
_CONTAINER_FAILED = re.compile(r"^LAUNCH ERROR .*Container failed")
_CONTAINER_LINES = re.compile(r"^(Container rank |env \{|env \(values hidden)")
# After a rank fails, Paddle's launcher logs this header (stderr) and then prints the last 3000 bytes of the failed
# rank's log (stdout), most of which rank 0's log copy has shown already (controllers/controller.py, job/container.py)
_ERROR_DETAIL = re.compile(r"ERROR LOG DETAIL")
REPEATS_KEPT = 500   # the console lines remembered to hide that repeat (the tail is 3000 bytes)
# Paddle 3's "Modified FLAGS detected" banner: a ==== line, FLAGS(...) lines, a ==== line.
_FLAGS_BANNER = re.compile(r"^=+ Modified FLAGS detected =+$")
_RULE = re.compile(r"^=+$")


def verbose_from(flag: bool, environ: Mapping[str, str]) -> bool:
    """``--verbose``, or PPMULTI_VERBOSE=1 (for launches ppmulti starts itself: tools/train.py --nproc 2)."""
    return flag or environ.get(E.PPMULTI_VERBOSE, "").strip().lower() in ("1", "true", "yes")


class NoiseFilter:
    """Tells, line by line, whether a line of one stream is Paddle's chatter; keeps the state of multi-line ones."""

    def __init__(self) -> None:
        self._block: str | None = None    # "warning", "container" or "banner" while inside one

    def noise(self, line: str) -> bool:
        text = line.rstrip("\r\n")
        if self._block == "warning":
            if text.startswith("  "):
                return True
            self._block = None
        elif self._block == "container":
            if _CONTAINER_LINES.match(text):
                return True
            self._block = None
        elif self._block == "banner":
            if _RULE.match(text):
                self._block = None
            return True
        if _PADDLE_WARNING.match(text):
            self._block = "warning"
            return True
        if _CONTAINER_FAILED.match(text):
            self._block = "container"
            return True
        if _FLAGS_BANNER.match(text):
            self._block = "banner"
            return True
        return any(p.match(text) for p in _NOISE)


class LauncherOutput:
    """The launcher's stdout and stderr, read by two threads: to launcher.log, and filtered to the console."""

    def __init__(self, log_dir: str | None, environ: Mapping[str, str], verbose: bool = False,
                 stdout: TextIO | None = None, stderr: TextIO | None = None):
        self.log_dir = log_dir or launcher_spec().default_log_dir
        self.redactor = Redactor(environ)
        self.verbose = verbose
        self.targets = (stdout or sys.stdout, stderr or sys.stderr)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._log: IO[str] | None = None
        self._shown: dict[str, None] = {}   # the console's last lines (insertion-ordered), to hide repeats
        self._detail = False                # Paddle's ERROR LOG DETAIL has begun
        self._tail_start = False            # ... and no line has been shown or hidden since
        self._recent: collections.deque[str] = collections.deque(maxlen=200)   # every line, shown or not

    def child_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The launcher's environment without the switch that makes Paddle 3 print a failed rank's env; with
        ``--verbose`` the ranks are told too (they then print what they keep in their log files otherwise)."""
        dump_var = launcher_spec().env_dump_var
        child = {k: v for k, v in env.items() if k != dump_var}
        if self.verbose:
            child[E.PPMULTI_VERBOSE] = "1"
        return child

    def follow(self, stdout: IO[bytes] | None, stderr: IO[bytes] | None) -> None:
        """Start copying the launcher's two pipes."""
        os.makedirs(self.log_dir, exist_ok=True)
        # a stream, not a snapshot: appended line by line while the launch runs (like Paddle's workerlogs)
        self._log = open(os.path.join(self.log_dir, LAUNCHER_LOG), "a", encoding="utf-8")
        for pipe, target in zip((stdout, stderr), self.targets):
            if pipe is not None:
                thread = threading.Thread(target=self._copy, args=(pipe, target), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _copy(self, pipe: IO[bytes], target: TextIO) -> None:
        noise = NoiseFilter()
        for raw in iter(pipe.readline, b""):
            line = self.redactor.line(raw.decode("utf-8", errors="replace"))
            hidden = noise.noise(line)
            with self._lock:
                if self._log is not None:
                    self._log.write(line)
                    self._log.flush()
                if _ERROR_DETAIL.search(line):
                    self._detail, self._tail_start = True, True
                text = line.rstrip("\r\n")
                if not self.verbose and not hidden and self._repeat(text):
                    hidden = True
                self._recent.append(text)
                if self.verbose or not hidden:
                    try:
                        target.write(line)
                        target.flush()
                    except (OSError, ValueError):   # the console went away: keep the log file going
                        pass
        pipe.close()

    def _repeat(self, text: str) -> bool:
        """Whether a console line repeats one shown before and is to be hidden: within Paddle's error detail, any
        shown line, a blank one, or, as its first line, the end of any line seen (the tail starts mid-line);
        anywhere, an ``error:`` line (each rank refuses bad input in the same words). Notes a line that is shown.
        Called under the lock."""
        first, self._tail_start = self._tail_start, False
        if self._detail and not text.strip():
            return True
        if text in self._shown:
            return self._detail or text.startswith("error: ")
        if first and any(line.endswith(text) for line in self._recent):
            return True
        self._shown[text] = None
        if len(self._shown) > REPEATS_KEPT:
            del self._shown[next(iter(self._shown))]
        return False

    def close(self, timeout: float = 10.0) -> None:
        """Wait for the pipes to drain (the launcher has exited), then scrub the log dir."""
        for thread in self._threads:
            thread.join(timeout)
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None
        scrub_log_dir(self.log_dir, self.redactor)


def scrub_log_dir(log_dir: str, redactor: Redactor) -> None:
    """Remove what Paddle's launcher left of the environment in ``log_dir`` (see the module docstring)."""
    for path in glob.glob(os.path.join(log_dir, "backup_env.*.json")):
        try:
            os.unlink(path)
        except OSError:
            pass
    for path in glob.glob(os.path.join(log_dir, "envlog.*")):
        _rewrite(path, names_only_env_file)
    for path in glob.glob(os.path.join(log_dir, "*.log")) + glob.glob(os.path.join(log_dir, "workerlog.*")):
        _rewrite(path, redactor.line)


def _rewrite(path: str, change) -> None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return
    new = change(text)
    if new != text:
        atomic_write_text(path, new)
