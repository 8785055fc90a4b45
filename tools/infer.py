"""Detect objects in images and write them with their boxes drawn, as PNGs, plus detections.json (PaddleDetection's
tools/infer.py flags; YOLOv5's detect.py is tools/detect.py)."""

import argparse
import sys

from ppmulti.common.errors import UserError, exit_on_user_error
from ppmulti.common.flags import add
from ppmulti.common.ppdet_flags import add_ppdet_flags
from ppmulti.common.ppdet_flags import resolve as resolve_ppdet
from ppmulti.common.stack import check_stack
from ppmulti.rank.tool_args import add_model_args, overrides, refuse_extra

PROG = "tools/infer.py"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    add_model_args(p)
    p.add_argument("--infer_img", "--infer-img", dest="infer_img", help="one image (with --infer_dir: both)")
    p.add_argument("--infer_dir", "--infer-dir", dest="infer_dir", help="a directory of images")
    add(p, "output_dir", default="output/infer",
        help="where the drawn images and detections.json go (default output/infer)")
    p.add_argument("--draw_threshold", "--draw-threshold", dest="draw_threshold", type=float, default=0.5,
                   help="score from which a box is drawn and listed (default 0.5)")
    add_ppdet_flags(p, "infer")
    return p


def parse(argv) -> argparse.Namespace:
    args, extra = build_parser().parse_known_args(argv)
    refuse_extra(extra, {}, "infer.py", PROG)
    resolve_ppdet(args, "infer")   # refuses the flags ppmulti does not implement, by name
    for flag, value, what in (("--save_results", args.save_results, "the results as detections.json"),
                              ("--visualize", args.visualize, "the drawn images as PNGs")):
        if value is False:
            raise UserError(f"{flag} false: ppmulti's infer always writes {what} into --output_dir; remove it")
    if not 0.0 <= args.draw_threshold <= 1.0:
        raise UserError(f"--draw_threshold {args.draw_threshold}: use a score in [0, 1]")
    return args


def run(args) -> int:
    check_stack()   # one line about a broken install, before ppdet is imported
    from ppmulti.rank.engine.inference import predict

    written = predict(args.config, overrides(args), args.weights, args.infer_img, args.infer_dir, args.output_dir,
                      args.draw_threshold)
    print(f"{len(written)} images written to {args.output_dir}")
    return 0


def main(argv=None) -> int:
    return exit_on_user_error(lambda a: run(parse(a)), argv)


if __name__ == "__main__":
    sys.exit(main())
