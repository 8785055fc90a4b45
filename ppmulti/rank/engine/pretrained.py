"""A run's initial weights: --weights (a .pdparams, or a YOLOv5 .pt converted once and cached) and ppdet's
pretrain_weights (a path or a URL, downloaded through ppmulti's cache), with the head's class layers
re-initialised, and named in one line, when the weights were trained for another number of classes."""

from __future__ import annotations

import logging
import re
from typing import Any

from ppmulti.common.errors import UserError, first_line
from ppmulti.rank.engine import checkpoint as ckpt

log = logging.getLogger("ppmulti")


def load_initial_weights(model, cfg, weights: str | None) -> None:
    """``--weights`` if given, else the config's ``pretrain_weights``; nothing when neither is set."""
    if weights:
        path = weights
        if path.endswith((".pt", ".pth")):
            from ppmulti.rank.models.convert import pdparams_for

            path, read = pdparams_for(weights)
            if read is not None:
                from ppmulti.rank.models.ultra_convert import UltraWeights

                family = "ultralytics" if isinstance(read, UltraWeights) else "YOLOv5"
                log.info("%s: %s %s%s converted to ppmulti's weights, cached as %s", weights, family, read.kind,
                         f" ({read.cfg}, {read.num_classes} classes)" if read.cfg else "", path)
        state = ckpt.load_state(_with_suffix(path))
        load_matching(model, state, weights, cfg.get("num_classes"))
        return
    pretrain = cfg.get("pretrain_weights")
    if not pretrain:
        return
    from ppdet.utils.checkpoint import load_pretrain_weight

    from ppmulti.common import download

    local = str(download.paddle_weights(pretrain)) if download.is_url(pretrain) else pretrain
    try:
        load_pretrain_weight(model, local)
    except Exception as exc:  # a bad path, a damaged file
        raise UserError(f"pretrain_weights {pretrain} could not be loaded ({type(exc).__name__}: "
                        f"{first_line(exc)[:160]}); pass a readable .pdparams, "
                        f"or train from scratch with -o pretrain_weights=''") from None


def _with_suffix(path: str) -> str:
    import os

    p = path if path.endswith(ckpt.WEIGHTS) else path + ckpt.WEIGHTS
    if not os.path.isfile(p):
        raise UserError(f"--weights {path}: file not found")
    return p


def load_matching(model, weights: dict[str, Any], source: str, num_classes: int | None) -> list[str]:
    """Load ``weights`` into ``model``; entries of the head whose shapes differ only because the weights were
    trained for another number of classes keep their fresh initialisation (as YOLOv5's train.py and ppdet's
    loader do) and are named in one line; any other shape difference is refused. Returns the re-initialised."""
    own = model.state_dict()
    if weights and not any(k in own for k in weights):
        raise UserError(f"{source}: none of its {len(weights)} parameters is one of this model's (e.g. "
                        f"{next(iter(weights))}): the weights are for another architecture; pass the model they "
                        f"were trained as (--cfg yolov5s for a YOLOv5 .pt)")
    reinit: list[str] = []
    for key, value in weights.items():
        if key in own and list(own[key].shape) != list(value.shape):
            if not _class_layer(key, list(own[key].shape), list(value.shape)):
                raise UserError(f"{source}: parameter {key} has shape {list(value.shape)} but the model expects "
                                f"{list(own[key].shape)}: the weights are from another model (is --cfg the "
                                f"model they were trained as?)")
            reinit.append(key)
    if reinit:
        layers = sorted({k.rsplit(".", 1)[0] for k in reinit})
        out = reinit[-1]   # the last is the class output itself (ultralytics' cv3.<level>.2.bias)
        had = _classes_of(own[out].shape, weights[out].shape, num_classes)
        log.info("%d layers re-initialised for %s classes (the weights have %s): %s", len(layers),
                 num_classes if num_classes is not None else "this run's",
                 had if had is not None else "another number", ", ".join(layers))
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    if missing:
        log.warning("%s: %d model parameters not in the file (kept initialised), e.g. %s",
                    source, len(missing), ", ".join(missing[:3]))
    if unexpected:
        log.warning("%s: %d parameters in the file not used by the model, e.g. %s",
                    source, len(unexpected), ", ".join(unexpected[:3]))
    kept = {k: v for k, v in weights.items() if k in own and k not in reinit}
    model.set_state_dict({**kept, **{k: own[k] for k in own if k not in kept}})   # Paddle warns of absent keys
    return reinit


