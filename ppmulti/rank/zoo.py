"""Which of PaddleDetection's config families ppmulti trains: detection only; keypoint, MOT, rotated-box and
segmentation configs are refused at start, by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml

from ppmulti.common.errors import UserError

# ppdet 2.6.0's architectures (ppdet/modeling/architectures) and PaddleDetection release/2.6's configs/ that are not
# box detectors. Read by hand from both; a name ppdet 2.6.0 does not have (PETR, VitPose) is still refused by name.
KEYPOINT_ARCHITECTURES = frozenset({"TopDownHRNet", "HigherHRNet", "TinyPose3DHRNet", "TinyPose3DHRHeatmapNet",
                                    "METRO_Body", "PETR", "VitPose_TopDown"})
MOT_ARCHITECTURES = frozenset({"JDE", "FairMOT", "DeepSORT", "ByteTrack", "CenterTrack", "OCSORT", "BOTSORT"})
ROTATED_ARCHITECTURES = frozenset({"S2ANet"})
SEGMENTATION_ARCHITECTURES = frozenset({"MaskRCNN", "SOLOv2", "QueryInst", "SparseInst", "CondInst"})
# the metric names ppdet's Trainer evaluates each family with (ppdet/engine/trainer.py, _init_metrics)
METRIC_KINDS = {"KeyPointTopDownCOCOEval": "keypoint", "KeyPointTopDownMPIIEval": "keypoint",
                "Pose3DEval": "keypoint", "MOT": "MOT", "MCMOT": "MOT", "KITTI": "MOT", "RBOX": "rotated-box"}
# the architecture sub-keys that make a box detector (Cascade R-CNN, Faster R-CNN) an instance-segmentation one
MASK_KEYS = ("mask_head", "mask_post_process")


def kind(cfg: Mapping[str, Any]) -> tuple[str, str] | None:
    """(family, why) for a config ppmulti does not train, e.g. ("keypoint", "architecture TopDownHRNet"); None for a
    detection config. ``cfg`` is a loaded config (ppdet's, or a plain dict of the same keys)."""
    arch = cfg.get("architecture")
    arch = arch if isinstance(arch, str) else None
    for family, names in (("keypoint", KEYPOINT_ARCHITECTURES), ("MOT", MOT_ARCHITECTURES),
                          ("rotated-box", ROTATED_ARCHITECTURES), ("segmentation", SEGMENTATION_ARCHITECTURES)):
        if arch in names:
            return family, f"architecture {arch}"
    metric = cfg.get("metric")
    if isinstance(metric, str) and metric in METRIC_KINDS:
        return METRIC_KINDS[metric], f"metric {metric}"
    section = cfg.get(arch) if arch else None
    if isinstance(section, Mapping):
        for key in MASK_KEYS:
            if section.get(key):
                return "segmentation", f"{arch}.{key} {section.get(key)}"
    return None


class _TolerantLoader(yaml.SafeLoader):
    """YAML as PaddleDetection writes it, each ``!Tag`` read as its plain mapping, list or value: ppdet's own loader
    builds tagged objects while it reads, which fails for some configs ppdet 2.6.0 does not know (e.g. release/2.6's
    HigherHRNet dataset) before their family could be named."""


def _untagged(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)


_TolerantLoader.add_multi_constructor("!", _untagged)


def read_tree(path: Path, depth: int = 0) -> dict[str, Any]:
    """A config file with its ``_BASE_`` files merged under it (later files and the file itself win, nested
    sections merged key by key, as ppdet's load_config does), tags ignored. Raises OSError or yaml.YAMLError."""
    data = yaml.load(Path(path).read_text(), Loader=_TolerantLoader) or {}
    if not isinstance(data, dict) or depth > 20:
        return {}
    merged: dict[str, Any] = {}
    for base in data.pop("_BASE_", None) or []:
        _merge(merged, read_tree(Path(path).parent / str(base), depth + 1))
    _merge(merged, data)
    return merged


def _merge(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    for key, value in other.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def refuse_unsupported(path: Any) -> None:
    """One line, before ppdet reads the config or anything is built, for a config of a family ppmulti does not
    train. A file that cannot be read here is left to ppdet's loader, which names the problem."""
    try:
        cfg = read_tree(Path(path))
    except (OSError, yaml.YAMLError):
        return
    found = kind(cfg)
    if found is not None:
        family, why = found
        raise UserError(f"{path} is a {family} config ({why}): ppmulti trains detection configs only "
                        f"(boxes and classes); use PaddleDetection's own tools/train.py for this one")
