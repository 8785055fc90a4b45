"""A config newer than the ppdet it runs on: every module, module argument, reader op and op argument a loaded
config names is looked up in ppdet's workspace and reader (with ppmulti's additions) before anything is built, and
the first one missing is said in one line naming the PaddleDetection release it comes from."""

from __future__ import annotations

import inspect
from typing import Any, Iterator, Mapping

from ppmulti.common.errors import UserError

# What PaddleDetection's release/2.7 and develop register that release/2.6 (= paddledet 2.6.0) does not: read from
# the `@register` / `@register_op` classes and their __init__ arguments under ppdet/ in PaddleDetection's git
# (branches release/2.6, release/2.7, develop). Names ppmulti adds (RT-DETR's) are found in the workspace first.
RELEASE_27 = "release/2.7"
DEVELOP = "develop (after release/2.7)"
NEWER_MODULES = {
    **{name: RELEASE_27 for name in (
        "ARSL_FCOS", "CLRFPN", "CLRHead", "CLRNet", "CLRNetLoss", "CLRResNet", "COCODetDataset", "CULaneDataSet",
        "DETRBBoxSemiPostProcess", "DETRPostProcess", "DETR_SSOD", "FCOSHead_ARSL", "FCOSLossCR", "FCOSLossMILC",
        "FocalNet", "GroupDINOTransformer", "HybridEncoder", "KeypointTopDownCocoWholeBodyHandDataset", "MaskDINO",
        "MaskDINOHead", "MaskDINOLoss", "PPHGNetV2", "QRDeformableTransformer", "RTDETRTransformer",
        "SimpleFeaturePyramid", "TopdownHeatmapSimpleHead", "TransformerLayer", "ViT", "VisionTransformer2D",
        "VitPosePostProcess", "VitPose_TopDown")},
    **{name: DEVELOP for name in ("COCOInstSegDataset", "MaskHybridEncoder", "MaskRTDETR", "PPYOLOEInsHead",
                                  "RTDETRTransformerv2", "WIDERFaceValDataset")},
}
NEWER_MODULE_ARGS = {
    ("KeypointTopDownCocoDataset", "center_scale"): RELEASE_27, ("DETR", "neck"): RELEASE_27,
    ("DETR", "post_process_semi"): RELEASE_27, ("DETR", "with_mask"): RELEASE_27, ("PicoDet", "nms_cpu"): RELEASE_27,
    ("ResNet", "freeze_stem_only"): RELEASE_27, ("SwinTransformer", "arch"): RELEASE_27,
    ("DINOHead", "eval_idx"): RELEASE_27, ("DETRLoss", "use_vfl"): RELEASE_27, ("DINOLoss", "use_vfl"): RELEASE_27,
    ("DETRLoss", "use_uni_match"): RELEASE_27, ("DETRLoss", "uni_match_ind"): RELEASE_27,
    ("DeformableTransformer", "in_feats_channel"): RELEASE_27, ("DeformableTransformer", "pe_offset"): RELEASE_27,
    ("DeformableTransformer", "pe_temperature"): RELEASE_27, ("DETRTransformer", "pe_offset"): RELEASE_27,
    ("DETRTransformer", "pe_temperature"): RELEASE_27, ("DINOTransformer", "in_feats_channel"): RELEASE_27,
    ("DINOTransformer", "lr_mult"): RELEASE_27, ("HungarianMatcher", "num_sample_points"): RELEASE_27,
    ("HungarianMatcher", "with_mask"): RELEASE_27,
    ("PPYOLOE", "with_mask"): DEVELOP, ("MultiClassNMS", "cpu"): DEVELOP, ("DETRLoss", "vfl_iou_type"): DEVELOP,
    ("DINOLoss", "vfl_iou_type"): DEVELOP,
}
NEWER_OPS = {name: RELEASE_27 for name in (
    "AddToHueAndSaturation", "BatchRandomResizeForSSOD", "CULaneAffine", "CULaneDataProcess", "CULaneResize",
    "CULaneTrainProcess", "ChannelShuffle", "HorizontalFlip", "MultiplyAndAddToBrightness", "OneOfBlur",
    "RandomSelects")}
NEWER_OP_ARGS = {("RandomDistort", "prob"): RELEASE_27, ("RandomCrop", "prob"): RELEASE_27,
                 ("RandomScaledCrop", "fill_value"): RELEASE_27, ("RandomScaledCrop", "target_size"): RELEASE_27,
                 ("Decode", "rtn_im_file"): DEVELOP}
