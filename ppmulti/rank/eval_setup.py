"""What tools/eval.py evaluates: the model's config (given, the run's, or inferred from weights) and val.py's flags."""

from __future__ import annotations

import argparse
import copy
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ppmulti.common.errors import UserError

# Parameter names of ppmulti's YOLOv5 (ppdet's CSPDarkNet P5 + YOLOv5Head) and of PP-YOLOE's head.
STEM = "backbone.stem.conv.weight"                          # [64 x width, 3, 6, 6]
FIRST_C3 = "backbone.layers2.stage1.csp_layer.bottlenecks."  # round(3 x depth) bottlenecks
YOLOV5_HEAD = "yolo_head.convs.0.weight"                    # [anchors x (classes + 5), C, 1, 1]
YOLOV5_ANCHORS_PER_LEVEL = 3
PPYOLOE_CLS = "yolo_head.pred_cls.0.weight"                 # [classes, C, 3, 3]

# (stem channels, bottlenecks of the first C3) -> YOLOv5 v6 size: widths 0.25-1.25, depths 0.33-1.33.
YOLOV5_SIZES = {(16, 1): "yolov5n", (32, 1): "yolov5s", (48, 2): "yolov5m", (64, 3): "yolov5l", (80, 4): "yolov5x"}


@dataclass
class EvalModel:
    """The config to load for the weights, what to merge onto it, and where it came from (one line, or '')."""

    config: str
    weights: str | None
    weights_classes: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    names: list[str] | None = None   # class names a YOLOv5 .pt carries (for detect/export without --data)
    from_pt: bool = False


PT_SUFFIXES = (".pt", ".pth")
ULTRA_CLS = re.compile(r"model\.\d+\.cv3\.0\.2\.bias")   # UltraYOLO's class output (first level)


def pt_file(weights: str) -> Path:
    """``--weights x.pt`` as training takes it: the file on disk, else a YOLOv5 release asset (yolov5s.pt) from the
    cache, downloaded into it once."""
    from ppmulti.common import download

    p = Path(weights)
    if p.is_file():
        return p
    found = (download.cached_yolov5(weights) or download.yolov5_weights(weights)
             or download.ultra_weights(weights))
    if found is None:
        raise UserError(f"--weights {weights}: file not found (the release files downloaded by name are "
                        f"{', '.join(download.YOLOV5_ASSETS)} and ultralytics' yolov8/yolo11/yolo26 n/s/m/l/x .pt)")
    return Path(found)


def weights_file(weights: str) -> Path:
    """``--weights`` as a .pdparams path: a file, a stem without the suffix, or a run directory (weights/best)."""
    p = Path(weights)
    if p.suffix in PT_SUFFIXES:
        return pt_file(weights)
    if p.is_dir():
        if (p / "weights" / "best.pdparams").is_file():
            return p / "weights" / "best.pdparams"
        raise UserError(f"--weights {weights}: a directory without weights/best.pdparams; pass a .pdparams file")
    if not p.is_file() and Path(f"{p}.pdparams").is_file():
        p = Path(f"{p}.pdparams")
    if not p.is_file():
        raise UserError(f"--weights {weights}: file not found")
    return p


def run_config(weights: Path) -> Path | None:
    """The config.yml of the weights' run (RUN/weights/x.pdparams -> RUN/config.yml), or one beside them."""
    places = [weights.parent] + ([weights.parent.parent] if weights.parent.name == "weights" else [])
    return next((d / "config.yml" for d in places if (d / "config.yml").is_file()), None)


def weights_classes(state: Mapping[str, Any]) -> int | None:
    """The number of classes a YOLOv5 or PP-YOLOE head in ``state`` predicts (None: another head)."""
    if YOLOV5_HEAD in state:
        return int(state[YOLOV5_HEAD].shape[0]) // YOLOV5_ANCHORS_PER_LEVEL - 5
    if PPYOLOE_CLS in state:
        return int(state[PPYOLOE_CLS].shape[0])
    ultra = next((k for k in state if ULTRA_CLS.fullmatch(k)), None)   # UltraYOLO (YOLOv8/11/26)
    if ultra is not None:
        return int(state[ultra].shape[0])
    return None


