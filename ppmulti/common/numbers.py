"""-o values that ppmulti reads as numbers (``TrainReader.batch_size``, ``epoch``, ...): checked in the launching
process, so a value that is not a number is one line naming the key, the value and what is expected."""

from __future__ import annotations

from typing import Any, Iterable

from ppmulti.common.errors import UserError

# Keys ppmulti reads as numbers: (whole number?, smallest value, what they are). A value of another kind given with
# -o is one line in the launching process (check_numbers), not a ValueError from int() inside a rank.
NUMERIC_KEYS = {
    "TrainReader.batch_size": (True, 1, "images per rank in a training batch"),
    "EvalReader.batch_size": (True, 1, "images per rank in an evaluation batch"),
    "TestReader.batch_size": (True, 1, "images in an inference batch"),
    "epoch": (True, 1, "epochs"), "snapshot_epoch": (True, 1, "epochs between evaluations and saves"),
    "log_iter": (True, 1, "steps between log lines"), "worker_num": (True, 0, "data loader workers per rank"),
    "num_classes": (True, 1, "classes"), "eval_height": (True, 32, "pixels"), "eval_width": (True, 32, "pixels"),
    "ref_batch": (True, 1, "images in the batch base_lr is tuned for"),
    "LearningRate.base_lr": (False, 0, "the learning rate"),
}


def check_numbers(overrides: dict[str, Any], prefix: str = "") -> None:
    """-o values of NUMERIC_KEYS that are not numbers of the right kind: one line naming key, value and what is
    expected (e.g. ``-o TrainReader.batch_size=abc``)."""
    for key, value in overrides.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            check_numbers(value, f"{path}.")
            continue
        _check_one(path, value)


def _check_one(path: str, value: Any) -> None:
    rule = NUMERIC_KEYS.get(path)
    if rule is None:
        return
    whole, least, what = rule
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (not whole or value == int(value))
    if ok and value >= least and (whole or value > least):
        return
    kind = (f"a whole number of {what}, {least} or more" if whole else f"a number above {least:g} ({what})")
    example = 8 if whole and least <= 8 else (640 if whole else 0.01)
    raise UserError(f"-o {path}={value}: expected {kind}, e.g. -o {path}={example}")


def check_number_items(items: Iterable[str]) -> None:
    """``check_numbers`` on raw ``-o key=value`` items (values read as YAML, as the config loader reads them);
    items that are not key=value are left to the ranks, which name them."""
    import yaml

    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key.strip() not in NUMERIC_KEYS:
            continue
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        _check_one(key.strip(), value)
