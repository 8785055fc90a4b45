"""Build YOLOv8 / YOLO11 / YOLO26 from a model description in ultralytics' yaml form, and describe the result.

A description has ``nc``, ``scales`` (per scale ``[depth, width, max_channels]``), ``backbone`` and ``head`` rows
``[from, repeats, module, args]``, and optionally ``reg_max`` and ``end2end``. As in ultralytics, the scale is
read from the file name: ``yolo11n.yaml`` is ``yolo11.yaml`` at scale ``n``. The network's layers sit in
``self.model`` (a LayerList), so parameter names are ultralytics' (``model.2.cv1.conv.weight``).
"""

from __future__ import annotations

import ast
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import paddle
import paddle.nn as nn

from ppmulti.common.errors import UserError
from ppmulti.common.paths import CONFIGS
from ppmulti.rank.models import ultra_blocks as B
from ppmulti.rank.models.ultra_head import UltraDetect

__all__ = ["ModelSpec", "load_spec", "guess_scale", "build_layers", "run_layers", "UltraDetectionModel",
           "model_summary", "count_parameters", "count_layers", "count_gflops", "SHIPPED_MODELS"]

log = logging.getLogger("ppmulti")

SHIPPED_DIR = CONFIGS / "ultralytics"
SHIPPED_MODELS = ("yolov8", "yolo11", "yolo26")

# ultralytics' parse_model: blocks whose first two arguments become (input channels, scaled output channels),
# and among them those whose repeat count is passed as their third argument.
_CHANNEL_BLOCKS = {"Conv": B.Conv, "DWConv": B.DWConv, "Bottleneck": B.Bottleneck, "C2f": B.C2f, "C3": B.C3,
                   "C3k2": B.C3k2, "SPPF": B.SPPF, "C2PSA": B.C2PSA}
_REPEAT_BLOCKS = {"C2f", "C3", "C3k2", "C2PSA"}
_MODULES = sorted([*_CHANNEL_BLOCKS, "Concat", "nn.Upsample", "Detect"])


@dataclass
class ModelSpec:
    """A model description with its scale resolved."""

    raw: dict
    scale: str
    path: str
    nc: int = 80
    depth: float = 1.0
    width: float = 1.0
    max_channels: float = float("inf")
    reg_max: int = 16
    end2end: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        """ultralytics' model name in its summary line: the file stem with 'yolo' written 'YOLO'."""
        return Path(self.path).stem.replace("yolo", "YOLO") or "Model"


def guess_scale(path: str) -> str:
    """The scale letter in a model file name (``yolo11n.yaml`` -> 'n', ``yolov8x-foo.yaml`` -> 'x'), or ''."""
    match = re.search(r"yolo(e-)?[v]?\d+([nslmx])", Path(path).stem)
    return match.group(2) if match else ""


def _unified(path: str) -> str:
    """The file holding all scales: ``yolov8x.yaml`` -> ``yolov8.yaml``."""
    return re.sub(r"(\d+)([nslmx])(.+)?$", r"\1\3", str(path))


def _find(name: str) -> Path | None:
    for candidate in (name, _unified(name)):
        path = Path(candidate)
        if path.is_file():
            return path
        shipped = SHIPPED_DIR / path.name
        if shipped.is_file():
            return shipped
    return None


