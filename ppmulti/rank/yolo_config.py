"""YOLOv5's --cfg/--data/--hyp/--img/--optimizer as a ConfigEdit, applied to a loaded ppdet config (pure functions)."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ppmulti.common.errors import UserError, first_line
from ppmulti.common.hyp import HYP_NEUTRAL, HYP_NO_EQUIVALENT, load_hyp
from ppmulti.common.train_flags import OPTIMIZERS, wants_edit, yolo_style
from ppmulti.common.paths import CONFIGS
from ppmulti.common.yamlread import reader_ops
from ppmulti.rank.plan import ConfigEdit

log = logging.getLogger("ppmulti")


MODEL_SIZES = ("n", "s", "m", "l", "x")
ULTRA_FAMILIES = ("yolov8", "yolo11", "yolo26")



# ----------------------------------------------------------------------------- --cfg
def _shipped(relative: str) -> str:
    return str(CONFIGS / relative)


def model_names() -> dict[str, str]:
    """Bare model names that ``--cfg`` resolves, as YOLOv5 resolves its models/ folder."""
    names = {f"yolov5{s}": _shipped(f"yolov5/yolov5_{s}_300e_coco.yml") for s in MODEL_SIZES}
    for family in ULTRA_FAMILIES:   # ultralytics' model names: yolov8n, yolo11s, yolo26m, ...
        names.update({f"{family}{s}": _shipped(f"{family}/{family}_{s}_500e_coco.yml") for s in MODEL_SIZES})
    for s in ("s", "m", "l", "x"):
        for alias in (f"ppyoloe_{s}", f"ppyoloe-{s}", f"ppyoloe_crn_{s}", f"ppyoloe{s}"):
            names[alias] = _shipped(f"ppyoloe/ppyoloe_crn_{s}_300e_coco.yml")
    return names


@dataclass
class ModelChoice:
    """What ``--cfg`` resolved to: the ppdet config to load and what a YOLOv5 model yaml changes on it."""

    config: str
    overrides: dict[str, Any] = field(default_factory=dict)


def _yolov5_model_yaml(path: Path, raw: dict) -> ModelChoice:
    depth, width = raw.get("depth_multiple"), raw.get("width_multiple")
    if not isinstance(depth, (int, float)) or not isinstance(width, (int, float)):
        raise UserError(f"{path}: a YOLOv5 model yaml needs numeric depth_multiple and width_multiple")
    backbone, head = raw.get("backbone") or [], raw.get("head") or []
    if len(backbone) != 10 or len(head) != 15:
        raise UserError(f"{path}: only YOLOv5 v6 P5 layouts are built here (10 backbone and 15 head layers, "
                        f"as yolov5n/s/m/l/x.yaml); this one has {len(backbone)} and {len(head)}")
    over: dict[str, Any] = {"depth_mult": float(depth), "width_mult": float(width)}
    anchors = raw.get("anchors")
    if isinstance(anchors, list):
        try:
            pairs = [[[int(a[i]), int(a[i + 1])] for i in range(0, len(a), 2)] for a in anchors]
        except (TypeError, ValueError, IndexError):
            raise UserError(f"{path}: anchors must be 3 lists of width,height pairs, "
                            f"e.g. [10,13, 16,30, 33,23]") from None
        if len(pairs) != 3 or any(len(level) != 3 for level in pairs):
            raise UserError(f"{path}: anchors must give 3 levels of 3 anchors (P3/8, P4/16, P5/32)")
        over["YOLOv5Head"] = {"anchors": pairs}
    elif anchors is not None:
        raise UserError(f"{path}: anchors: {anchors!r} (a number means AutoAnchor, which ppmulti does not run); "
                        f"list the anchors")
    if isinstance(raw.get("nc"), int):
        over["num_classes"] = raw["nc"]
    return ModelChoice(_shipped("yolov5/yolov5_s_300e_coco.yml"), over)


def _ultra_model_yaml(path: Path, raw: dict) -> ModelChoice:
    """An ultralytics-form model yaml (``scales``, rows): UltraYOLO builds it; YOLO26's config when end-to-end."""
    family = "yolo26" if raw.get("end2end") else "yolo11"
    return ModelChoice(_shipped(f"{family}/{family}_n_500e_coco.yml"), {"UltraYOLO": {"model": str(path)}})


