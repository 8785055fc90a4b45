"""Export trained weights as a Paddle inference model, or also as ONNX (--format onnx)."""

import argparse
import sys

from ppmulti.common.errors import UserError, exit_on_user_error
from ppmulti.common.stack import check_stack
from ppmulti.rank.tool_args import add_model_args, overrides


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tools/export.py",
                                description="Export trained weights as a Paddle inference model "
                                            "(model.pdmodel on Paddle 2.6 / model.json on 3.x, model.pdiparams, "
                                            "infer_cfg.yml), or also as ONNX (--format onnx).")
    add_model_args(p)
    p.add_argument("--output_dir", "--output-dir", dest="output_dir", default="output_inference")
    p.add_argument("--format", "--include", dest="format", choices=("paddle", "onnx"), default="paddle",
                   help="paddle: Paddle's inference model (default); onnx: also model.onnx beside it, through "
                        "paddle2onnx (pip install -e \".[export]\")")
    p.add_argument("--no-nms", "--no_nms", dest="nms", action="store_false",
                   help="leave NMS out of the graph: outputs are boxes [B, N, 4] and scores [B, C, N]")
    p.add_argument("--dynamic", "--dynamic-batch", dest="dynamic", action="store_true",
                   help="ONNX: a symbolic batch dimension (needs --no-nms)")
    p.add_argument("--batch-size", "--batch_size", dest="batch", type=int, default=1,
                   help="ONNX: the fixed batch without --dynamic (default 1; above 1 needs --no-nms)")
    p.add_argument("--opset", type=int, default=11, help="ONNX opset (default 11)")
    return p


def run(args) -> int:
    check_stack()   # one line about a broken install, before ppdet is imported
    if args.format == "onnx":
        from ppmulti.rank.engine.onnx_export import OnnxOptions, export_onnx

        opts = OnnxOptions(nms=args.nms, dynamic=args.dynamic, batch=args.batch, opset=args.opset)
        dst = export_onnx(args.config, overrides(args), args.weights, args.output_dir, opts)
        print(f"ONNX model written to {dst}")
        return 0
    if args.dynamic or args.batch != 1:
        raise UserError("--dynamic and --batch-size apply to --format onnx; Paddle's inference model takes any batch")
    from ppmulti.rank.engine.inference import export

    dst = export(args.config, overrides(args), args.weights, args.output_dir, nms=args.nms)
    print(f"inference model written to {dst}")
    return 0


def main(argv=None) -> int:
    return exit_on_user_error(run, build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