# ultralytics' class branches (model.<Detect>.cv3.<level>..., one2one_cv3 too): their width is
# max(channels, min(classes, 100)), so every layer of them may differ with the class count; ultralytics'
# own loading (intersect_dicts) keeps such layers initialised too
_ULTRA_CLASS_BRANCH = re.compile(r"^model\.\d+\.(one2one_)?cv3\.\d+\.")


def _class_layer(key: str, own: list[int], theirs: list[int]) -> bool:
    """A head parameter that differs only in its output size (the class count): same rank, same other dims."""
    if _ULTRA_CLASS_BRANCH.search(key):
        return len(own) == len(theirs)
    head = key.split(".", 1)[0].endswith("head")
    return head and len(own) == len(theirs) and own[1:] == theirs[1:] and own[0] != theirs[0]


def _classes_of(own_shape, their_shape, num_classes: int | None) -> int | None:
    """The weights' class count from a re-initialised output: YOLOv5's na x (5 + nc), or nc itself."""
    if num_classes is None:
        return None
    out, theirs = int(own_shape[0]), int(their_shape[0])
    if out == num_classes:
        return theirs
    if out % (num_classes + 5) == 0:
        na = out // (num_classes + 5)
        if theirs % na == 0:
            return theirs // na - 5
    return None


YOLOV5_SIZES = "nsmlx"


def resolve_weights_flag(args) -> list[str]:
    """``--weights`` as YOLOv5's train.py takes it, before any process starts (edits ``args``): a YOLOv5 release
    asset that is not on disk is downloaded once into the cache; a .pt names the model when --cfg and -c are
    absent (with its own anchors when AutoAnchor changed them: the -o items returned); a YOLOv5 command line
    without --weights starts from the model's release weights when they are on this machine already, and
    otherwise says in one line that it trains from scratch."""
    import sys
    from pathlib import Path

    from ppmulti.common import download, train_flags
    from ppmulti.common.envvars import worker_info

    weights = args.weights
    if weights and weights.endswith(".pt"):
        if not Path(weights).is_file():
            cached = (download.cached_yolov5(weights) or download.yolov5_weights(weights)
                      or download.ultra_weights(weights))
            if cached is None:
                raise UserError(f"--weights {weights}: file not found (the release files downloaded by name are "
                                f"{', '.join(download.YOLOV5_ASSETS)} and ultralytics' yolov8/yolo11/yolo26 "
                                f"n/s/m/l/x .pt)")
            args.weights = weights = str(cached)
        if not getattr(args, "cfg", None) and not args.config:
            from ppmulti.common import torchpt
            from ppmulti.rank.models import ultra_convert
            from ppmulti.rank.models.convert import read_pt

            obj = torchpt.load(weights)
            if ultra_convert.is_ultralytics(obj):
                found = ultra_convert.read_ultra_pt(weights, obj, arrays=False)
                if found.cfg is None:
                    raise UserError(f"--weights {weights}: its model ({found.model_name}) is not one of "
                                    f"yolov8/yolo11/yolo26 n/s/m/l/x; pass --cfg with its model yaml")
                args.cfg = found.cfg   # as ultralytics builds the model the checkpoint names
                return []
            found = read_pt(weights, arrays=False, obj=obj)
            if found.cfg is None:
                raise UserError(f"--weights {weights}: its model is not a YOLOv5 n/s/m/l/x; pass --cfg")
            args.cfg = found.cfg   # as YOLOv5 builds the model from the checkpoint's yaml
            anchors = _own_anchors(found)
            if anchors is not None:   # AutoAnchor's, kept in the checkpoint: YOLOv5 trains on with them
                if worker_info().rank == 0:
                    print(f"--weights {weights}: its own anchors replace {found.cfg}'s: {anchors}", file=sys.stderr)
                return [f"YOLOv5Head.anchors={anchors}"]
        return []
    if weights is not None or not train_flags.yolo_style(args) or args.resume or getattr(args, "evolve", None):
        return []
    size = _yolov5_size(getattr(args, "cfg", None))
    name = f"yolov5{size or 's'}.pt"
    cached = download.cached_yolov5(name) if size is not None else None
    if worker_info().rank == 0:
        if cached is not None:
            print(f"no --weights: starting from YOLOv5's pretrained {name} (found at {cached}), as YOLOv5 does; "
                  f"--weights '' trains from scratch", file=sys.stderr)
        else:
            print(f"no --weights: training from scratch (YOLOv5 would start from its pretrained {name}); "
                  f"--weights {name} downloads it once and starts from it, --weights '' says from scratch",
                  file=sys.stderr)
    if cached is not None:
        args.weights = str(cached)
    return []