def resolve_cfg(cfg: str) -> ModelChoice:
    """``--cfg`` -> a ppdet config (and overrides when it is a YOLOv5 model yaml)."""
    import yaml

    path = Path(cfg)
    if path.is_file():
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise UserError(f"--cfg {cfg} is not valid YAML: {first_line(exc)}") from None
        if isinstance(raw, dict) and ("depth_multiple" in raw or "width_multiple" in raw):
            return _yolov5_model_yaml(path, raw)
        if isinstance(raw, dict) and isinstance(raw.get("backbone"), list) and isinstance(raw.get("head"), list):
            return _ultra_model_yaml(path, raw)
        return ModelChoice(str(path))
    key = path.name
    for suffix in (".yaml", ".yml"):
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    names = model_names()
    if key.lower() in names:
        return ModelChoice(names[key.lower()])
    raise UserError(f"--cfg {cfg}: no such file, and not a model name ppmulti knows "
                    f"({', '.join(sorted(n for n in names if n.startswith('yolov5')))}, ppyoloe_s/m/l/x, "
                    f"yolov8/yolo11/yolo26 n/s/m/l/x)")


# ----------------------------------------------------------------------------- --hyp


def _ops(section: dict | None, kind: str) -> list[dict]:
    return [op for op in (section or {}).get(kind, []) or [] if isinstance(op, dict)]


def _find_op(cfg, name: str) -> dict | None:
    ops = reader_ops(cfg, name)
    return ops[0] if ops else None


def _schedulers(cfg) -> list[dict]:
    return [s for s in cfg["LearningRate"].get("schedulers", []) or [] if isinstance(s, dict)]


def _decay(cfg) -> dict | None:
    for s in _schedulers(cfg):
        if s.get("name") in ("CosineDecay", "LinearDecay"):
            return s
    return None


def apply_hyp(cfg, hyp: dict, is_yolov5: bool) -> list[str]:
    """Write the hyp values onto the config; returns one note per value that has no effect here."""
    notes = []
    lr = cfg["LearningRate"]
    opt = cfg["OptimizerBuilder"]["optimizer"]
    if "lr0" in hyp:
        lr["base_lr"] = float(hyp["lr0"])
    if "lrf" in hyp and _decay(cfg) is not None:
        _decay(cfg)["min_lr_ratio"] = float(hyp["lrf"])
    if "momentum" in hyp:
        if opt.get("type") in ("Momentum", "MuSGD"):
            opt["momentum"] = float(hyp["momentum"])
        elif opt.get("type") in ("Adam", "AdamW"):
            opt["beta1"] = float(hyp["momentum"])
    if "weight_decay" in hyp:
        if opt.get("type") == "AdamW":
            opt["weight_decay"] = float(hyp["weight_decay"])
        else:
            cfg["OptimizerBuilder"]["regularizer"] = {"type": "L2", "factor": float(hyp["weight_decay"])}
    if "warmup_epochs" in hyp:
        _set_warmup(cfg, float(hyp["warmup_epochs"]))
    for key in ("warmup_bias_lr", "warmup_momentum"):   # YOLOv5's warmup on a YOLOv5 line (hooks.warmup)
        if key in hyp:
            cfg[key] = float(hyp[key])
    loss_keys = ("box", "cls", "obj", "cls_pw", "obj_pw", "anchor_t")
    if is_yolov5:
        loss = cfg["YOLOv5Loss"]
        weights = dict(loss.get("loss_weight") or {})
        for key in ("box", "cls", "obj"):
            if key in hyp:
                weights[key] = float(hyp[key])
        loss["loss_weight"] = weights
        for key in ("cls_pw", "obj_pw", "anchor_t"):
            if key in hyp:
                loss[key] = float(hyp[key])
    elif cfg.get("architecture") == "UltraYOLO":   # ultralytics' gains box, cls, dfl on its loss
        loss = cfg.setdefault(cfg["UltraYOLO"].get("loss", "UltraDetectionLoss"), {})
        for key in ("box", "cls", "dfl"):
            if key in hyp:
                loss[key] = float(hyp[key])
        notes += [f"hyp {k}={hyp[k]} is a YOLOv5 loss gain; ultralytics' loss has box, cls and dfl (not changed)"
                  for k in loss_keys if k in hyp and k not in ("box", "cls")]
    else:
        notes += [f"hyp {k}={hyp[k]} is a YOLOv5 loss gain; this model's loss has its own (not changed)"
                  for k in loss_keys if k in hyp]
    notes += _apply_augment(cfg, hyp)
    handled = {"perspective", "flipud"} if _find_op(cfg, "YOLOv5Mosaic") is not None else set()
    if cfg.get("architecture") == "UltraYOLO":
        handled.add("dfl")
    for key, why in HYP_NO_EQUIVALENT.items():
        if key not in hyp or key == "iou_t" or key in handled:   # iou_t: YOLOv5 reads it nowhere either
            continue
        neutral = HYP_NEUTRAL[key]
        if neutral is None or float(hyp[key]) != neutral:
            notes.append(f"hyp {key}={hyp[key]} has no effect here: {why}")
    return notes


