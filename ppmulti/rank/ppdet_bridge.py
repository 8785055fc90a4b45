"""ppmulti's door into ppdet: registering our extensions (YOLOv5 modules, the YOLO source, LinearDecay), device choice."""

from __future__ import annotations

import sys

from ppmulti.common import compat


def register_extensions() -> None:
    """Everything ppmulti adds to ppdet: YOLOv5 modules, the YOLO dataset source, the linear LR decay."""
    compat.import_ppdet()
    import ppmulti.rank.models  # noqa: F401  (importing registers YOLOv5's backbone, neck, head and loss)
    import ppdet.optimizer.optimizer as ppdet_optimizer

    from ppmulti.rank.data.yolo import register_source
    from ppmulti.rank.engine.lr import LinearDecay

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
