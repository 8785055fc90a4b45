"""Detect objects in images and write them with their boxes drawn, as PNGs, plus detections.json."""

import argparse
import sys

from ppmulti.common.errors import exit_on_user_error
from ppmulti.common.stack import check_stack
from ppmulti.rank.tool_args import add_model_args, overrides


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tools/infer.py", description=__doc__)
    add_model_args(p)
    p.add_argument("--infer_img", "--infer-img", dest="infer_img", help="one image")
    p.add_argument("--infer_dir", "--infer-dir", dest="infer_dir", help="a directory of images")
    p.add_argument("--output_dir", "--output-dir", dest="output_dir", default="output/infer")
    p.add_argument("--draw_threshold", "--draw-threshold", dest="draw_threshold", type=float, default=0.5)
    return p


def run(args) -> int:
    check_stack()   # one line about a broken install, before ppdet is imported
    from ppmulti.rank.engine.inference import predict

    written = predict(args.config, overrides(args), args.weights, args.infer_img, args.infer_dir, args.output_dir,
                      args.draw_threshold)
    print(f"{len(written)} images written to {args.output_dir}")
    return 0


def main(argv=None) -> int:
    return exit_on_user_error(run, build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
