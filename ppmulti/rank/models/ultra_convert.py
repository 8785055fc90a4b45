"""ultralytics 8.x checkpoints (YOLOv8 / YOLO11 / YOLO26 detection) -> UltraYOLO's weights, read without torch.

ultralytics' state dict names are UltraYOLO's own (``model.<layer>.<...>``): the conversion renames BatchNorm's
running statistics to Paddle's and drops its batch counter. What a checkpoint holds besides (``train_args``,
``date``, ``version``, ``train_metrics``...) is read as plain data; its model's description (``yaml``) says which
model to build.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ppmulti.common.errors import UserError
from ppmulti.rank import compat

__all__ = ["UltraWeights", "is_ultralytics", "map_name", "convert_state_dict", "read_ultra_pt"]

_BN_LEAF = dict(zip(("running_mean", "running_var"), compat.batchnorm_state_names()))
_DROPPED = ("num_batches_tracked",)
DETECTION_MODEL = "ultralytics.nn.tasks.DetectionModel"
# ultralytics models of other tasks: refused by name
OTHER_TASKS = {"SegmentationModel": "segmentation", "PoseModel": "pose", "OBBModel": "oriented-box",
               "ClassificationModel": "classification", "WorldModel": "open-vocabulary (YOLO-World)",
               "YOLOEModel": "open-vocabulary (YOLOE)", "RTDETRDetectionModel": "RT-DETR"}


def is_ultralytics(obj: Any) -> bool:
    """Whether a torchpt-loaded object is an ultralytics checkpoint (its model or ema an ultralytics model)."""
    if not isinstance(obj, Mapping):
        return False
    return any(str(getattr(obj.get(k), "pt_class", "")).startswith("ultralytics.") for k in ("model", "ema"))


def map_name(name: str) -> str | None:
    """One ultralytics state-dict key -> UltraYOLO's (None: no Paddle counterpart). Raises ValueError."""
    key = name[len("module."):] if name.startswith("module.") else name
    if not re.fullmatch(r"model\.\d+\..+", key):
        raise ValueError(f"{name}: not an ultralytics model key (model.<layer>.<...>)")
    head, _, leaf = key.rpartition(".")
    if leaf in _DROPPED:
        return None
    return f"{head}.{_BN_LEAF.get(leaf, leaf)}"


def convert_state_dict(state: Mapping[str, Any]) -> dict[str, Any]:
    """Rename every entry (values kept as given)."""
    out: dict[str, Any] = {}
    for name, value in state.items():
        try:
            new = map_name(name)
        except ValueError as exc:
            raise UserError(f"{exc}; ultralytics detection checkpoints (YOLOv8/YOLO11/YOLO26) convert") from None
        if new is not None:
            out[new] = value
    return out


@dataclass
class UltraWeights:
    """What an ultralytics .pt holds: its model (float32 arrays under UltraYOLO's names) and the rest as data."""

    path: str
    kind: str                      # "weights" (no optimizer: a release file, a finished run) or "checkpoint"
    params: dict[str, Any]
    yaml: dict
    num_classes: int
    names: list[str] | None = None
    info: dict = field(default_factory=dict)   # train_args, date, version, epoch, train_metrics, ...

    @property
    def model_name(self) -> str:
        """The description's file name with its scale (``yolo11n.yaml``): what UltraYOLO.model takes."""
        from pathlib import Path

        stem = Path(str(self.yaml.get("yaml_file") or "model.yaml")).name
        return stem

    @property
    def cfg(self) -> str | None:
        """The shipped ppmulti model these weights are (yolov8n ... yolo26x), or None for a custom layout."""
        from ppmulti.rank.models.ultra_model import SHIPPED_MODELS, guess_scale

        name = self.model_name.rsplit(".", 1)[0]
        scale = self.yaml.get("scale") or guess_scale(name)
        family = re.sub(r"(\d+)([nslmx])(.+)?$", r"\1\3", name)
        return f"{family}{scale}" if family in SHIPPED_MODELS and scale else None


def _plain(value: Any) -> Any:
    """A pickled value as plain data (stand-ins as their attribute dicts, tensors as their shapes)."""
    from ppmulti.common import torchpt

    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, torchpt.Tensor):
        return {"tensor": list(value.shape)}
    if isinstance(value, torchpt.StandIn):
        return {k: _plain(v) for k, v in vars(value).items() if not k.startswith("_")}
    return value


def read_ultra_pt(path: str, obj: Any = None, prefer: str = "ema", arrays: bool = True) -> UltraWeights:
    """An ultralytics .pt (already loaded by torchpt as ``obj`` or read here): ``prefer`` its ``ema`` (what
    ultralytics' val, predict and fine-tuning load) or its ``model``, the other when it is None."""
    import numpy as np

    from ppmulti.common import torchpt

    if obj is None:
        obj = torchpt.load(path)
    if not is_ultralytics(obj):
        raise UserError(f"{path}: not an ultralytics checkpoint (no 'model' or 'ema' ultralytics model)")
    other = "model" if prefer == "ema" else "ema"
    model = obj.get(prefer) or obj.get(other)
    cls = str(getattr(model, "pt_class", ""))
    kind_name = cls.rsplit(".", 1)[-1]
    if kind_name in OTHER_TASKS:
        raise UserError(f"{path}: an ultralytics {OTHER_TASKS[kind_name]} model ({kind_name}); ppmulti trains "
                        f"detection models (YOLOv8/YOLO11/YOLO26 *.pt without -seg/-pose/-obb/-cls)")
    if cls != DETECTION_MODEL:
        raise UserError(f"{path}: its model is {cls}, not ultralytics' DetectionModel")
    state = torchpt.module_state(model)
    tensors = {k: v for k, v in state.items() if isinstance(v, torchpt.Tensor)}
    attrs = vars(model)
    yaml = attrs.get("yaml")
    if not isinstance(yaml, dict) or "backbone" not in yaml:
        raise UserError(f"{path}: its model carries no model description (yaml); not an ultralytics 8.x file")
    names = attrs.get("names")
    if isinstance(names, Mapping):
        names = [names[k] for k in sorted(names)]
    values = {k: v.numpy().astype(np.float32) for k, v in tensors.items()} if arrays else dict(tensors)
    params = convert_state_dict(values)
    nc = int(yaml.get("nc") or len(names or []) or 80)
    info = {k: _plain(v) for k, v in obj.items() if k not in ("model", "ema", "optimizer")}
    kind = "weights" if not obj.get("optimizer") else "checkpoint"   # stripped (release, finished run) or not
    return UltraWeights(path=path, kind=kind, params=params, yaml=dict(yaml), num_classes=nc,
                        names=list(names) if isinstance(names, (list, tuple)) else None, info=info)