def read_hyp(cfg) -> dict[str, float]:
    """The YOLOv5 hyps a resolved config trains with, read back from where ``apply_hyp`` writes them (the keys
    this config has a place for), for hyp.yaml on a line without --hyp (YOLOv5 writes its default hyps there)."""
    out: dict[str, float] = {}

    def put(key: str, value) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)

    put("lr0", cfg["LearningRate"].get("base_lr"))
    decay = _decay(cfg)
    if decay is not None:
        put("lrf", decay.get("min_lr_ratio"))
    opt = cfg["OptimizerBuilder"]["optimizer"]
    put("momentum", opt.get("momentum") if opt.get("type") in ("Momentum", "MuSGD") else opt.get("beta1"))
    regularizer = cfg["OptimizerBuilder"].get("regularizer") or {}
    put("weight_decay", opt.get("weight_decay") if opt.get("type") == "AdamW" else regularizer.get("factor"))
    warm = [s for s in _schedulers(cfg) if s.get("name") == "LinearWarmup"]
    put("warmup_epochs", warm[0].get("epochs") if warm else 0.0)
    for key in ("warmup_momentum", "warmup_bias_lr"):
        put(key, cfg.get(key))
    if is_yolov5(cfg):
        loss = cfg["YOLOv5Loss"]
        for key in ("box", "cls", "obj"):
            put(key, (loss.get("loss_weight") or {}).get(key))
        for key in ("cls_pw", "obj_pw", "anchor_t"):
            put(key, loss.get(key))
    mosaic = _find_op(cfg, "YOLOv5Mosaic")
    if mosaic is not None:
        for key, name in _MOSAIC_KEYS.items():
            put(key, mosaic.get(name))
        for op_name, keys in (("YOLOv5HSV", {"hsv_h": "hgain", "hsv_s": "sgain", "hsv_v": "vgain"}),
                              ("YOLOv5Flip", {"fliplr": "fliplr", "flipud": "flipud"})):
            op = _find_op(cfg, op_name) or {}
            for key, name in keys.items():
                put(key, op.get(name))
    else:
        flip = _find_op(cfg, "RandomFlip")
        if flip is not None:
            put("fliplr", flip.get("prob", 0.5))
    return out


def _set_warmup(cfg, epochs: float) -> None:
    scheds = cfg["LearningRate"].setdefault("schedulers", [])
    warm = [s for s in scheds if isinstance(s, dict) and s.get("name") == "LinearWarmup"]
    decay = _decay(cfg)
    if epochs <= 0:
        for s in warm:
            scheds.remove(s)
        if decay is not None:
            decay["use_warmup"] = False
        return
    if warm:
        warm[0]["epochs"], warm[0]["steps"] = epochs, None
    else:
        scheds.append({"name": "LinearWarmup", "start_factor": 0.0, "epochs": epochs})
    if decay is not None:
        decay["use_warmup"] = True


def _apply_augment(cfg, hyp: dict) -> list[str]:
    """YOLOv5's augmentation hyps onto the reader: ppmulti's YOLOv5 ops take the values unchanged; a config
    built from ppdet's own ops (Mosaic, AugmentHSV, RandomFlip) gets them converted where they have a meaning."""
    if _find_op(cfg, "YOLOv5Mosaic") is not None:
        return _apply_yolov5_ops(cfg, hyp)
    return _apply_ppdet_ops(cfg, hyp)


