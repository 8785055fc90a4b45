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
    from ppmulti.rank.models.rtdetr import release27_overrides

    register_source()
    coco.register_source()
    voc.register_source()
    register_ops()
    release27_overrides()   # release/2.7's DETR, ResNet, DINOLoss, RandomDistort and RandomCrop
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


class LinearDecay:
    """YOLOv5's default schedule for ppdet's ``LearningRate``: after the warmup the lr falls linearly from
    base_lr to base_lr x min_lr_ratio (YOLOv5's lrf) at the last step. ppdet 2.6 ships only cosine,
    piecewise and exponential decays; ``register_extensions`` makes this one available by name."""

    def __init__(self, max_epochs: int = 300, min_lr_ratio: float = 0.01, use_warmup: bool = True):
        self.max_epochs = max_epochs
        self.min_lr_ratio = min_lr_ratio
        self.use_warmup = use_warmup

    def lr_at(self, base_lr: float, step: int, start: int, total: int) -> float:
        """The lr of ``step``: base_lr at ``start`` (the end of the warmup), base_lr x min_lr_ratio at the last step."""
        floor = base_lr * self.min_lr_ratio
        return base_lr - (base_lr - floor) * (step - start) / max(1, total - 1 - start)

    def __call__(self, base_lr=None, boundary=None, value=None, step_per_epoch=None):
        from paddle.optimizer.lr import PiecewiseDecay

        total = int(self.max_epochs) * int(step_per_epoch)
        if boundary and value and self.use_warmup:
            # LinearWarmup's lists: values for steps 0..W, boundaries 1..W; the decay starts at W
            start = int(boundary[-1])
            boundary, value = list(boundary), list(value)
        else:
            start, boundary, value = 0, [], [self.lr_at(base_lr, 0, 0, total)]
        for step in range(start + 1, total):
            boundary.append(step)
            value.append(self.lr_at(base_lr, step, start, total))
        return PiecewiseDecay(boundary, value)
