"""Loading ppdet configs: a clean workspace per load, checked -o overrides, eval-size sync, data checks."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Iterable

import yaml

from ppmulti.common.errors import UserError, first_line
from ppmulti.common.flags import parse_overrides
from ppmulti.common.numbers import check_numbers
from ppmulti.common.paths import IMAGE_SUFFIXES
from ppmulti.rank import zoo

# Top-level keys a config file may not set that -o accepts, each with where it takes effect (tests/
# test_ppdet_flags.py walks this table: every key is honoured here or refused below, none silently dropped).
HONOURED_KEYS = {
    "amp": "hooks/amp.py: mixed precision", "amp_level": "hooks/amp.py: O1 or O2",
    "custom_black_list": "hooks/amp.py: ops kept in float32", "custom_white_list": "hooks/amp.py: ops cast",
    "init_loss_scaling": "hooks/amp.py: float16's first loss scale",
    "architecture": "the model built (ppdet's create)", "num_classes": "ppdet's __shared__ heads",
    "depth_mult": "ppdet's __shared__ backbones and necks", "width_mult": "ppdet's __shared__ backbones and necks",
    "norm_type": "ppdet's __shared__ layers; sync_bn synchronises BatchNorm across GPU ranks (builder)",
    "epoch": "the loop's epochs", "snapshot_epoch": "hooks/evaluation.py and hooks/checkpoint.py",
    "log_iter": "the console's and the trackers' logging interval", "worker_num": "data loader workers",
    "use_ema": "hooks/ema.py", "ema_decay": "hooks/ema.py", "ema_decay_type": "hooks/ema.py",
    "ema_black_list": "hooks/ema.py", "cycle_epoch": "hooks/ema.py",
    "eval_height": "eval size (sync_eval_size)", "eval_width": "eval size (sync_eval_size)",
    "eval_size": "ppdet's __shared__ heads (PP-YOLOE's anchors)",
    "ref_batch": "engine/lr.py: the batch base_lr is tuned for", "save_dir": "where run directories go",
    "use_gpu": "ppdet_bridge.select_device", "pretrain_weights": "initial weights (builder)",
    "weights": "the weights eval, infer and export load",
    "use_vdl": "hooks/trackers.py: false writes no VisualDL log unless --logger names visualdl",
    "vdl_log_dir": "hooks/visualdl.py: where the VisualDL log goes",
    "classwise": "engine/evaluator.py: the per-category AP table",
    "output_eval": "engine/evaluator.py: where bbox.json goes",
    "save_prediction_only": "engine/evaluator.py: bbox.json without scoring (training refuses it: rank/entry.py)",
    "metric": "engine/evaluator.py: COCO or VOC (map_type: 11point or integral); anything else is refused below",
    "print_params": "engine/builder.py: the model's parameter count after the start line",
    "find_unused_parameters": "compat.distributed_model: the ranks' DataParallel (Cascade R-CNN, DETR, DINO)",
    "profiler_options": "hooks/profiler.py: paddle.profiler over a range of steps (PaddleDetection's option string)",
}
# Keys PaddleDetection reads that ppmulti does not: -o with a true value stops with the reason (false asks for
# nothing, so PaddleDetection's runtime.yml values such as print_flops: false pass).
REFUSED_KEYS = {
    "print_flops": "counting FLOPs needs PaddleSlim, which ppmulti does not install",
    "seed": "ppmulti's seed is a flag: --seed N",
    "ema_filter_no_grad": "ppdet 2.6's ModelEMA fails on it as soon as a weight is frozen (it appends to a set) "
                          "and changes nothing otherwise",
    "log_rank": "ppmulti logs rank 0 to the console and every rank to its own log file in the run directory",
    "use_xpu": "ppmulti runs on CPUs and CUDA GPUs only (use_gpu)",
    "use_npu": "ppmulti runs on CPUs and CUDA GPUs only (use_gpu)",
    "use_mlu": "ppmulti runs on CPUs and CUDA GPUs only (use_gpu)",
}
KNOWN_TOP_LEVEL_KEYS = frozenset(HONOURED_KEYS) | frozenset(REFUSED_KEYS)
METRICS = ("COCO", "VOC")   # what engine/evaluator.py scores


def ppdet_workspace():
    """ppdet's workspace module, imported quietly (ppdet prints a numba notice on stdout)."""
    from ppmulti.rank import compat

    compat.import_ppdet()
    from ppdet.core import workspace

    return workspace