def infer_yolov5(state: Mapping[str, Any], source: str) -> str:
    """yolov5n/s/m/l/x from the weights' shapes: stem channels give the width, the first C3's blocks the depth."""
    if STEM not in state or YOLOV5_HEAD not in state:
        raise UserError(f"{source}: no config.yml in its run directory and not YOLOv5 weights; "
                        f"pass -c CONFIG or --cfg MODEL (e.g. --cfg yolov5s)")
    blocks = len({k[len(FIRST_C3):].split(".")[0] for k in state if k.startswith(FIRST_C3)})
    stem = int(state[STEM].shape[0])
    name = YOLOV5_SIZES.get((stem, blocks))
    if name is None:
        raise UserError(f"{source}: a YOLOv5 stem of {stem} channels with {blocks} blocks per C3 is none of "
                        f"yolov5n/s/m/l/x; pass --cfg with its model yaml")
    return name


def resolve_model(args: argparse.Namespace) -> EvalModel:
    """-c, else --cfg, else the run's config.yml beside the weights, else a YOLOv5 size inferred from them."""
    from ppmulti.rank.engine.checkpoint import load_state
    from ppmulti.rank.yolo_config import model_names, resolve_cfg

    if args.config and args.cfg:
        raise UserError(f"give the model once: -c {args.config} or --cfg {args.cfg}, not both")
    path = weights_file(args.weights) if args.weights else None
    if path is not None and path.suffix in PT_SUFFIXES:
        return pt_model(args, path)
    state = load_state(path) if path else {}
    nc = weights_classes(state)
    weights = str(path) if path else None
    if args.config:
        return EvalModel(args.config, weights, nc)
    if args.cfg:
        choice = resolve_cfg(args.cfg)
        return EvalModel(choice.config, weights, nc, dict(choice.overrides))
    if path is None:
        raise UserError("no weights given: pass --weights W.pdparams (or a run directory), "
                        "with -c CONFIG or --cfg MODEL")
    found = run_config(path)
    if found is not None:
        return EvalModel(str(found), weights, nc, note=f"model: {found} (the run's resolved config)")
    if not args.data:
        raise UserError(f"{path}: no config.yml in its run directory, so the data is unknown: pass --data DATA.yaml")
    name = infer_yolov5(state, str(path))
    return EvalModel(model_names()[name], weights, nc, {"num_classes": nc},
                     note=f"model: {name} inferred from {path.name} ({nc} classes, COCO anchors; "
                          f"pass --cfg MODEL.yaml for other anchors)")


def pt_model(args: argparse.Namespace, path: Path) -> EvalModel:
    """A YOLOv5 .pt (read without torch; its ema when it has one, as YOLOv5's val/detect load it): -c or --cfg
    when given, else the model size, classes, names and anchors the checkpoint holds. The loader converts it once
    and caches the conversion beside it (ppmulti/rank/models/convert.py)."""
    from ppmulti.rank.engine.pretrained import _own_anchors
    from ppmulti.rank.models.convert import read_pt
    from ppmulti.rank.yolo_config import model_names

    from ppmulti.common import torchpt
    from ppmulti.rank.models import ultra_convert

    obj = torchpt.load(str(path))
    if ultra_convert.is_ultralytics(obj):
        return _ultra_pt_model(args, path, ultra_convert.read_ultra_pt(str(path), obj, arrays=False))
    read = read_pt(str(path), prefer="ema", arrays=False, obj=obj)
    nc = read.num_classes
    head = read.state.get("model.24.m.0.weight")
    if nc is None and head is not None:
        nc = int(head.shape[0]) // YOLOV5_ANCHORS_PER_LEVEL - 5
    names = read.names if read.names and len(read.names) == nc else None
    given = _given_model(args, path, nc, names)
    if given is not None:
        return given
    if read.cfg is None:
        raise UserError(f"--weights {args.weights}: its model is not a YOLOv5 v6/v7 n/s/m/l/x (the checkpoint "
                        f"holds no model yaml of those sizes); pass --cfg MODEL.yaml")
    overrides: dict[str, Any] = {"num_classes": nc} if nc is not None else {}
    anchors = _own_anchors(read)
    if anchors is not None:   # AutoAnchor's, kept in the checkpoint: YOLOv5 detects with them
        overrides["YOLOv5Head"] = {"anchors": anchors}
    return EvalModel(model_names()[read.cfg], str(path), nc, overrides, names=names, from_pt=True,
                     note=f"model: {read.cfg} from {path.name} (YOLOv5 {read.kind}, {nc} classes"
                          f"{', its own anchors' if anchors is not None else ''})")