_MOSAIC_KEYS = {"mosaic": "prob", "degrees": "degrees", "translate": "translate", "scale": "scale",
                "shear": "shear", "perspective": "perspective", "mixup": "mixup"}


def _apply_yolov5_ops(cfg, hyp: dict) -> list[str]:
    notes = []
    mosaic = _find_op(cfg, "YOLOv5Mosaic")
    for key, name in _MOSAIC_KEYS.items():
        if key in hyp:
            mosaic[name] = float(hyp[key])
    for op_name, keys in (("YOLOv5HSV", {"hsv_h": "hgain", "hsv_s": "sgain", "hsv_v": "vgain"}),
                          ("YOLOv5Flip", {"fliplr": "fliplr", "flipud": "flipud"})):
        given = [k for k in keys if k in hyp]
        if not given:
            continue
        op = _find_op(cfg, op_name)
        if op is None:
            notes.append(f"hyp {', '.join(given)}: this config's pipeline has no {op_name} op (not changed)")
            continue
        for key in given:
            op[keys[key]] = float(hyp[key])
    return notes


def _apply_ppdet_ops(cfg, hyp: dict) -> list[str]:
    notes = []
    hsv = [k for k in ("hsv_h", "hsv_s", "hsv_v") if k in hyp]
    if hsv:
        op = _find_op(cfg, "AugmentHSV")
        if op is None:
            notes.append("hyp hsv_h/s/v: this config's pipeline has no AugmentHSV op (not changed)")
        else:
            # YOLOv5 multiplies H, S, V by 1 +- gain; ppdet's AugmentHSV adds +- gain in OpenCV units
            # (H 0-180, S and V 0-255). Equal effect at mid-range values (H 90, S and V 128).
            for key, ppdet_key, mid in (("hsv_h", "hgain", 90), ("hsv_s", "sgain", 128), ("hsv_v", "vgain", 128)):
                if key in hyp:
                    op[ppdet_key] = round(float(hyp[key]) * mid, 3)
    affine = [k for k in ("degrees", "translate", "scale", "shear", "mosaic", "mixup") if k in hyp]
    if affine:
        op = _find_op(cfg, "Mosaic")
        if op is None:
            notes.append(f"hyp {', '.join(affine)}: this config's pipeline has no Mosaic op (not changed)")
        else:
            if "degrees" in hyp:
                op["degrees"] = [-float(hyp["degrees"]), float(hyp["degrees"])]
            if "translate" in hyp:
                op["translate"] = [-float(hyp["translate"]), float(hyp["translate"])]
            if "scale" in hyp:
                op["scale"] = [1 - float(hyp["scale"]), 1 + float(hyp["scale"])]
            if "shear" in hyp:
                op["shear"] = [-float(hyp["shear"]), float(hyp["shear"])]
            if "mosaic" in hyp:
                op["prob"] = float(hyp["mosaic"])
            if "mixup" in hyp:
                op["enable_mixup"] = float(hyp["mixup"]) > 0
                op["mixup_prob"] = float(hyp["mixup"])
    if "fliplr" in hyp:
        op = _find_op(cfg, "RandomFlip")
        if op is None:
            notes.append("hyp fliplr: this config's pipeline has no RandomFlip op (not changed)")
        else:
            op["prob"] = float(hyp["fliplr"])
    return notes


# ----------------------------------------------------------------------------- --optimizer, --cos-lr, --imgsz
def apply_optimizer(cfg, name: str, hyp: dict) -> None:
    """Replace the optimizer section (ppdet merges dicts, so the old type's keys are removed here)."""
    builder = cfg["OptimizerBuilder"]
    old = builder["optimizer"]
    momentum = float(hyp.get("momentum", old.get("momentum", old.get("beta1", 0.937))))
    regularizer = builder.get("regularizer") or {}
    wd = float(hyp.get("weight_decay", old.get("weight_decay") if isinstance(old.get("weight_decay"), (int, float))
                       else regularizer.get("factor", 0.0005)))
    if name == "SGD":
        builder["optimizer"] = {"type": "Momentum", "momentum": momentum, "use_nesterov": True}
        builder["regularizer"] = {"type": "L2", "factor": wd}
    elif name == "MuSGD":   # built by the engine (engine.musgd_run), with ultralytics' parameter groups
        builder["optimizer"] = {"type": "MuSGD", "momentum": momentum, "use_nesterov": True}
        builder["regularizer"] = {"type": "L2", "factor": wd}
    elif name == "Adam":
        builder["optimizer"] = {"type": "Adam", "beta1": momentum, "beta2": 0.999}
        builder["regularizer"] = {"type": "L2", "factor": wd}
    elif name == "AdamW":
        builder["optimizer"] = {"type": "AdamW", "beta1": momentum, "beta2": 0.999, "weight_decay": wd}
        builder["regularizer"] = None
    else:
        raise UserError(f"--optimizer {name}: choose one of {', '.join(OPTIMIZERS)}")


