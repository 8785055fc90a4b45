"""YOLOv5 v6/v7 (ultralytics) weights -> ppmulti's YOLOv5: parameter names, .pt reading (no torch) and the cache."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ppmulti.rank import compat
from ppmulti.common.errors import UserError

# YOLOv5 v6 P5 layer index -> the ppmulti (ppdet CSPDarkNet / YOLOCSPPAN / YOLOv5Head) module it becomes.
# Layers 11, 12, 15, 16, 19, 22 (Upsample, Concat) have no parameters.
LAYERS: dict[int, str] = {
    0: "backbone.stem",                          # Conv 6x6 s2
    1: "backbone.layers1.stage1.conv_layer",     # Conv 3x3 s2
    2: "backbone.layers2.stage1.csp_layer",      # C3
    3: "backbone.layers3.stage2.conv_layer",
    4: "backbone.layers4.stage2.csp_layer",
    5: "backbone.layers5.stage3.conv_layer",
    6: "backbone.layers6.stage3.csp_layer",
    7: "backbone.layers7.stage4.conv_layer",
    8: "backbone.layers8.stage4.csp_layer",
    9: "backbone.layers9.stage4.sppf_layer",     # SPPF
    10: "neck.lateral_convs.0",                  # top-down: 1x1 on P5, upsample, concat [up, P4]
    13: "neck.fpn_blocks.0",
    14: "neck.lateral_convs.1",
    17: "neck.fpn_blocks.1",                     # P3 out
    18: "neck.downsample_convs.0",               # bottom-up: 3x3 s2, concat [down, layer 14]
    20: "neck.pan_blocks.0",                     # P4 out
    21: "neck.downsample_convs.1",
    23: "neck.pan_blocks.1",                     # P5 out
    24: "yolo_head",                             # Detect
}
DETECT = 24
STRIDES = (8, 16, 32)
_SUBMODULE = {"cv1": "conv1", "cv2": "conv2", "cv3": "conv3"}
_BN_LEAF = dict(zip(("running_mean", "running_var"), compat.batchnorm_state_names()))
_DROPPED = ("num_batches_tracked",)   # torch BN counter; Paddle's BN has none


def map_name(name: str) -> str | None:
    """One YOLOv5 state_dict key -> ppmulti's key; None for entries that have no Paddle counterpart.

    ``model.4.m.1.cv2.bn.running_var`` -> ``backbone.layers4.stage2.csp_layer.bottlenecks.1.conv2.bn._variance``.
    Raises ValueError for a key that is not part of a YOLOv5 v6 P5 detection model.
    """
    key = name[len("module."):] if name.startswith("module.") else name   # saved from DDP
    m = re.fullmatch(r"model\.(\d+)\.(.+)", key)
    if not m:
        raise ValueError(f"{name}: not a YOLOv5 model key (expected model.<layer>.<...>)")
    layer, rest = int(m.group(1)), m.group(2).split(".")
    if rest[-1] in _DROPPED:
        return None
    if layer not in LAYERS:
        raise ValueError(f"{name}: YOLOv5 v6 P5 models have no parameters in layer {layer}")
    if layer == DETECT:
        if rest == ["anchors"] or rest == ["anchor_grid"]:
            return None                          # anchors live in the config (YOLOv5Head.anchors)
        if len(rest) == 3 and rest[0] == "m" and rest[1].isdigit() and rest[2] in ("weight", "bias"):
            return f"yolo_head.convs.{rest[1]}.{rest[2]}"
        raise ValueError(f"{name}: unexpected Detect entry")
    out: list[str] = []
    i = 0
    while i < len(rest):
        tok = rest[i]
        if tok == "m" and i + 1 < len(rest) and rest[i + 1].isdigit():
            out += ["bottlenecks", rest[i + 1]]  # C3's Bottleneck sequence
            i += 2
            continue
        out.append(_SUBMODULE.get(tok, tok))
        i += 1
    if out[-1] in _BN_LEAF:
        out[-1] = _BN_LEAF[out[-1]]
    if len(out) < 2 or out[-2] not in ("conv", "bn") or out[-1] not in ("weight", "bias", *_BN_LEAF.values()):
        raise ValueError(f"{name}: unexpected entry (a Conv+BN's conv.weight or bn.* was expected)")
    return f"{LAYERS[layer]}.{'.'.join(out)}"


@dataclass
class Converted:
    """A converted state dict: ppmulti keys -> arrays, the anchors in pixels, and what was left out."""

    params: dict[str, Any]
    anchors: list[list[list[float]]] | None = None
    num_classes: int | None = None
    dropped: list[str] = field(default_factory=list)


def convert_state_dict(state: Mapping[str, Any]) -> Converted:
    """Rename every entry of a YOLOv5 v6 state dict (values kept as given: numpy arrays, tensors, ...)."""
    import numpy as np

    params: dict[str, Any] = {}
    dropped: list[str] = []
    anchors = None
    for name, value in state.items():
        try:
            new = map_name(name)
        except ValueError as exc:
            raise UserError(f"{exc}; only YOLOv5 v6 P5 detection models (yolov5n/s/m/l/x) convert") from None
        if new is None:
            dropped.append(name)
            if name.endswith("anchors"):
                # Detect.anchors holds anchors / stride after YOLOv5 builds the model
                grid = np.asarray(value, dtype=np.float64).reshape(len(STRIDES), -1, 2)
                anchors = [[[round(float(v) * s, 3) for v in pair] for pair in level]
                           for level, s in zip(grid, STRIDES)]
            continue
        if new in params:
            raise UserError(f"{name}: maps onto {new} twice; the file mixes two models")
        params[new] = value
    head = params.get("yolo_head.convs.0.weight")
    nc = None
    if head is not None:
        na = len(anchors[0]) if anchors else 3
        nc = int(np.shape(head)[0]) // na - 5
    return Converted(params=params, anchors=anchors, num_classes=nc, dropped=dropped)


# YOLOv5's model sizes by (depth_multiple, width_multiple) of their yaml (models/yolov5{n,s,m,l,x}.yaml)
SIZES = {(0.33, 0.25): "n", (0.33, 0.5): "s", (0.67, 0.75): "m", (1.0, 1.0): "l", (1.33, 1.25): "x"}


@dataclass
class PtWeights:
    """What a YOLOv5 .pt holds: its kind, float32 state dict, model yaml, classes and model size (n/s/m/l/x)."""

    path: str
    kind: str                      # "release" (epoch -1, no optimizer), "train.py checkpoint" or "state_dict"
    state: dict[str, Any]
    yaml: dict | None = None
    num_classes: int | None = None
    names: list[str] | None = None
    size: str | None = None

    @property
    def cfg(self) -> str | None:
        """The ppmulti model (``--cfg``) these weights fit, when their yaml is a YOLOv5 v6 P5 size."""
        return f"yolov5{self.size}" if self.size else None


def read_pt(path: str, prefer: str = "model", arrays: bool = True, obj: Any = None) -> PtWeights:
    """A YOLOv5 .pt read without torch (ppmulti/common/torchpt.py): a release file, a train.py checkpoint or a
    plain state_dict. ``prefer`` picks a checkpoint's ``model`` (what YOLOv5's train.py fine-tunes from) or its
    ``ema`` (what detect/val load), the other one when it is None; ``arrays=False`` leaves the tensors unread;
    ``obj``: the file already loaded by torchpt."""
    import numpy as np

    from ppmulti.common import torchpt

    if obj is None:
        obj = torchpt.load(path)
    kind = "state_dict"
    model = obj
    if isinstance(obj, dict) and ("model" in obj or "ema" in obj):
        other = "ema" if prefer == "model" else "model"
        model = obj.get(prefer) or obj.get(other)
        kind = "release" if obj.get("epoch") == -1 and not obj.get("optimizer") else "train.py checkpoint"
    if isinstance(model, torchpt.StandIn):
        state = torchpt.module_state(model)
    elif isinstance(model, Mapping):
        state = dict(model)
    else:
        raise UserError(f"{path}: neither a state_dict nor a YOLOv5 checkpoint with a 'model' or 'ema'")
    tensors = {k: v for k, v in state.items() if isinstance(v, torchpt.Tensor)}
    if not tensors:
        raise UserError(f"{path}: holds no tensors (a YOLOv5 checkpoint keeps them in its 'model')")
    info = getattr(model, "__dict__", {})
    yaml = info.get("yaml") if isinstance(info.get("yaml"), dict) else None
    size = None
    if yaml is not None:
        if len(yaml.get("backbone") or []) != 10 or len(yaml.get("head") or []) != 15:
            raise UserError(f"{path}: a YOLOv5 model with {len(yaml.get('backbone') or [])} backbone and "
                            f"{len(yaml.get('head') or [])} head layers (a P6 or custom layout); ppmulti converts "
                            f"YOLOv5 v6/v7 P5 detection models (yolov5n/s/m/l/x)")
        dm, wm = yaml.get("depth_multiple"), yaml.get("width_multiple")
        size = SIZES.get((round(float(dm), 2), round(float(wm), 2))) if dm is not None and wm is not None else None
    names = info.get("names")
    if isinstance(names, dict):
        names = [names[k] for k in sorted(names)]
    nc = next((v for v in (info.get("nc"), (yaml or {}).get("nc")) if isinstance(v, int)), None)
    values = {k: v.numpy().astype(np.float32) for k, v in tensors.items()} if arrays else dict(tensors)
    return PtWeights(path=path, kind=kind, state=values, yaml=yaml, num_classes=nc,
                     names=list(names) if isinstance(names, (list, tuple)) else None, size=size)


def read_torch_state(path: str) -> dict[str, Any]:
    """The float32 numpy state dict of a YOLOv5 .pt (a checkpoint's ema, else its model), read without torch."""
    return read_pt(path, prefer="ema").state


CONVERTER = "1"   # bump when the conversion changes: cached conversions are named by it


def converted_path(pt: str, prefer: str = "model") -> Path:
    """Where the conversion of ``pt`` is cached: a hidden file beside it named by its sha256 (so a changed .pt is
    converted again) and, for a checkpoint's ema (what evaluation loads), by ``.ema``; or ppmulti's user cache when
    that folder is not writable."""
    from ppmulti.common.download import sha256_of

    digest = sha256_of(pt)[:16]
    part = ".ema" if prefer == "ema" else ""
    name = f".{Path(pt).name}.{digest}{part}.v{CONVERTER}.pdparams"
    beside = Path(pt).resolve().parent
    if os.access(beside, os.W_OK):
        return beside / name
    from ppmulti.common.shm import user_cache_dir

    return user_cache_dir() / "weights" / name


def pdparams_for(pt: str, prefer: str = "model") -> tuple[str, PtWeights | None]:
    """The ppmulti .pdparams of a YOLOv5 or ultralytics 8.x .pt: converted once (on one rank of a node at a time;
    the others then read it) and cached beside it; returns (path, what the .pt held, None when read from the
    cache). ``prefer`` as read_pt takes it for YOLOv5: a checkpoint's ``model`` (what training fine-tunes) or its
    ``ema`` (what tools evaluate); an ultralytics file gives its ``ema`` first, as ultralytics loads it."""
    from ppmulti.common.atomic import atomic_save
    from ppmulti.common.download import file_lock

    out = converted_path(pt, prefer)
    with file_lock(str(out)):
        if out.is_file():
            return str(out), None
        from ppmulti.common import torchpt
        from ppmulti.rank.models import ultra_convert

        obj = torchpt.load(pt)
        if ultra_convert.is_ultralytics(obj):   # YOLOv8 / YOLO11 / YOLO26: its ema, as ultralytics loads it
            weights = ultra_convert.read_ultra_pt(pt, obj)
            params = weights.params
        else:
            weights = read_pt(pt, prefer=prefer, obj=obj)
            params = convert_state_dict(weights.state).params
        import paddle

        tensors = {k: paddle.to_tensor(v) for k, v in params.items()}
        atomic_save(out, lambda tmp: paddle.save(tensors, tmp))
        return str(out), weights