def reset_workspace() -> None:
    """Forget every value a previous load merged into ppdet's module-level config.

    ppdet's ``load_config`` merges into one global dict, so a second load in the same
    process would inherit the first one's keys. Registered module schemas stay; the
    values set on them are cleared.
    """
    ws = ppdet_workspace()
    from ppdet.core.config.schema import SchemaDict

    for key in list(ws.global_config.keys()):
        value = ws.global_config[key]
        if isinstance(value, SchemaDict):
            value.clear()
        else:
            del ws.global_config[key]


def _check_override_keys(cfg, overrides: dict[str, Any], prefix: str = "") -> None:
    from ppdet.core.config.schema import SchemaDict

    for key, value in overrides.items():
        path = f"{prefix}{key}"
        if prefix == "":
            known = key in cfg or key in KNOWN_TOP_LEVEL_KEYS
        elif isinstance(cfg, SchemaDict):
            known = key in cfg or key in cfg.schema
        else:
            known = isinstance(cfg, dict) and key in cfg
        if not known:
            raise UserError(
                f"unknown config key {path!r} in -o; check the spelling against the resolved config "
                f"(config.yml in the run directory) or the files under configs/")
        child = cfg[key] if (isinstance(cfg, dict) and key in cfg) else None
        if isinstance(value, dict) and isinstance(child, dict):
            _check_override_keys(child, value, prefix=f"{path}.")


def check_values(overrides: dict[str, Any]) -> None:
    """-o keys that ppmulti refuses (REFUSED_KEYS, with a true value) or values it cannot honour, by name."""
    for key, value in overrides.items():
        if key in REFUSED_KEYS and value not in (False, None, "", 0):
            raise UserError(f"-o {key}={value}: {REFUSED_KEYS[key]}; remove it")
    if "metric" in overrides and overrides["metric"] not in METRICS:
        raise UserError(f"-o metric={overrides['metric']}: ppmulti evaluates COCO or VOC bbox mAP "
                        f"(metric: COCO or VOC)")


def sync_eval_size(cfg) -> None:
    """Make ``eval_height``/``eval_width`` reach every place that uses the eval size.

    The reader base file ties ``eval_size`` and the Resize targets to the height and width
    with YAML anchors, which are resolved when that file is parsed: a child config (or -o)
    that changes ``eval_height`` leaves ``eval_size`` at 640, PPYOLOEHead then precomputes
    anchors for 640x640 and evaluation dies with a broadcast error. Here the height and
    width win and are copied everywhere.
    """
    if "eval_height" not in cfg or "eval_width" not in cfg:
        return
    h, w = int(cfg["eval_height"]), int(cfg["eval_width"])
    cfg["eval_size"] = [h, w]
    for reader in ("EvalReader", "TestReader"):
        section = cfg.get(reader)
        if not isinstance(section, dict):
            continue
        for op in section.get("sample_transforms", []) or []:
            if isinstance(op, dict) and "Resize" in op and isinstance(op["Resize"], dict):
                op["Resize"]["target_size"] = [h, w]
            if isinstance(op, dict) and "Pad" in op and isinstance(op["Pad"], dict) and "size" in op["Pad"]:
                op["Pad"]["size"] = [h, w]
        inputs_def = section.get("inputs_def")
        if isinstance(inputs_def, dict) and "image_shape" in inputs_def:
            inputs_def["image_shape"] = [3, h, w]


