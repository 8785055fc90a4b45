"""YOLOv5 hyperparameter files: which keys exist, which map onto ppdet, and reading one (plain YAML, no paddle)."""

from __future__ import annotations

from pathlib import Path

from ppmulti.common.errors import UserError, first_line


# YOLOv5 hyp keys, grouped by what happens to them here.
HYP_MAPPED = ("lr0", "lrf", "momentum", "weight_decay", "warmup_epochs", "warmup_momentum", "warmup_bias_lr", "box",
              "cls", "obj", "cls_pw", "obj_pw", "anchor_t", "hsv_h", "hsv_s", "hsv_v", "degrees", "translate",
              "scale", "shear", "fliplr", "mosaic", "mixup")


HYP_NO_EQUIVALENT = {
    "iou_t": "unused by YOLOv5's own training too",
    "fl_gamma": "focal loss is not implemented in YOLOv5Loss here",
    "perspective": "ppdet's Mosaic affine has no perspective term",
    "flipud": "ppdet has no vertical flip op",
    "copy_paste": "needs segments; detection labels here are boxes",
    "anchors": "anchors come from the model config",
    "dfl": "the distribution focal loss gain of YOLOv8-family losses; this model's loss has no DFL term",
}


# the value at which a key without an equivalent changes nothing in YOLOv5 either (None: always matters)
HYP_NEUTRAL = {"iou_t": None, "fl_gamma": 0.0, "perspective": 0.0, "flipud": 0.0, "copy_paste": 0.0, "anchors": None,
               "dfl": None}


def load_hyp(path: str) -> dict[str, float]:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise UserError(f"--hyp {path}: file not found (YOLOv5's hyps ship under configs/hyps/)")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise UserError(f"--hyp {path} is not valid YAML: {first_line(exc)}") from None
    if not isinstance(raw, dict):
        raise UserError(f"--hyp {path}: expected a mapping of hyperparameters (lr0: 0.01, ...)")
    known = set(HYP_MAPPED) | set(HYP_NO_EQUIVALENT)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise UserError(f"--hyp {path}: unknown hyperparameter {unknown[0]!r}; YOLOv5's keys are "
                        f"{', '.join(HYP_MAPPED)}")
    for key, value in raw.items():
        if key != "anchors" and not isinstance(value, (int, float)):
            raise UserError(f"--hyp {path}: {key} must be a number, got {value!r}")
    return raw
