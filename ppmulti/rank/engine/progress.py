"""Console progress on rank 0: tqdm bars on a terminal (its stdout, or under ``ppmulti launch`` the launcher's),
plain per-interval log lines otherwise."""

from __future__ import annotations

import logging
import os
import stat
import sys
import time
from typing import Iterable, Iterator, TextIO

from ppmulti.rank import dist

log = logging.getLogger("ppmulti")
# log records carrying this attribute go to train.log but not to the console while a bar shows them
FILE_ONLY = "ppmulti_file_only"
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):   # no isatty, or a closed stream
        return False


class _EchoWatch:
    """How far Paddle's launcher has copied this rank's stdout file (workerlog.N) to its terminal.

    Paddle's launcher (the parent of a rank) reads workerlog.0 with its own read-only handle every ~2 s and
    writes what it read to the terminal. A bar drawn while some of our output is still unread would have
    that text land in the middle of it, so bars wait while the launcher's read offset (``/proc/PPID/fdinfo``)
    is behind the file's size. Without that handle (another launcher) nothing waits.
    """

    SETTLE = 0.1   # s after the read for the launcher to write what it read

    def __init__(self):
        self.ppid = os.getppid()
        self.fd: str | None = None
        self.settle_until = 0.0
        try:
            st = os.fstat(1)
            self.key = (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None
        except OSError:
            self.key = None
        if self.key is not None:
            self.fd = self._find()

    def _find(self) -> str | None:
        base = f"/proc/{self.ppid}"
        try:
            names = os.listdir(f"{base}/fd")
        except OSError:
            return None
        for name in names:
            try:
                st = os.stat(f"{base}/fd/{name}")
                if (st.st_dev, st.st_ino) != self.key:
                    continue
                with open(f"{base}/fdinfo/{name}") as f:
                    flags = next(line for line in f if line.startswith("flags:")).split()[1]
                if int(flags, 8) & os.O_ACCMODE == os.O_RDONLY:   # the reader, not our own stdout
                    return name
            except (OSError, StopIteration, IndexError, ValueError):
                continue
        return None

    def behind(self) -> bool:
        """True while the launcher has not yet copied all our output (and shortly after)."""
        if self.fd is None:
            return False
        now = time.monotonic()
        try:
            with open(f"/proc/{self.ppid}/fdinfo/{self.fd}") as f:
                pos = int(next(line for line in f if line.startswith("pos:")).split()[1])
            size = os.fstat(1).st_size
        except (OSError, StopIteration, IndexError, ValueError):
            self.fd = None   # the launcher is gone or closed the file: stop watching
            return False
        if pos < size:
            self.settle_until = now + self.SETTLE
            return True
        return now < self.settle_until

    def wait(self, timeout: float = 3.0) -> None:
        deadline = time.monotonic() + timeout
        while self.behind() and time.monotonic() < deadline:
            time.sleep(0.05)


class _LauncherTerminal:
    """The terminal ``ppmulti launch`` was started from, opened by rank 0 (PPMULTI_CONSOLE_TTY)."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.echo = _EchoWatch()


_launcher_terminal: _LauncherTerminal | None = None
_launcher_checked = False


def launcher_terminal() -> _LauncherTerminal | None:
    """Rank 0 of a launch whose launcher writes to a terminal: that terminal, opened once; else None.

    Paddle starts each rank in its own session (no controlling terminal: /dev/tty cannot be opened), so
    the launcher passes its terminal's path; O_NOCTTY keeps the rank from adopting it. A path that cannot
    be opened (another user's terminal, gone) means plain lines."""
    global _launcher_terminal, _launcher_checked
    if _launcher_checked:
        return _launcher_terminal
    _launcher_checked = True
    from ppmulti.common import envvars as E

    path = os.environ.get(E.PPMULTI_CONSOLE_TTY)
    if not path or not E.in_paddle_worker() or not dist.is_main():
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY)
    except OSError:
        return None
    if not os.isatty(fd):
        os.close(fd)
        return None
    _launcher_terminal = _LauncherTerminal(os.fdopen(fd, "w", buffering=1, encoding="utf-8", errors="replace"))
    return _launcher_terminal


def bar_stream(stream: TextIO | None = None) -> TextIO | None:
    """Where rank 0 draws bars: ``stream`` (default stdout) when it is a terminal, else the launcher's
    terminal when there is one; None for plain lines (other ranks, CI, output to a file)."""
    # the terminal checks first: dist.is_main() imports paddle
    if stream is not None:
        return stream if _isatty(stream) and dist.is_main() else None
    if _isatty(sys.stdout):
        return sys.stdout if dist.is_main() else None
    terminal = launcher_terminal()
    return terminal.stream if terminal is not None else None


def wants_bars(stream: TextIO | None = None) -> bool:
    """Bars only on rank 0 and only on a terminal: CI and log files must not fill with bar redraws."""
    return bar_stream(stream) is not None


def _echo_for(stream: TextIO) -> _EchoWatch | None:
    terminal = _launcher_terminal
    return terminal.echo if terminal is not None and stream is terminal.stream else None


def _tqdm_class(stream: TextIO):
    """tqdm itself, or on the launcher's terminal a tqdm that does not draw while Paddle's copy of our
    workerlog lags behind (its lines would land inside the bar); clearing is never held back."""
    from tqdm import tqdm

    echo = _echo_for(stream)
    if echo is None:
        return tqdm

    class _EchoSafeBar(tqdm):
        def display(self, msg=None, pos=None):
            if msg is None and echo.behind():
                return True
            return super().display(msg, pos)

        def close(self):
            if not self.disable and self.leave:
                echo.wait()   # the final state is drawn once, so let the copy catch up first
            super().close()

    return _EchoSafeBar


class _ClearsBars:
    """sys.stdout/sys.stderr of rank 0 while bars are on the launcher's terminal: a write first wipes the
    bars, so that Paddle's copy of it lands on a clean line; they come back once the copy caught up."""

    def __init__(self, wrapped: TextIO, terminal: TextIO):
        self._wrapped, self._terminal = wrapped, terminal

    def write(self, text: str) -> int:
        if text:
            from tqdm import tqdm

            with tqdm.get_lock():
                for bar in list(getattr(tqdm, "_instances", ())):
                    fp = getattr(bar, "fp", None)   # tqdm wraps the stream it was given
                    if fp is not None and getattr(fp, "_wrapped", fp) is self._terminal:
                        bar.clear(nolock=True)
        return self._wrapped.write(text)

    def __getattr__(self, name):
        return getattr(self._wrapped, name)


class _BarSafeHandler(logging.Handler):
    """The console handler while bars are up: writes above the bar (``tqdm.write``) so a warning does not
    tear a half-drawn bar, and drops the per-interval lines the bar's postfix already shows."""

    def __init__(self, stream: TextIO, formatter: logging.Formatter | None, level: int):
        super().__init__(level)
        self.stream = stream
        self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, FILE_ONLY, False):
            return
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # never let the console break training
            self.handleError(record)


