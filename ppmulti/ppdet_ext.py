"""ppmulti's one door into ppdet 2.6.0: quiet import, registering our extensions, device choice, export fix."""

from __future__ import annotations

import contextlib
import io
import logging
import sys

_IMPORTED = False


def quiet_import_ppdet() -> None:
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


def register_extensions() -> None:
    """Everything ppmulti adds to ppdet: YOLOv5 modules, the YOLO dataset source, the linear LR decay."""
    quiet_import_ppdet()
    import ppmulti.models  # noqa: F401  (importing registers YOLOv5's backbone, neck, head and loss)
    import ppdet.optimizer.optimizer as ppdet_optimizer

    from ppmulti.data.yolo import register_source
    from ppmulti.engine.lr import LinearDecay

    register_source()
    # ppdet's LearningRate looks schedulers up by name in its own module
    ppdet_optimizer.LinearDecay = LinearDecay


def select_device(cfg) -> str:
    """Pick the device a config asks for; without CUDA, fall back to CPU with one warning line."""
    import paddle

    want_gpu = bool(cfg.get("use_gpu", False))
    have_gpu = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if want_gpu and not have_gpu:
        print("warning: config asks for a GPU (use_gpu: true) but none is usable here; training on CPU",
              file=sys.stderr)
        cfg["use_gpu"] = False
        want_gpu = False
    # plain "gpu" makes Paddle take FLAGS_selected_gpus, which its launcher sets per worker
    device = "gpu" if want_gpu else "cpu"
    paddle.set_device(device)
    return device


@contextlib.contextmanager
def full_graph_to_static():
    """ppdet 2.6.0's exporter reads ``static_model.forward.main_program``, which Paddle 2.6's default
    symbolic (SOT) mode refuses ("Can't call main_program when full_graph=False"); the AST mode
    that ppdet was written for is chosen by Paddle's ENABLE_FALL_BACK switch, read at call time."""
    import os

    from ppmulti.env import PADDLE_SOT_SWITCH

    old = os.environ.get(PADDLE_SOT_SWITCH)
    os.environ[PADDLE_SOT_SWITCH] = "False"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(PADDLE_SOT_SWITCH, None)
        else:
            os.environ[PADDLE_SOT_SWITCH] = old
