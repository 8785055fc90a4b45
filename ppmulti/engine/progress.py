"""Console progress on rank 0: tqdm bars when stdout is a terminal, plain per-interval log lines otherwise."""

from __future__ import annotations

import logging
import sys
from typing import Iterable, Iterator, TextIO

from ppmulti import dist

log = logging.getLogger("ppmulti")
# log records carrying this attribute go to train.log but not to the console while a bar shows them
FILE_ONLY = "ppmulti_file_only"
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"


def wants_bars(stream: TextIO | None = None) -> bool:
    """Bars only on rank 0 and only on a terminal: CI and log files must not fill with bar redraws."""
    stream = sys.stdout if stream is None else stream
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):   # no isatty, or a closed stream
        tty = False
    return bool(tty) and dist.is_main()


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
        self.stream = sys.stdout if stream is None else stream
        self._swapped: list[tuple[logging.Handler, logging.Handler]] = []

    def __enter__(self) -> "ConsoleBars":
        for handler in list(log.handlers):
            # the console handler (logs.setup_rank_logging); FileHandler, a subclass, keeps every line
            if type(handler) is logging.StreamHandler:
                safe = _BarSafeHandler(self.stream, handler.formatter, handler.level)
                log.removeHandler(handler)
                log.addHandler(safe)
                self._swapped.append((handler, safe))
        return self

    def __exit__(self, *exc) -> None:
        for handler, safe in self._swapped:
            log.removeHandler(safe)
            log.addHandler(handler)
        self._swapped.clear()

    def bar(self, total: int, desc: str, initial: int = 0, unit: str = "batch"):
        from tqdm import tqdm

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
    if wants_bars(stream):
        from tqdm import tqdm

        with tqdm(items, total=total or None, desc=desc, unit="batch", file=stream or sys.stdout,
                  leave=False, dynamic_ncols=True, mininterval=0.2) as bar:
            yield from bar
        return
    main = dist.is_main()
    every = interval if interval > 0 else max(1, -(-total // 10)) if total else 0
    for i, item in enumerate(items):
        yield item
        if main and every and ((i + 1) % every == 0 or i + 1 == total):
            log.info("%s %d/%d", desc, i + 1, total)
