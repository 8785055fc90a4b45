"""Flags shared by the model tools (eval, infer, export): config, overrides, weights."""

from __future__ import annotations

import argparse


def add_model_args(p: argparse.ArgumentParser, config_required: bool = True) -> None:
    p.add_argument("-c", "--config", required=config_required, help="ppdet YAML config, e.g. configs/yolo.yml")
    p.add_argument("-o", "--opt", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override config values, e.g. -o EvalDataset.dataset_dir=dataset/demo")
    p.add_argument("--weights", help="a .pdparams file or a run directory (uses weights/best)")


def overrides(args: argparse.Namespace) -> list[str]:
    """The -o values, flattened (each -o may carry several key=value items)."""
    return [item for group in (args.opt or []) for item in group]


def square_size(values: list[int] | None) -> int | None:
    """``--imgsz 640`` or ``--imgsz 640 640`` (YOLOv5's h, w) as one side; other shapes refused."""
    from ppmulti.common.errors import UserError

    if not values:
        return None
    if len(values) > 2 or len(set(values)) != 1:
        raise UserError(f"--imgsz {' '.join(map(str, values))}: give one size (square inputs only), e.g. "
                        f"--imgsz {max(values)}")
    return values[0]


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
