"""YOLOv5 v6 (ultralytics) state_dict -> ppmulti's YOLOv5 parameter names; torch is needed only to read .pt files."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
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


def read_torch_state(path: str) -> dict[str, Any]:
    """The float32 numpy state dict of a YOLOv5 .pt: a plain state_dict, or a train.py checkpoint (ema or model).

    A train.py checkpoint pickles YOLOv5's module classes; they are read here without YOLOv5's code: every
    class becomes an inert stand-in holding its pickled parameters and buffers, and only tensor rebuilding,
    containers and numpy scalars are resolved (see _stub_pickle_module).
    """
    try:
        import torch
    except ImportError:
        raise UserError("reading a .pt file needs PyTorch: pip install torch (the CPU build is enough)") from None
    import pickle

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except Exception:
        obj = torch.load(path, map_location="cpu", weights_only=False, pickle_module=_stub_pickle_module(pickle))
    if isinstance(obj, dict) and ("ema" in obj or "model" in obj):
        obj = obj.get("ema") or obj.get("model")
    state = obj if isinstance(obj, Mapping) else _module_state(obj)
    if not state:
        raise UserError(f"{path}: neither a state_dict nor a YOLOv5 checkpoint with 'model'/'ema'")
    return {k: v.detach().float().cpu().numpy() for k, v in state.items() if hasattr(v, "detach")}


class _Stub:
    """Stand-in for a pickled class that is not torch's: keeps the pickled attributes, runs nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        self.__dict__.update(state if isinstance(state, dict) else {"_state": state})


# What a YOLOv5 checkpoint needs from outside its own classes: tensor rebuilding, containers, numpy scalars.
_SAFE_BUILTINS = {"set", "frozenset", "slice", "tuple", "list", "dict", "object", "bool", "int", "float",
                  "complex", "bytearray", "bytes", "range", "str"}
_SAFE = {("collections", "OrderedDict"), ("copyreg", "_reconstructor"), ("copy_reg", "_reconstructor"),
         ("_codecs", "encode"), ("numpy", "ndarray"), ("numpy", "dtype"),
         ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
         ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}


def _stub_pickle_module(pickle):
    """A pickle module whose Unpickler resolves only tensor/containers/numpy names; every class else is a _Stub.

    torch.nn layers and YOLOv5's classes alike become stubs (their parameters are read from the pickled
    __dict__), so neither YOLOv5's code nor a callable named by the file runs, apart from the names above.
    """
    import types

    import torch

    def allowed(module: str, name: str) -> bool:
        if module in ("builtins", "__builtin__"):
            return name in _SAFE_BUILTINS
        if module == "torch._utils":
            return name.startswith("_rebuild")
        if module == "torch":
            return name.endswith("Storage") or name in ("Size", "device") or isinstance(
                getattr(torch, name, None), torch.dtype)
        if module == "numpy.dtypes":
            return name.endswith("DType")
        return (module, name) in _SAFE

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if allowed(module, name):
                return super().find_class(module, name)
            return type(name, (_Stub,), {"__module__": module})

    mod = types.ModuleType("ppmulti_stub_pickle")
    mod.Unpickler, mod.load, mod.__name__ = Unpickler, pickle.load, "ppmulti_stub_pickle"
    return mod


def _module_state(module, prefix: str = "") -> dict[str, Any]:
    """state_dict() of a (stub) nn.Module tree from its pickled _parameters/_buffers/_modules."""
    d = getattr(module, "__dict__", {})
    out: dict[str, Any] = {}
    skip = set(d.get("_non_persistent_buffers_set", ()))
    for key in ("_parameters", "_buffers"):
        for name, value in (d.get(key) or {}).items():
            if value is not None and name not in skip:
                out[prefix + name] = value
    for name, child in (d.get("_modules") or {}).items():
        if child is not None:
            out.update(_module_state(child, f"{prefix}{name}."))
    return out


def convert_file(weights: str, out: str, cfg: str = "yolov5s") -> dict[str, Any]:
    """Read a YOLOv5 .pt, rename it, check it against ppmulti's model for ``cfg``, write ``out`` (.pdparams)."""
    state = read_torch_state(weights)          # torch before paddle: the order tested in the bench venv
    conv = convert_state_dict(state)
    import paddle
    from ppdet.core.workspace import create

    from ppmulti.rank import config as config_mod
    from ppmulti.rank.engine.checkpoint import WEIGHTS, check_shapes
    from ppmulti.common.atomic import atomic_save
    from ppmulti.rank.yolo_config import resolve_cfg

    if not out.endswith(WEIGHTS):
        raise UserError(f"output {out}: give a {WEIGHTS} path (what --weights loads)")
    choice = resolve_cfg(cfg)
    over = dict(choice.overrides)
    if conv.num_classes is not None:
        over["num_classes"] = conv.num_classes
    if conv.anchors is not None:
        over["YOLOv5Head"] = {**over.get("YOLOv5Head", {}), "anchors": conv.anchors}
    model_cfg = config_mod.load(choice.config, over)
    model = create(model_cfg.architecture)
    missing, unexpected = check_shapes(model, conv.params, weights)
    if missing or unexpected:
        raise UserError(f"{weights} does not fit --cfg {cfg}: missing {missing[:3]}, unexpected {unexpected[:3]} "
                        f"(is it a different size? pass --cfg yolov5n/s/m/l/x)")
    tensors = {k: paddle.to_tensor(v) for k, v in conv.params.items()}
    atomic_save(out, lambda tmp: paddle.save(tensors, tmp))
    return {"weights": weights, "out": out, "cfg": cfg, "parameters": len(tensors),
            "num_classes": conv.num_classes, "anchors": conv.anchors, "dropped": len(conv.dropped)}