def _given_model(args: argparse.Namespace, path: Path, nc, names) -> EvalModel | None:
    """A .pt's model as -c or --cfg names it, when one of them is given."""
    from ppmulti.rank.yolo_config import resolve_cfg

    if args.config:
        return EvalModel(args.config, str(path), nc, from_pt=True)
    if args.cfg:
        choice = resolve_cfg(args.cfg)
        return EvalModel(choice.config, str(path), nc, dict(choice.overrides), names=names, from_pt=True)
    return None


def _ultra_pt_model(args: argparse.Namespace, path: Path, read) -> EvalModel:
    """An ultralytics .pt (YOLOv8/11/26; its ema first, as ultralytics' val loads it): -c or --cfg when given,
    else the shipped config of its family with the model description, classes and names it holds."""
    from ppmulti.rank.yolo_config import model_names

    nc = read.num_classes
    names = read.names if read.names and len(read.names) == nc else None
    given = _given_model(args, path, nc, names)
    if given is not None:
        return given
    family = "yolo26" if read.yaml.get("end2end") else "yolo11"
    config = model_names()[read.cfg] if read.cfg else model_names()[f"{family}n"]
    # the checkpoint's own description (a custom layout builds as saved); its scale is in its yaml or file name
    overrides = {"num_classes": nc, "UltraYOLO": {"model": read.cfg + ".yaml" if read.cfg else read.yaml}}
    return EvalModel(config, str(path), nc, overrides, names=names, from_pt=True,
                     note=f"model: {read.cfg or read.model_name} from {path.name} (ultralytics {read.kind}, "
                          f"{nc} classes)")


def _names_dataset(cfg, names: list[str]) -> None:
    """The .pt's class names as the TestDataset categories that detect draws and export writes."""
    from ppmulti.rank.data.yolo import cache_json, coco_json

    test = cfg["TestDataset"]
    test.clear()
    test.update({"name": "ImageFolder", "anno_path": cache_json(coco_json([], names), "names")})


def _nms_sections(cfg) -> list[dict]:
    """The ``nms`` settings of the architecture's parts (the YOLOv5 and PP-YOLOE heads hold MultiClassNMS), or
    of the architecture itself (UltraYOLO's ``nms``)."""
    parts = dict(cfg.get(cfg.get("architecture")) or {})
    out = [parts["nms"]] if isinstance(parts.get("nms"), dict) else []
    for part in parts.values():
        section = cfg.get(part) if isinstance(part, str) else None
        if isinstance(section, dict) and isinstance(dict(section).get("nms"), dict):
            out.append(section["nms"])
    return out


def val_edit(args: argparse.Namespace, model: EvalModel) -> Callable[[Any], None]:
    """YOLOv5 val.py's flags as one edit of the loaded config: --data, --img, NMS thresholds, batch, workers."""

    def edit(cfg) -> None:
        from ppdet.core.workspace import merge_config

        from ppmulti.rank.yolo_config import apply_data, apply_imgsz

        if model.overrides:
            merge_config(copy.deepcopy(model.overrides))
        if model.from_pt and not args.data and not args.config:
            raise UserError(f"--weights {args.weights}: pass --data DATA.yaml, the data to evaluate on (YOLOv5's "
                            f"val.py takes coco128.yaml when none is given; ppmulti downloads no data set)")
        if args.data:
            if "EvalDataset" in cfg:
                cfg["EvalDataset"].clear()   # so that a --data without a val split cannot leave the old one in place
            apply_data(cfg, args.data, bool(args.single_cls))
            if not dict(cfg.get("EvalDataset") or {}):
                raise UserError(f"--data {args.data}: no val split to evaluate; add val: <images dir, list or .txt>")
        if model.weights_classes is not None and model.weights_classes != int(cfg["num_classes"]):
            where = f"--data {args.data} has nc={cfg['num_classes']}" if args.data else \
                f"config {model.config} has num_classes={cfg['num_classes']}"
            raise UserError(f"{model.weights} predicts {model.weights_classes} classes but {where}; "
                            f"pass the --data the weights were trained on")
        if args.imgsz:
            apply_imgsz(cfg, int(args.imgsz))
        nms = {"score_threshold": args.conf_thres, "nms_threshold": args.iou_thres, "keep_top_k": args.max_det}
        nms = {k: v for k, v in nms.items() if v is not None}
        if nms:
            sections = _nms_sections(cfg)
            if not sections:
                raise UserError(f"--conf-thres/--iou-thres/--max-det: {cfg.get('architecture')}'s parts have no "
                                f"nms section to set; drop these flags")
            for section in sections:
                section.update(nms)
        if args.batch is not None:
            cfg["EvalReader"]["batch_size"] = int(args.batch)
        if args.workers is not None:
            cfg["worker_num"] = int(args.workers)
        pick_end2end(cfg, getattr(args, "end2end", None))
        if getattr(args, "rect", False):
            from ppmulti.rank.yolo_config import apply_val_rect

            problem = apply_val_rect(cfg)
            if problem is not None:
                print(f"WARNING: rect (--rect) not applied: {problem}", file=sys.stderr, flush=True)
        if args.use_gpu is not None:
            cfg["use_gpu"] = args.use_gpu
        from ppmulti.rank.data.agree import agree_weights_data

        agree_weights_data(cfg, model.config)   # the data's categories against num_classes, before any image

    return edit


