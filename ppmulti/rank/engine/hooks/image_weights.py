"""--image-weights: hands the last evaluation's per-class mAP to the weighted batch sampler before each epoch."""

from __future__ import annotations

from typing import Any

from ppmulti.rank.engine.hooks.base import Hook


class ImageWeightsHook(Hook):
    """Before each epoch, gives ``sampler`` (data.sampler.ImageWeightsBatchSampler) the per-class mAP50-95 of
    the last evaluation (``trainer.class_maps``, set by EvaluationHook; zeros before the first), as YOLOv5's
    ``maps``. Its state in a checkpoint: those maps, so a resumed run draws by the same weights."""

    priority = 35   # after_epoch: after the evaluation (30) that sets trainer.class_maps
    name = "image_weights"

    def __init__(self, sampler) -> None:
        self.sampler = sampler
        self.maps: list[float] | None = None

    def before_epoch(self, trainer, epoch) -> None:
        import numpy as np

        self.sampler.maps = None if self.maps is None else np.asarray(self.maps, dtype=np.float64)

    def after_epoch(self, trainer, stats) -> None:
        maps = getattr(trainer, "class_maps", None)
        if maps is not None:
            self.maps = [float(v) for v in maps]

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.maps is None else {"maps": list(self.maps)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.maps = list(state.get("maps") or []) or None