class ConsoleBars:
    """Swaps the ppmulti logger's console handler for a bar-safe one while training runs on a terminal."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = bar_stream(stream) or (sys.stdout if stream is None else stream)
        self._swapped: list[tuple[logging.Handler, logging.Handler]] = []
        self._std: tuple[TextIO, TextIO] | None = None

    def __enter__(self) -> "ConsoleBars":
        echo = _echo_for(self.stream)
        if echo is not None:
            # rank 0's stdout is the workerlog Paddle copies to this same terminal: let the lines written so
            # far reach it before the first bar, and wipe the bars before any later write
            echo.wait()
            self._std = (sys.stdout, sys.stderr)
            sys.stdout = _ClearsBars(sys.stdout, self.stream)   # type: ignore[assignment]
            sys.stderr = _ClearsBars(sys.stderr, self.stream)   # type: ignore[assignment]
        for handler in list(log.handlers):
            # the console handler (logs.setup_rank_logging); FileHandler, a subclass, keeps every line
            if type(handler) is logging.StreamHandler:
                safe = _BarSafeHandler(self.stream, handler.formatter, handler.level)
                for keep in handler.filters:   # ranklog's: pycocotools' prints stay in train.log
                    safe.addFilter(keep)
                log.removeHandler(handler)
                log.addHandler(safe)
                self._swapped.append((handler, safe))
        return self

    def __exit__(self, *exc) -> None:
        for handler, safe in self._swapped:
            log.removeHandler(safe)
            log.addHandler(handler)
        self._swapped.clear()
        if self._std is not None:
            if isinstance(sys.stdout, _ClearsBars):
                sys.stdout = self._std[0]
            if isinstance(sys.stderr, _ClearsBars):
                sys.stderr = self._std[1]
            self._std = None

    def bar(self, total: int, desc: str, initial: int = 0, unit: str = "batch"):
        tqdm = _tqdm_class(self.stream)
        # no per-batch rate: the postfix carries images/s, which is the figure that matters
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=self.stream, leave=True,
                    dynamic_ncols=True, mininterval=0.2, bar_format=BAR_FORMAT)


def track(items: Iterable, desc: str, total: int | None = None, interval: int = 0,
          stream: TextIO | None = None) -> Iterator:
    """Iterate ``items`` with a bar on a rank-0 terminal; elsewhere (rank 0) log ``desc i/n`` every
    ``interval`` items (0: about ten lines in all). Other ranks iterate silently."""
    if total is None:
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            total = 0
    console = bar_stream(stream)
    if console is not None:
        tqdm = _tqdm_class(console)
        with tqdm(items, total=total or None, desc=desc, unit="batch", file=console,
                  leave=False, dynamic_ncols=True, mininterval=0.2) as bar:
            yield from bar
        return
    main = dist.is_main()
    every = interval if interval > 0 else max(1, -(-total // 10)) if total else 0
    for i, item in enumerate(items):
        yield item
        if main and every and ((i + 1) % every == 0 or i + 1 == total):
            log.info("%s %d/%d", desc, i + 1, total)
