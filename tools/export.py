"""Export trained weights as a Paddle inference model (model.pdmodel on Paddle 2.6 / model.json on 3.x, model.pdiparams, infer_cfg.yml)."""

import argparse
import sys

from ppmulti.common.errors import exit_on_user_error
from ppmulti.common.stack import check_stack
from ppmulti.rank.tool_args import add_model_args, overrides


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    add_model_args(p)
    p.add_argument("--output_dir", "--output-dir", dest="output_dir", default="output_inference")
    return p


def run(args) -> int:
    check_stack()   # one line about a broken install, before ppdet is imported
    from ppmulti.rank.engine.inference import export

    dst = export(args.config, overrides(args), args.weights, args.output_dir)
    print(f"inference model written to {dst}")
    return 0


def main(argv=None) -> int:
    return exit_on_user_error(run, build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
