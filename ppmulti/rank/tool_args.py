"""The model tools' (eval, detect, infer, export) common flags, from ppmulti.common.flags, and their leftovers."""

from __future__ import annotations

import argparse

from ppmulti.common.flags import add, overrides  # noqa: F401  (overrides: the tools' -o items, flattened)


def add_model_args(p: argparse.ArgumentParser, config_required: bool = True) -> None:
    add(p, "config", required=config_required)
    add(p, "opt", help="override config values, e.g. -o EvalDataset.dataset_dir=dataset/demo")
    add(p, "weights")


def refuse_extra(extra: list[str], unsupported: dict[str, str], yolov5_script: str, prog: str) -> None:
    """Leftover argv of a tool: a YOLOv5 flag with no equivalent is refused by name with what it does there,
    anything else as unknown (UserError, the first one)."""
    from ppmulti.common.errors import UserError

    for item in extra:
        name = item.split("=", 1)[0]
        if name in unsupported:
            raise UserError(f"{name} is a YOLOv5 {yolov5_script} flag that ppmulti does not support "
                            f"({unsupported[name]}); remove it")
        raise UserError(f"unknown argument {item!r}; see {prog} --help")
