"""Evaluate weights on a config's EvalDataset (COCO bbox mAP); shards across ranks when launched."""

import argparse
import json
import sys

from ppmulti.common.errors import exit_on_user_error
from ppmulti.common.stack import check_stack
from ppmulti.rank.tool_args import add_model_args, overrides


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    add_model_args(p)
    p.add_argument("--save-json", help="also write the metrics to this json file")
    return p


def run(args) -> int:
    check_stack()   # one line about a broken install, before ppdet is imported
    from ppmulti.rank import dist
    from ppmulti.rank.engine.inference import evaluate

    result = evaluate(args.config, overrides(args), args.weights, args.save_json)
    if dist.is_main():
        print(json.dumps(result))
    return 0


def main(argv=None) -> int:
    return exit_on_user_error(run, build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
