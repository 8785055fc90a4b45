"""YOLOv5's name for tools/eval.py: `python tools/val.py --data data.yaml --weights RUN/weights/best.pdparams
--img 640`, the same code and flags; results (results.json, with --save-txt labels/) in runs/val/exp*."""

import importlib.util
import sys
from pathlib import Path

PROG = "tools/val.py"
_spec = importlib.util.spec_from_file_location("_ppmulti_eval_tool", Path(__file__).with_name("eval.py"))
_eval = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_eval)


def build_parser():
    return _eval.build_parser(PROG)


def parse(argv):
    return _eval.parse(argv, PROG)


def main(argv=None) -> int:
    return _eval.main(argv, PROG)


if __name__ == "__main__":
    sys.exit(main())