def load_spec(model: str | dict, nc: int | None = None) -> ModelSpec:
    """Read a model description: a shipped name (``yolo11n.yaml``, ``yolov8s``), a path to an ultralytics-form
    yaml, or the dict itself (its ``scale`` key or ``yaml_file`` name giving the scale)."""
    import yaml

    if isinstance(model, dict):
        raw = dict(model)
        path = str(raw.get("yaml_file", ""))
    else:
        name = str(model)
        if not name.endswith((".yaml", ".yml")):
            name += ".yaml"
        found = _find(name)
        if found is None:
            raise UserError(f"model {model}: no such file, and not a shipped model description "
                            f"({', '.join(f'{m}[n|s|m|l|x].yaml' for m in SHIPPED_MODELS)})")
        try:
            raw = yaml.safe_load(found.read_text())
        except yaml.YAMLError as exc:
            raise UserError(f"model {found}: not valid YAML ({str(exc).splitlines()[0]})") from None
        if not isinstance(raw, dict) or "backbone" not in raw or "head" not in raw:
            raise UserError(f"model {found}: an ultralytics model yaml needs 'backbone' and 'head' lists")
        path = name
    scale = raw.get("scale") or guess_scale(path)
    spec = ModelSpec(raw=raw, scale=scale, path=path or "Model")
    spec.nc = int(nc if nc else raw.get("nc", 80))
    spec.reg_max = int(raw.get("reg_max", 16))
    spec.end2end = bool(raw.get("end2end", False))
    spec.depth = float(raw.get("depth_multiple", 1.0))
    spec.width = float(raw.get("width_multiple", 1.0))
    scales = raw.get("scales")
    if scales:
        if not scale:
            scale = next(iter(scales))
            log.warning("model %s: no scale in its name; using the first, '%s' (name it e.g. yolo11n.yaml)",
                        path, scale)
            spec.scale = scale
        if scale not in scales:
            raise UserError(f"model {path}: scale '{scale}' is not among its scales ({', '.join(scales)})")
        spec.depth, spec.width, spec.max_channels = (float(v) for v in scales[scale])
    return spec


def _resolve_args(args: list, names: dict) -> list:
    out = []
    for a in args:
        if isinstance(a, str):
            if a in names:
                a = names[a]
            else:
                try:
                    a = ast.literal_eval(a)
                except (ValueError, SyntaxError):
                    pass
        out.append(a)
    return out


def build_layers(spec: ModelSpec, ch: int = 3) -> tuple[nn.LayerList, list[int], list[Any], list[float]]:
    """The network's layers as ultralytics' parse_model builds them.

    Returns (layers, save, froms, strides): the indices whose outputs later layers read, each layer's 'from'
    and each layer's output stride.
    """
    names = {"nc": spec.nc, "reg_max": spec.reg_max, "end2end": spec.end2end}
    channels, strides = [ch], [1.0]
    layers, save, froms = [], [], []
    legacy = True   # YOLOv8's Detect class branch unless the model uses C3k2
    rows = list(spec.raw["backbone"]) + list(spec.raw["head"])
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) != 4:
            raise UserError(f"model {spec.path}: layer {i} must be [from, repeats, module, args], got {row!r}")
        f, n, module, args = row
        args = _resolve_args(list(args or []), names)
        if module not in _MODULES:
            raise UserError(f"model {spec.path}: layer {i} uses {module}, which ppmulti does not build "
                            f"(it builds {', '.join(_MODULES)})")
        n = max(round(n * spec.depth), 1) if n > 1 else n
        src = [f] if isinstance(f, int) else list(f)
        # channels[0] / strides[0] describe the input image, entry k + 1 layer k's output
        src_ch = [channels[x] if x < 0 else channels[x + 1] for x in src]
        src_stride = [strides[x] if x < 0 else strides[x + 1] for x in src]
        stride = src_stride[0]
        if module in _CHANNEL_BLOCKS:
            c1, c2 = src_ch[0], B.make_divisible(min(args[0], spec.max_channels) * spec.width, 8)
            args = [c1, c2, *args[1:]]
            if module in _REPEAT_BLOCKS:
                args.insert(2, n)
                n = 1
            if module == "C3k2":
                legacy = False
                if spec.scale in {"m", "l", "x"}:
                    args[3:4] = [True]
            cls = _CHANNEL_BLOCKS[module]
            blocks = [cls(*args) for _ in range(n)]
            if module == "SPPF" and len(args) <= 3:   # rows written before YOLO26: cv1 activated
                for block in blocks:
                    block.cv1.set_act(True)
            if module in ("Conv", "DWConv"):
                stride *= (args[3] if len(args) > 3 else 1)
        elif module == "Concat":
            c2 = sum(src_ch)
            blocks = [B.Concat(*args)]
        elif module == "nn.Upsample":
            c2 = src_ch[0]
            blocks = [B.Upsample(*args)]
            stride /= float(args[1])
        else:  # Detect
            nc = args[0] if args else spec.nc
            c2 = src_ch[0]
            blocks = [UltraDetect(nc, spec.reg_max, spec.end2end, src_ch, legacy=legacy, strides=src_stride)]
        layer = blocks[0] if len(blocks) == 1 else nn.Sequential(*blocks)
        save.extend(x % i for x in src if x != -1)
        layers.append(layer)
        froms.append(f)
        channels.append(c2)
        strides.append(stride)
    if not isinstance(layers[-1], UltraDetect):
        raise UserError(f"model {spec.path}: the last layer must be Detect")
    return nn.LayerList(layers), sorted(set(save)), froms, strides[1:]