def load(path: str | os.PathLike, overrides: Iterable[str] | dict | None = None):
    """Load a ppdet YAML config (with ``_BASE_``) into a fresh workspace and apply overrides.

    Returns ppdet's global config object (an AttrDict), as ``create()`` reads it.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file not found: {path} (pass -c with a .yml under configs/, e.g. configs/yolo.yml)")
    if path.suffix not in (".yml", ".yaml"):
        raise UserError(f"config file {path} is not YAML (.yml/.yaml)")
    zoo.refuse_unsupported(path)   # keypoint, MOT, rotated and segmentation configs: one line, by name
    ws = ppdet_workspace()
    from ppmulti.rank.ppdet_bridge import register_extensions

    register_extensions()

    reset_workspace()
    try:
        cfg = ws.load_config(str(path))
    except FileNotFoundError as exc:
        raise UserError(f"config {path}: a file it names was not found: {exc.filename}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"config {path} is not valid YAML: {first_line(exc)}") from None
    if isinstance(overrides, dict):
        over = overrides
    else:
        over = parse_overrides(overrides or [])
    if over:
        check_numbers(over)
        _check_override_keys(cfg, over)
        check_values(over)
        ws.merge_config(copy.deepcopy(over))
    sync_eval_size(cfg)
    from ppmulti.rank import newer

    newer.refuse_newer(cfg, path)   # a module or argument of a newer PaddleDetection: one line, before building
    return cfg


def to_plain(value: Any) -> Any:
    """A YAML-safe copy of a config value (SchemaDicts and AttrDicts become plain dicts)."""
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "__dict__"):
        return {"name": type(value).__name__, **{k: to_plain(v) for k, v in vars(value).items()
                                                 if not k.startswith("_")}}
    return repr(value)


def resolved(cfg) -> dict[str, Any]:
    """The config as it will be used: every key the files and overrides set, as plain data."""
    from ppdet.core.config.schema import SchemaDict

    out = {}
    for key, value in cfg.items():
        if isinstance(value, SchemaDict) and not dict(value):
            continue  # a registered module this config does not touch
        out[key] = to_plain(value)
    return out


def _dataset_paths(section) -> tuple[Path, Path | None, Path | None]:
    root = Path(section.get("dataset_dir") or ".")
    image_dir = section.get("image_dir")
    anno = section.get("anno_path")
    return root, (root / image_dir if image_dir else None), (root / anno if anno else None)


def check_dataset(cfg, section_name: str) -> None:
    """Fail early, with the path named, when a dataset section points at nothing.

    ppdet would otherwise try to download a dataset from the internet, or fail deep
    inside its parser.
    """
    section = cfg.get(section_name)
    if section is None:
        raise UserError(f"config has no {section_name}; add one (see configs/datasets/)")
    if section.get("name") == "YOLODataSet":
        from ppmulti.rank.data.yolo import image_names, load_data_yaml

        image_names(load_data_yaml(section.get("data") or ""), section.get("split", "train"))
        return
    root, image_dir, anno = _dataset_paths(section)
    if not root.is_dir():
        raise UserError(f"{section_name}: dataset directory not found: {root} "
                        f"(set {section_name}.dataset_dir, or generate the demo set with `ppmulti data demo {root}`)")
    if anno is not None and section_name != "TestDataset" and not anno.is_file():
        raise UserError(f"{section_name}: annotation file not found: {anno} (set {section_name}.anno_path)")
    if image_dir is not None:
        if not image_dir.is_dir():
            raise UserError(f"{section_name}: image directory not found: {image_dir} (set {section_name}.image_dir)")
        if not any(p.suffix.lower() in IMAGE_SUFFIXES for p in image_dir.iterdir()):
            raise UserError(f"{section_name}: no images ({'/'.join(IMAGE_SUFFIXES)}) in {image_dir}")


def dump(cfg, path: str | os.PathLike) -> None:
    """Write the resolved config as YAML, atomically."""
    from ppmulti.common.atomic import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(resolved(cfg), sort_keys=False, default_flow_style=None))