def apply_schedule(cfg, cos_lr: bool) -> None:
    """YOLOv5's decay: linear by default, cosine with --cos-lr; both end at base_lr x lrf."""
    decay = _decay(cfg)
    epochs = int(cfg["epoch"])
    ratio = float(decay.get("min_lr_ratio", 0.01)) if decay else 0.01
    use_warmup = any(s.get("name") == "LinearWarmup" for s in _schedulers(cfg))
    new = {"name": "CosineDecay" if cos_lr else "LinearDecay", "max_epochs": epochs, "min_lr_ratio": ratio,
           "use_warmup": use_warmup}
    scheds = cfg["LearningRate"].setdefault("schedulers", [])
    if decay is not None:
        scheds[scheds.index(decay)] = new
    else:
        scheds.insert(0, new)


def apply_imgsz(cfg, imgsz: int) -> None:
    """Train and eval at ``imgsz``: eval size, Mosaic canvas, resize targets (multi-scale lists rescaled)."""
    if imgsz < 32 or imgsz % 32:
        raise UserError(f"--imgsz {imgsz}: use a multiple of 32 (the largest stride), e.g. {max(32, imgsz // 32 * 32)}")
    old = int(cfg.get("eval_height") or imgsz)
    cfg["eval_height"] = cfg["eval_width"] = imgsz
    for kind in ("sample_transforms", "batch_transforms"):
        for op in _ops(cfg.get("TrainReader"), kind):
            if "Mosaic" in op:
                op["Mosaic"]["input_dim"] = [imgsz, imgsz]
            if "YOLOv5Mosaic" in op:
                op["YOLOv5Mosaic"]["img_size"] = imgsz
            for name in ("BatchRandomResize", "RandomResize", "Resize"):
                body = op.get(name)
                if isinstance(body, dict) and "target_size" in body:
                    body["target_size"] = _rescale_sizes(body["target_size"], imgsz / old)
    if is_yolov5(cfg):
        cfg["YOLOv5Loss"]["img_size"] = imgsz
    from ppmulti.rank.config import sync_eval_size

    sync_eval_size(cfg)   # eval resize/pad, eval_size and the export shape follow the new height and width


def _rescale_sizes(sizes, factor: float):
    def one(v):
        return max(32, int(round(v * factor / 32)) * 32)

    if isinstance(sizes, (int, float)):
        return one(sizes)
    return [_rescale_sizes(s, factor) if isinstance(s, (list, tuple)) else one(s) for s in sizes]


# ----------------------------------------------------------------------------- --mosaic-buffer
def apply_mosaic_buffer(cfg, n: int) -> None:
    """--mosaic-buffer N: where YOLOv5Mosaic takes a mosaic's 3 extra tiles (its ``buffer``; 0: the whole set)."""
    mosaic = _find_op(cfg, "YOLOv5Mosaic")
    if mosaic is None:
        raise UserError("--mosaic-buffer needs the YOLOv5 reader (YOLOv5Mosaic in TrainReader); this config's "
                        "reader has none")
    if n < 0:
        raise UserError(f"--mosaic-buffer {n}: give 0 (extra tiles from the whole set) or a number of images")
    mosaic["buffer"] = n


