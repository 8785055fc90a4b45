"""PaddleDetection's exporter, by its name and flags: `python tools/export_model.py -c CONFIG -o weights=W
[--output_dir output_inference]` writes a Paddle inference model to OUTPUT_DIR/<config name> (tools/export.py -c
does the work; it also takes --weights, --format onnx and YOLOv5's export.py flags)."""

import argparse
import importlib.util
import sys
from pathlib import Path

from ppmulti.common.errors import UserError, exit_on_user_error
from ppmulti.common.flags import add
from ppmulti.common.ppdet_flags import add_ppdet_flags
from ppmulti.common.ppdet_flags import resolve as resolve_ppdet
from ppmulti.rank.tool_args import add_model_args, refuse_extra

PROG = "tools/export_model.py"
_spec = importlib.util.spec_from_file_location("_ppmulti_export_tool", Path(__file__).with_name("export.py"))
_export = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_export)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    add_model_args(p)
    add(p, "output_dir", default="output_inference",
        help="where the model goes, in a folder named after the config (default output_inference)")
    add_ppdet_flags(p, "export")
    return p


def export_argv(argv) -> list[str]:
    """This command line as tools/export.py's (-c mode), after PaddleDetection's flags are checked."""
    args, extra = build_parser().parse_known_args(argv)
    refuse_extra(extra, {}, "export_model.py", PROG)
    resolve_ppdet(args, "export")   # --slim_config refused by name
    if args.export_serving_model:
        raise UserError("--export_serving_model: Paddle Serving's model needs paddle_serving_client, which ppmulti "
                        "does not use; export the inference model and convert it with paddle_serving_client")
    out = ["-c", args.config, "--output_dir", args.output_dir]
    for group in args.opt or []:
        out += ["-o", *group]
    if args.weights:
        out += ["--weights", args.weights]
    return out


def main(argv=None) -> int:
    return exit_on_user_error(lambda a: _export.run(_export.parse(export_argv(a))), argv)


if __name__ == "__main__":
    sys.exit(main())
