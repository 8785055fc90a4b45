"""The global batch a config's base_lr is tuned for (ref_batch): the config's own, -o, or PaddleDetection's docs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable


@dataclass(frozen=True)
class DocsEntry:
    """What PaddleDetection release/2.6 says a family's configs (those whose file name starts with ``prefix``,
    or all of them when it is empty) were trained on: ``gpus`` GPUs at the config's TrainReader batch_size
    each. ``source`` is the file under the PaddleDetection checkout and ``phrase`` the words there."""

    family: str
    gpus: int
    source: str
    phrase: str
    prefix: str = ""


# PaddleDetection release/2.6's own words, read by hand in its checkout (tests/test_ref_batch.py reads each phrase
# back from the checkout when one is present). A family's README wins over the general rule of the docs.
_GENERAL = ("docs/tutorials/GETTING_STARTED_cn.md", "默认学习率是适配多GPU训练(8x GPU)")
DOCS: tuple[DocsEntry, ...] = (
    DocsEntry("ppyoloe", 8, "configs/ppyoloe/README.md", "PP-YOLOE used 8 GPUs for mixed precision training"),
    DocsEntry("picodet", 4, "configs/picodet/README_en.md", "PicoDet used 4 GPUs for training"),
    DocsEntry("yolox", 8, "configs/yolox/README.md",
              "YOLOX模型训练过程中默认使用8 GPUs进行混合精度训练，默认每卡batch_size为8"),
    DocsEntry("yolov3", 8, "configs/yolov3/README.md", "YOLOv3模型训练过程中默认使用8 GPUs，总batch_size默认为64"),
    # trained on one card: PaddleDetection's quick start runs it as one process; "_1p" came with #7470
    # ("add yml for single npu")
    DocsEntry("yolov3", 1, "docs/tutorials/QUICK_STARTED.md",
              "python tools/train.py -c configs/yolov3/yolov3_mobilenet_v1_roadsign.yml --eval -o use_gpu=true",
              "yolov3_mobilenet_v1_roadsign"),
    DocsEntry("yolov3", 1, "configs/yolov3/yolov3_darknet53_original_320e_coco_1p.yml", "batch_size: 32",
              "yolov3_darknet53_original_320e_coco_1p"),
    DocsEntry("ppyolo", 4, "configs/ppyolo/README.md",
              "PP-YOLO_MobileNetV3 used 4 GPUs for training and mini-batch size as 32 on each GPU", "ppyolo_mbv3"),
    DocsEntry("ppyolo", 4, "configs/ppyolo/README.md", "| PP-YOLO               |     4      |     32     | ResNet18vd",
              "ppyolo_r18vd"),
    DocsEntry("ppyolo", 8, "configs/ppyolo/README.md",
              "PP-YOLO-tiny used 8 GPUs for training and mini-batch size as 32 on each GPU", "ppyolo_tiny"),
    DocsEntry("ppyolo", 8, "configs/ppyolo/README.md", "| PP-YOLOv2               |     8      |     12     |",
              "ppyolov2"),
    DocsEntry("ppyolo", 8, "configs/ppyolo/README.md",
              "PP-YOLO used 8 GPUs for training and mini-batch size as 24 on each GPU"),
    DocsEntry("ssd", 4, "configs/ssd/README.md", "SSD-VGG使用4GPU在总batch size为32下训练240个epoch", "ssd_vgg16"),
    DocsEntry("ssd", 2, "configs/ssd/README.md", "SSD-MobileNetv1使用2GPU在总batch size为64下训练120周期",
              "ssd_mobilenet_v1"),
    DocsEntry("retinanet", 4, "configs/retinanet/README.md",
              "Both ResNet101-FPN and ResNet50-FPN with [FGD](../slim/distill/README.md) are trained on COCO "
              "train2017 with 4 GPUs", "retinanet_r101"),
    DocsEntry("retinanet", 8, "configs/retinanet/README.md",
              "The ResNet50-FPN are trained on COCO train2017 with 8 GPUs"),
    DocsEntry("gfl", 8, "configs/gfl/README.md", "GFL is trained on COCO train2017 dataset with 8 GPUs"),
    DocsEntry("tood", 8, "configs/tood/README.md", "TOOD uses 8GPU to train 12 epochs"),
    DocsEntry("detr", 8, "configs/detr/README.md", "DETR uses 8GPU to train 500 epochs"),
    DocsEntry("deformable_detr", 8, "configs/deformable_detr/README.md",
              "Deformable DETR uses 8GPU to train 50 epochs"),
    DocsEntry("dino", 4, "configs/dino/README.md", "DINO uses 4GPU to train"),
    DocsEntry("yolof", 8, "configs/yolof/README.md",
              "YOLOF模型训练过程中默认使用8 GPUs进行混合精度训练，总batch_size默认为32"),
    DocsEntry("ttfnet", 8, "configs/ttfnet/README_en.md", "Larger training batch size: 8 GPUs, each GPU batch size=18",
              "pafnet_10x"),
    DocsEntry("res2net", 8, "configs/res2net/README.md", "all the above models are trained with 8 gpus"),
    DocsEntry("vitdet", 8, "configs/vitdet/README.md", "Base model is trained on 8x32G V100 GPU"),
) + tuple(DocsEntry(family, 8, *_GENERAL) for family in (
    "faster_rcnn", "cascade_rcnn", "mask_rcnn", "fcos", "dcn", "gn", "centernet", "sparse_rcnn", "convnext",
    "rcnn_enhance", "ssd", "ttfnet"))


@dataclass(frozen=True)
class Reference:
    """The reference batch of a run and, in words, where it came from."""

    ref_batch: int | None    # None: no reference anywhere; the lr is used as given
    source: str              # for the start line; "" for the config's own ref_batch
    from_docs: DocsEntry | None = None


def lookup(family: str, name: str) -> DocsEntry | None:
    """The docs entry of a config ``name`` (file stem) in ``family``: the longest matching prefix first."""
    hits = [e for e in DOCS if e.family == family and name.startswith(e.prefix)]
    return max(hits, key=lambda e: len(e.prefix), default=None)


def _family_of(path: Path) -> str | None:
    """``configs/<family>/x.yml`` or ``configs/<family>/_base_/x.yml`` -> family, for families in the table."""
    parts = path.parent.parts
    if parts and parts[-1] == "_base_":
        parts = parts[:-1]
    if len(parts) >= 2 and parts[-2] == "configs" and any(e.family == parts[-1] for e in DOCS):
        return parts[-1]
    return None


def _chain(path: Path, depth: int = 0) -> list[Path]:
    """The config and its _BASE_ files, the including file before its bases (so the user's file first)."""
    import yaml

    from ppmulti.common import yamlread

    if depth > 20 or not path.is_file():
        return []
    try:
        data = yaml.load(path.read_text(), Loader=yamlread._yaml_loader()) or {}
    except (OSError, yaml.YAMLError):
        return [path]
    bases = data.get("_BASE_") if isinstance(data, dict) else None
    out = [path]
    for base in [bases] if isinstance(bases, str) else bases or []:
        out += _chain(path.parent / str(base), depth + 1)
    return out


def _file_batch(path: Path) -> int | None:
    from ppmulti.common.yamlread import load_config_chain

    try:
        merged = load_config_chain(path)[0]
        return int((merged.get("TrainReader") or {}).get("batch_size"))
    except Exception:   # a base that does not load or has no batch: the caller falls back
        return None


def docs_reference(config: str | os.PathLike) -> Reference | None:
    """PaddleDetection's reference batch for a config in (or built on) its ``configs/<family>/`` tree: the
    first file of the _BASE_ chain that lies in a family of the table gives the family and the file name; the
    per-GPU batch is that file's TrainReader batch_size as written (not -o, not --batch)."""
    for path in _chain(Path(config)):
        family = _family_of(path.resolve()) or _family_of(path)
        if family is None:
            continue
        entry = lookup(family, path.stem)
        if entry is None:
            continue
        per_gpu = _file_batch(path) or _file_batch(Path(config))
        if not per_gpu:
            return None
        gpus = f"{entry.gpus} GPU{'s' if entry.gpus != 1 else ''}"
        return Reference(entry.gpus * per_gpu, f"PaddleDetection's {gpus} x {per_gpu} per GPU, {entry.source}",
                         entry)
    return None


def _override(overrides: Iterable[str] | dict | None):
    if isinstance(overrides, dict):
        return overrides.get("ref_batch")
    from ppmulti.common.flags import parse_overrides

    return parse_overrides(list(overrides or [])).get("ref_batch")


def resolve(cfg_ref_batch, config: str | os.PathLike, overrides: Iterable[str] | dict | None = None) -> Reference:
    """ref_batch from -o, else the config's, else PaddleDetection's docs for the config's family, else none."""
    from ppmulti.common.errors import UserError

    given = _override(overrides)
    if given is not None or cfg_ref_batch:
        value = given if given is not None else cfg_ref_batch
        try:
            ref = int(value)
        except (TypeError, ValueError):
            ref = 0
        if ref < 1 or str(value).strip() != str(ref):
            raise UserError(f"ref_batch {value!r}: give the global batch base_lr is tuned for, a positive integer "
                            f"(e.g. -o ref_batch=64)")
        # the config's own value is the ordinary case and goes unremarked on the start line
        return Reference(ref, f"-o ref_batch={ref}" if given is not None else "")
    found = docs_reference(config)
    if found is not None:
        return found
    return Reference(None, "no ref_batch in the config: base_lr as given; -o ref_batch=N scales it from the "
                           "global batch N it was tuned for")