# ----------------------------------------------------------------------------- --rect
def apply_rect(cfg) -> None:
    """YOLOv5's --rect: the dataset in aspect-ratio order, batches letterboxed to their own shape, no mosaic,
    no shuffle. The shapes are grouped per global batch, which the batch plan decides after this edit
    (``set_rect_batch``, called by the builder once the plan is made)."""
    if _find_op(cfg, "YOLOv5Mosaic") is None:
        raise UserError("--rect needs the YOLOv5 reader (YOLOv5Mosaic in TrainReader); this config's reader "
                        "has none")
    if cfg["TrainDataset"].get("name") != "YOLODataSet":
        raise UserError("--rect works with YOLOv5 data yamls (--data data.yaml); this dataset is "
                        f"{cfg['TrainDataset'].get('name')}")
    cfg["TrainDataset"]["rect"] = True
    cfg["TrainReader"]["shuffle"] = False
    _find_op(cfg, "YOLOv5Mosaic")["rect"] = True


def set_rect_batch(cfg, global_batch: int) -> None:
    """--rect's letterbox shapes per ``global_batch`` consecutive images: the batch plan's global batch (per-rank
    batch x world; a resumed run keeps its trained one). Paddle's DistributedBatchSampler gives each rank a
    contiguous slice of every global batch, so all ranks' batches of one step share a shape."""
    cfg["TrainDataset"]["rect_batch"] = int(global_batch)


def apply_val_rect(cfg, batch: int | None = None) -> str | None:
    """Evaluation's --rect (and a `ppmulti yolo` run's evaluation while training, engine.hooks.evaluation):
    ultralytics' val letterbox. The val images in aspect-ratio order, each EvalReader batch (``batch`` images when
    given, else the EvalReader's batch_size) letterboxed
    centred into its own shape (long side at the eval size, plus half a stride of margin: 288 x 288 for 256 x 256
    images at 256) instead of the square top-left one; UltraYOLO takes the margin back off and clips the boxes.
    Where the model or data cannot have it (`ppmulti yolo val` asks for it by default, as ultralytics' val) the
    config stays as it is and the reason is returned (None: applied)."""
    from ppmulti.rank.data.augment import VAL_RECT_PAD

    arch = cfg.get("architecture")
    dataset = cfg.get("EvalDataset")
    ops = list((cfg.get("EvalReader") or {}).get("sample_transforms") or [])
    names = [next(iter(op)) if isinstance(op, dict) else str(op) for op in ops]
    if arch != "UltraYOLO":
        return f"ultralytics' val letterbox is for YOLOv8/11/26 weights; {arch} evaluates with its config's letterbox"
    if not isinstance(dataset, dict) or dataset.get("name") != "YOLODataSet":
        return "it takes a YOLO data yaml's val split (--data DATA.yaml); this one evaluates square"
    size = int(cfg.get("eval_height") or 640)
    if int(cfg.get("eval_width") or size) != size:
        return (f"it letterboxes to one size; the config's eval size is {cfg.get('eval_height')} x "
                f"{cfg.get('eval_width')} (--imgsz N makes it one)")
    if "Resize" not in names:
        return "it replaces the EvalReader's Resize and Pad; this config's EvalReader has no Resize"
    letterbox = {"RectLetterbox": {"img_size": size}}
    if batch is not None:
        cfg["EvalReader"]["batch_size"] = int(batch)
    cfg["EvalReader"]["sample_transforms"] = [letterbox if n == "Resize" else op
                                              for n, op in zip(names, ops) if n != "Pad"]
    dataset.update({"rect": True, "rect_batch": int(cfg["EvalReader"]["batch_size"]), "rect_size": size,
                    "rect_pad": VAL_RECT_PAD})
    return None


# ----------------------------------------------------------------------------- --data
def apply_data(cfg, data: str, single_cls: bool) -> str:
    """A YOLOv5 data yaml, or a ppdet dataset config (COCO json), becomes the config's datasets."""
    import yaml

    path = Path(data)
    raw = None
    if path.is_file():
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            raw = None
    if isinstance(raw, dict) and "_BASE_" in raw:
        from ppmulti.common.yamlread import load_config_chain

        try:
            raw = load_config_chain(path)[0]
        except OSError as exc:
            raise UserError(f"--data {path}: a _BASE_ file it names cannot be read: {exc.filename or exc}") from None
        except yaml.YAMLError as exc:
            raise UserError(f"--data {path}: a _BASE_ file is not valid YAML: {first_line(exc)}") from None
    if isinstance(raw, dict) and any(k in raw for k in ("TrainDataset", "EvalDataset")):
        from ppmulti.rank import config as config_mod

        for key in ("TrainDataset", "EvalDataset", "TestDataset"):
            if key in raw:
                cfg[key].clear()
                cfg[key].update(config_mod.to_plain(raw[key]))
        for key in ("num_classes", "metric"):
            if key in raw:
                cfg[key] = raw[key]
        if single_cls:
            raise UserError("--single-cls works with YOLOv5 data yamls; a COCO json keeps its classes")
        return f"datasets from {path}"
    from ppmulti.rank.data.yolo import use_data_yaml

    spec = use_data_yaml(cfg, path, single_cls=single_cls)
    return f"YOLO dataset {spec.yaml_path}: {spec.nc} classes, root {spec.root}"


