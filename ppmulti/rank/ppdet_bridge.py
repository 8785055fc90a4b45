"""ppmulti's door into ppdet: registering our extensions (YOLOv5 modules, data source and ops, LinearDecay), device."""

from __future__ import annotations

import sys

from ppmulti.rank import compat


def register_extensions() -> None:
    """Everything ppmulti adds to ppdet: YOLOv5 modules, the YOLO dataset source, the linear LR decay."""
    compat.import_ppdet()
    import ppmulti.rank.models  # noqa: F401  (importing registers YOLOv5's backbone, neck, head and loss)
    from ppmulti.rank.data import coco, voc
    from ppmulti.rank.data.pipeline import register_ops
    from ppmulti.rank.data.yolo import register_source
    from ppmulti.rank.engine.lr import LinearDecay

    register_source()
    coco.register_source()
    voc.register_source()
    register_ops()
    compat.release27_overrides()   # release/2.7's DETR, ResNet, DINOLoss, RandomDistort and RandomCrop
    compat.register_lr_scheduler(LinearDecay)


def select_device(cfg) -> str:
    """Pick the device a config asks for; without CUDA, fall back to CPU with one warning line."""
    want_gpu = bool(cfg.get("use_gpu", False))
    have_gpu = compat.usable_gpu_count() > 0
    if want_gpu and not have_gpu:
        print("warning: config asks for a GPU (use_gpu: true) but none is usable here; training on CPU",
              file=sys.stderr)
        cfg["use_gpu"] = False
        want_gpu = False
    device = "gpu" if want_gpu else "cpu"
    compat.set_device(device)
    return device