def resolve_onnx_model(args: argparse.Namespace) -> tuple[str, str]:
    """The config for an exported .onnx file (its pre-processing and class names): -c, else the config the file
    carries (ppmulti's exports keep it in their metadata: a file exported from a .pt, or copied away from its run,
    predicts alone), else the config.yml of the run it was exported from (RUN/weights/best.onnx -> RUN/config.yml);
    returns (config, note)."""
    from ppmulti.rank.engine.onnx_export import card_config, read_metadata

    path = Path(args.weights)
    if not path.is_file():
        raise UserError(f"--weights {args.weights}: file not found")
    if args.config:
        return args.config, ""
    card = card_config(read_metadata(path))
    if card is not None:
        return card_file(*card), f"model: the config {path.name} was exported with, run by onnxruntime"
    found = run_config(path)
    if found is None:
        raise UserError(f"--weights {args.weights}: no config in the file (not exported by ppmulti's "
                        f"tools/export.py) and no config.yml in its run directory (RUN/weights/x.onnx -> "
                        f"RUN/config.yml); pass -c CONFIG, the config it was exported from")
    return str(found), f"model: {found} (the run's resolved config), run by onnxruntime"


def card_file(config: dict[str, Any], names: list[str]) -> str:
    """An ONNX file's stored config written where ppdet's loader reads it (a temp file named by its content), its
    TestDataset giving the stored class names."""
    import yaml

    from ppmulti.rank.data.yolo import cache_json, cache_text, coco_json

    test = {"name": "ImageFolder", "anno_path": cache_json(coco_json([], names), "names")}
    return cache_text(yaml.safe_dump({**config, "TestDataset": test}, sort_keys=False), "onnx-config", ".yml")


def pick_end2end(cfg, end2end: str | None) -> None:
    """--end2end (eval and detect): YOLO26's head, "true" the one-to-one branch without NMS, "false" the one-to-many
    branch through NMS; None keeps the config's. Other models have one head: nothing to pick."""
    if end2end is not None and cfg.get("architecture") == "UltraYOLO":
        cfg["UltraYOLO"]["end2end"] = end2end == "true"


def detect_edit(imgsz: int | None, use_gpu: bool | None, model: EvalModel | None = None,
                one_image: bool = True, end2end: str | None = None) -> Callable[[Any], None]:
    """tools/detect.py's (and export's) edit of the loaded config: the model's overrides, --imgsz, the device, with
    ``one_image`` one image per TestReader batch, and ``end2end`` (--end2end's text: pick_end2end)."""

    def edit(cfg) -> None:
        from ppdet.core.workspace import merge_config

        from ppmulti.rank.yolo_config import apply_imgsz

        if model is not None and model.overrides:
            merge_config(copy.deepcopy(model.overrides))
        if model is not None and model.weights_classes is not None \
                and model.weights_classes != int(cfg["num_classes"]):
            raise UserError(f"{model.weights} predicts {model.weights_classes} classes but config {model.config} "
                            f"has num_classes={cfg['num_classes']}; pass the config the weights were trained with")
        if model is not None and model.names:
            _names_dataset(cfg, model.names)
        if imgsz:
            apply_imgsz(cfg, int(imgsz))
        if one_image:
            cfg["TestReader"]["batch_size"] = 1
        if use_gpu is not None:
            cfg["use_gpu"] = use_gpu
        pick_end2end(cfg, end2end)

    return edit