# ----------------------------------------------------------------------------- all of it, as one config edit


def is_yolov5(cfg) -> bool:
    """Whether the loaded config trains ppmulti's YOLOv5 (its loss section is set)."""
    section = cfg.get("YOLOv5Loss")
    return bool(section is not None and dict(section))


def edit_of(args: argparse.Namespace) -> ConfigEdit | None:
    """YOLOv5's config flags as data (None: none given; pure: entry.gather reads the model yaml and --hyp once
    before, so a bad one is refused before any rank starts)."""
    if not wants_edit(args):
        return None
    if getattr(args, "single_cls", False) and not getattr(args, "data", None):
        raise UserError("--single-cls needs --data (a YOLOv5 data yaml)")
    mosaic_buffer = getattr(args, "mosaic_buffer", None)
    if mosaic_buffer is not None and mosaic_buffer < 0:
        raise UserError(f"--mosaic-buffer {mosaic_buffer}: give 0 (extra tiles from the whole set) or a number "
                        f"of images")
    smoothing = getattr(args, "label_smoothing", None)
    return ConfigEdit(cfg=getattr(args, "cfg", None), data=getattr(args, "data", None),
                      single_cls=bool(getattr(args, "single_cls", False)), hyp=getattr(args, "hyp", None),
                      imgsz=int(args.imgsz) if getattr(args, "imgsz", None) else None,
                      optimizer=getattr(args, "optimizer", None), cos_lr=bool(getattr(args, "cos_lr", False)),
                      rect=bool(getattr(args, "rect", False)),
                      mosaic_buffer=mosaic_buffer,
                      label_smoothing=None if smoothing is None else float(smoothing),
                      every_epoch=yolo_style(args) and not getattr(args, "noval", False))


def apply_edit(cfg, edit: ConfigEdit) -> list[str]:
    """Apply YOLOv5's flags to the loaded config (in the rank): model yaml, data, image size, hyp, optimizer,
    schedule, label smoothing. Returns the notes to log (values that have no effect here)."""
    import copy

    from ppdet.core.workspace import merge_config

    choice = resolve_cfg(edit.cfg) if edit.cfg else None
    hyp = load_hyp(edit.hyp) if edit.hyp else {}
    notes: list[str] = []
    if choice is not None and choice.overrides:
        merge_config(copy.deepcopy(choice.overrides))
    if edit.data:
        log.info("%s", apply_data(cfg, edit.data, edit.single_cls))
    if edit.imgsz:
        apply_imgsz(cfg, int(edit.imgsz))
    if edit.optimizer:
        apply_optimizer(cfg, edit.optimizer, hyp)
    if hyp:
        notes += apply_hyp(cfg, hyp, is_yolov5(cfg))
    if edit.cos_lr:
        apply_schedule(cfg, cos_lr=True)
    elif choice is not None:
        apply_schedule(cfg, cos_lr=False)   # YOLOv5's default: linear decay to lrf
    if edit.every_epoch:
        cfg["snapshot_epoch"] = 1   # YOLOv5 validates and saves last after every epoch
    if edit.rect:
        apply_rect(cfg)   # its shapes' grouping: set_rect_batch, once the batch plan is made
    if edit.mosaic_buffer is not None:
        apply_mosaic_buffer(cfg, int(edit.mosaic_buffer))
    if edit.label_smoothing is not None:
        if not is_yolov5(cfg):
            raise UserError("--label-smoothing applies to YOLOv5 models (YOLOv5Loss); PP-YOLOE's loss has none")
        cfg["YOLOv5Loss"]["label_smoothing"] = float(edit.label_smoothing)
    return notes
