"""Which of PaddleDetection's config families ppmulti trains: detection only; keypoint, MOT, rotated-box and
segmentation configs are refused at start, by name."""

from __future__ import annotations

from typing import Any, Mapping

import yaml

from ppmulti.common.errors import UserError
from ppmulti.common.yamlread import load_config_chain

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
# Architectures whose parameters go unused in some steps, whose PaddleDetection configs do not set
# find_unused_parameters: on several ranks Paddle's reducer stops in the first steps with "parameter ... has been
# ready before. Please set find_unused_parameters=True" (seen with cascade_rcnn_r50_fpn_1x_coco on 2 CPU ranks).
NEEDS_UNUSED_PARAMETERS = {"CascadeRCNN": "its later stages get no positive RoIs in some steps"}
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


def refuse_unsupported(path: Any) -> None:
    """One line, before ppdet reads the config or anything is built, for a config of a family ppmulti does not
    train. A file that cannot be read here is left to ppdet's loader, which names the problem."""
    try:
        cfg, _ = load_config_chain(path)
    except (OSError, yaml.YAMLError, UserError):
        return
    found = kind(cfg)
    if found is not None:
        family, why = found
        raise UserError(f"{path} is a {family} config ({why}): ppmulti trains detection configs only "
                        f"(boxes and classes); use PaddleDetection's own tools/train.py for this one")


def find_unused_parameters(cfg: Mapping[str, Any], world: int) -> tuple[bool, str | None]:
    """The ``find_unused_parameters`` the ranks' DataParallel gets, and a line for the run log when ppmulti chose it:
    the config's own key when it has one (PaddleDetection's DETR, GFL, PicoDet ... configs set it), on for the
    architectures known to need it (NEEDS_UNUSED_PARAMETERS) on several ranks, off otherwise."""
    if "find_unused_parameters" in cfg and cfg.get("find_unused_parameters") is not None:
        return bool(cfg.get("find_unused_parameters")), None
    arch = cfg.get("architecture")
    if world > 1 and isinstance(arch, str) and arch in NEEDS_UNUSED_PARAMETERS:
        return True, (f"find_unused_parameters: on for {arch} on {world} ranks ({NEEDS_UNUSED_PARAMETERS[arch]}; "
                      f"without it Paddle stops with 'parameter ... has been ready before'); "
                      f"-o find_unused_parameters=false turns it off")
    return False, None