def run_layers(layers: nn.LayerList, save: Sequence[int], froms: Sequence[Any], x: paddle.Tensor):
    """Forward through the layers, keeping the outputs later layers read."""
    outputs: list = []
    keep = set(save)
    for i, (layer, f) in enumerate(zip(layers, froms)):
        if f != -1:
            x = outputs[f] if isinstance(f, int) else [x if j == -1 else outputs[j] for j in f]
        x = layer(x)
        outputs.append(x if i in keep else None)
    return x


def count_parameters(model: nn.Layer) -> tuple[int, int]:
    """(parameters, gradients) as ultralytics counts them: Paddle keeps BatchNorm's running statistics as
    (frozen) parameters, torch as buffers, so they are left out; DFL's frozen integral is counted, not trained."""
    stats = set()
    for sub in model.sublayers(include_self=True):
        if isinstance(sub, nn.layer.norm._BatchNormBase):
            stats.update((id(sub._mean), id(sub._variance)))
    params = [p for p in model.parameters() if id(p) not in stats]
    return sum(int(p.numel()) for p in params), sum(int(p.numel()) for p in params if not p.stop_gradient)


def count_layers(layer: nn.Layer) -> int:
    """ultralytics' layer count: modules without children, each object once (its shared SiLU counts once)."""
    seen, count = set(), 0
    for sub in layer.sublayers(include_self=True):
        if id(sub) in seen:
            continue
        seen.add(id(sub))
        if not sub._sub_layers:
            count += 1
    return count


def count_gflops(model: nn.Layer, imgsz: int | Sequence[int] = 640) -> float:
    """GFLOPs at imgsz as ultralytics reports them (thop: 2 x multiply-adds of the convolutions, BatchNorms and
    the rest thop counts), measured on a stride-sized input and scaled to imgsz as thop's stride mode does."""
    from ppmulti.rank.models.ultra_flops import flops_at
    return flops_at(model, imgsz)


def model_summary(model: nn.Layer, name: str, imgsz: int = 640) -> tuple[str, int, int, int, float]:
    """(ultralytics' summary line, layers, parameters, gradients, GFLOPs)."""
    params, grads = count_parameters(model)
    n_layers = count_layers(model)
    gflops = count_gflops(model, imgsz)
    fs = f", {gflops:.1f} GFLOPs" if gflops else ""
    line = f"{name} summary: {n_layers:,} layers, {params:,} parameters, {grads:,} gradients{fs}"
    return line, n_layers, params, grads, gflops


class UltraDetectionModel(nn.Layer):
    """A YOLOv8 / YOLO11 / YOLO26 detector outside ppdet (tests, conversion): ``model(x)`` as ultralytics'
    DetectionModel (training: the head's raw dict; eval: the decoded tensor)."""

    def __init__(self, model: str | dict | ModelSpec = "yolo11n.yaml", nc: int | None = None, ch: int = 3,
                 verbose: bool = False):
        super().__init__()
        self.spec = model if isinstance(model, ModelSpec) else load_spec(model, nc)
        self.model, self.save, self.froms, self.strides = build_layers(self.spec, ch)
        if verbose:
            log.info(model_summary(self, self.spec.name)[0])

    @property
    def head(self) -> UltraDetect:
        return self.model[-1]

    def forward(self, x: paddle.Tensor):
        return run_layers(self.model, self.save, self.froms, x)
