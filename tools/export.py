"""Export trained weights as a Paddle inference model (model.pdmodel, model.pdiparams, infer_cfg.yml)."""

import argparse
import sys

from ppmulti.errors import exit_on_user_error


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-c", "--config", required=True, help="ppdet YAML config")
    p.add_argument("-o", "--opt", action="append", nargs="+", default=[], metavar="KEY=VALUE")
    p.add_argument("--weights", help="a .pdparams file or a run directory (uses weights/best)")
    p.add_argument("--output_dir", "--output-dir", dest="output_dir", default="output_inference")
    return p


def run(args) -> int:
    from ppmulti.engine.inference import export

    overrides = [x for group in args.opt for x in group]
    dst = export(args.config, overrides, args.weights, args.output_dir)
    print(f"inference model written to {dst}")
    return 0


def main(argv=None) -> int:
    return exit_on_user_error(run, build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