# YOLOv5's P5 anchors (models/yolov5*.yaml), in pixels
DEFAULT_ANCHORS = [[[10, 13], [16, 30], [33, 23]], [[30, 61], [62, 45], [59, 119]], [[116, 90], [156, 198], [373, 326]]]


def _own_anchors(found) -> list | None:
    """The anchors a YOLOv5 .pt trained with (Detect.anchors x stride), when they are not YOLOv5's defaults."""
    from ppmulti.rank.models.convert import convert_state_dict

    grid = found.state.get("model.24.anchors")
    if grid is None:
        return None
    anchors = convert_state_dict({"model.24.anchors": grid.numpy()}).anchors
    same = all(abs(a - b) < 0.5 for lv, dv in zip(anchors, DEFAULT_ANCHORS) for p, d in zip(lv, dv)
               for a, b in zip(p, d))
    return None if same else [[[round(v, 2) for v in pair] for pair in level] for level in anchors]


def _yolov5_size(cfg: str | None) -> str | None:
    """n/s/m/l/x when --cfg names a YOLOv5 P5 model (yolov5s, yolov5s.yaml, models/yolov5s.yaml); else None."""
    if cfg is None:
        return "s"   # no --cfg: the -c config's model; YOLOv5's default weights are yolov5s.pt
    from pathlib import Path

    stem = Path(cfg).name.split(".")[0].lower()
    if len(stem) == 7 and stem.startswith("yolov5") and stem[-1] in YOLOV5_SIZES:
        return stem[-1]
    return None


def convert_file(weights: str, out: str, cfg: str = "yolov5s") -> dict[str, Any]:
    """Read a YOLOv5 .pt, rename it, check it against ppmulti's model for ``cfg``, write ``out`` (.pdparams)."""
    import numpy as np

    from ppmulti.rank.models.convert import convert_state_dict, read_torch_state

    conv = convert_state_dict(read_torch_state(weights))
    import paddle
    from ppdet.core.workspace import create

    from ppmulti.rank import config as config_mod
    from ppmulti.common.rundir import WEIGHTS
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
    own = model.state_dict()
    for key, value in conv.params.items():
        if key in own and list(own[key].shape) != list(np.shape(value)):
            raise UserError(f"{weights}: {key} has shape {list(np.shape(value))}, ppmulti's --cfg {cfg} expects "
                            f"{list(own[key].shape)} (is it a different size? pass --cfg yolov5n/s/m/l/x)")
    missing = [k for k in own if k not in conv.params]
    unexpected = [k for k in conv.params if k not in own]
    if missing or unexpected:
        raise UserError(f"{weights} does not fit --cfg {cfg}: missing {missing[:3]}, unexpected {unexpected[:3]} "
                        f"(is it a different size? pass --cfg yolov5n/s/m/l/x)")
    tensors = {k: paddle.to_tensor(v) for k, v in conv.params.items()}
    atomic_save(out, lambda tmp: paddle.save(tensors, tmp))
    return {"weights": weights, "out": out, "cfg": cfg, "parameters": len(tensors),
            "num_classes": conv.num_classes, "anchors": conv.anchors, "dropped": len(conv.dropped)}