READERS = ("TrainReader", "EvalReader", "TestReader")
DATA_SECTIONS = ("Dataset", "DataSet", "Reader")
OP_LISTS = ("sample_transforms", "batch_transforms")


def _ppdet_version() -> str:
    try:
        from importlib.metadata import version

        return version("paddledet")
    except Exception:       # a source checkout of ppdet has no distribution metadata
        return "unknown"


def _missing(what: str, release: str | None) -> str:
    version = _ppdet_version()
    if release:
        return (f"{what} is PaddleDetection {release}'s; this ppdet is {version}, and ppmulti adds release/2.7's "
                f"RT-DETR only: use a config of release/2.6 or RT-DETR, or PaddleDetection {release}'s own tools")
    return f"{what} is not in ppdet {version} nor in what ppmulti adds: misspelt, or a newer PaddleDetection's"


def _schema(name: str):
    from ppdet.core.config.schema import SchemaDict
    from ppdet.core.workspace import global_config

    found = global_config.get(name)
    return found if isinstance(found, SchemaDict) else None


def _looks_like_a_class(value: str) -> bool:
    """A module name as configs write one (ResNet, HybridEncoder), not a value such as 'NCHW', 'bn' or 'd'."""
    return (value in NEWER_MODULES or (value.isidentifier() and value[:1].isupper()
                                       and any(c.islower() for c in value)))


def _module_problems(cfg: Mapping[str, Any]) -> Iterator[str]:
    from ppdet.core.config.schema import SchemaDict

    def args_of(schema: Any, body: Mapping[str, Any], where: str) -> Iterator[str]:
        name = getattr(schema, "name", None) or where
        for key in body:
            if key != "name" and key not in schema.schema:
                yield _missing(f"{name}({key}=...) ({where})", NEWER_MODULE_ARGS.get((name, key)))

    def named(value: Any, where: str) -> Iterator[str]:
        """A module named as a string value or an injected {name: ...} body."""
        if isinstance(value, Mapping) and isinstance(value.get("name"), str):
            name = value["name"]
            if _schema(name) is None:
                yield _missing(f"{name} ({where})", NEWER_MODULES.get(name))
                return
            yield from args_of(_schema(name), value, where)
        elif isinstance(value, str) and _looks_like_a_class(value) and _schema(value) is None:
            yield _missing(f"{value} ({where})", NEWER_MODULES.get(value))

    arch = cfg.get("architecture")
    if isinstance(arch, str) and _schema(arch) is None:
        yield _missing(f"architecture {arch}", NEWER_MODULES.get(arch))
    for key, section in cfg.items():
        if isinstance(key, str) and key.endswith(DATA_SECTIONS):
            continue   # datasets and readers: ppdet builds them by their own rules; their ops are checked below
        if isinstance(section, SchemaDict):
            yield from args_of(section, section, key)
            for arg in list(section.keys()):
                if arg in getattr(section, "inject", []) or key == arch:
                    yield from named(section[arg], f"{key}.{arg}")
        elif isinstance(key, str) and key in NEWER_MODULES and isinstance(section, Mapping):
            yield _missing(f"{key} (a section of the config)", NEWER_MODULES[key])


def _op_problems(cfg: Mapping[str, Any]) -> Iterator[str]:
    import ppdet.data.transform as transform

    for reader in READERS:
        for kind in OP_LISTS:
            for op in ((cfg.get(reader) or {}).get(kind) or []):
                if not isinstance(op, Mapping):
                    continue
                for name, body in op.items():
                    cls = getattr(transform, name, None)
                    if cls is None:
                        yield _missing(f"reader op {name} ({reader}.{kind})", NEWER_OPS.get(name))
                        continue
                    params = inspect.signature(cls.__init__).parameters
                    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                        continue
                    for arg in (body or {}) if isinstance(body, Mapping) else {}:
                        if arg not in params:
                            yield _missing(f"{name}({arg}=...) ({reader}.{kind})", NEWER_OP_ARGS.get((name, arg)))


def problems(cfg: Mapping[str, Any]) -> list[str]:
    """Everything a loaded config (ppdet's global config) names that this ppdet and ppmulti do not have."""
    return list(_module_problems(cfg)) + list(_op_problems(cfg))


def refuse_newer(cfg: Mapping[str, Any], path: Any) -> None:
    """One line, before anything is built, for the first module or argument the config names that this ppdet
    lacks (ppdet would fail later with a TypeError or "module not registered" traceback)."""
    found = problems(cfg)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UserError(f"{path}: {found[0]}{more}")
