"""The version seam: everything that depends on the Paddle or ppdet version goes through here.

Two halves. The launcher's half (Paddle's launcher argv and environment names, the installed version read
from package metadata) imports nothing heavy, so the process side may use it. The rank's half (private
attributes, ``paddle.base`` internals, ppdet's quirks, export mode) imports paddle or ppdet inside its
functions only; the process side never calls it. Supporting another Paddle is this file plus its tests.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os

from ppmulti.common.envvars import PADDLE_SOT_SWITCH

# ------------------------------------------------------------------ the launcher's half (no paddle import)
def installed_version(dist: str = "paddle") -> tuple[int, ...] | None:
    """The installed Paddle's (or another distribution's) version as numbers, read from package metadata
    without importing it; None when not installed. ``paddle`` looks for any of Paddle's wheels."""
    from importlib import metadata

    names = ("paddlepaddle", "paddlepaddle-gpu") if dist == "paddle" else (dist,)
    for name in names:
        try:
            text = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        return tuple(int(p) for p in text.split("+")[0].split(".")[:3] if p.isdigit())
    return None


# ------------------------------------------------------------------ the rank's half (paddle/ppdet inside)
_IMPORTED = False


def import_ppdet() -> None:
    """Import ppdet without its unconditional numba notice on stdout (it would garble logs and CSV pipes)."""
    global _IMPORTED
    if _IMPORTED:
        return
    # pycocotools must be imported before paddle with some builds; the pins make both orders safe,
    # importing it first costs nothing and keeps older environments alive.
    import pycocotools.coco  # noqa: F401
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        import ppdet  # noqa: F401
        import ppdet.modeling  # noqa: F401
    for line in buf.getvalue().splitlines():
        if "numba" not in line and line.strip():
            print(line)
    # ppdet's logger writes every debug line twice through the root logger otherwise.
    logging.getLogger("ppdet").propagate = False
    _IMPORTED = True


@contextlib.contextmanager
def full_graph_to_static():
    """ppdet 2.6.0's exporter reads ``static_model.forward.main_program``, which Paddle 2.6's default
    symbolic (SOT) mode refuses ("Can't call main_program when full_graph=False"); the AST mode
    that ppdet was written for is chosen by Paddle's ENABLE_FALL_BACK switch, read at call time."""
    old = os.environ.get(PADDLE_SOT_SWITCH)
    os.environ[PADDLE_SOT_SWITCH] = "False"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(PADDLE_SOT_SWITCH, None)
        else:
            os.environ[PADDLE_SOT_SWITCH] = old


def set_num_threads(threads: int) -> None:
    """OpenMP and MKL threads of this process (Paddle has no public API for it)."""
    import paddle

    paddle.base.core.set_num_threads(threads)


def batch_sampler(loader):
    """The batch sampler inside a ppdet/Paddle DataLoader (a private attribute of paddle.io.DataLoader), or None."""
    return getattr(loader, "_batch_sampler", None)
