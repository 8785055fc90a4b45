"""Convert YOLOv5 v6 weights to ppmulti: `python tools/convert_yolov5.py yolov5s.pt yolov5s.pdparams --cfg yolov5s`.

Needs neither PyTorch nor YOLOv5's code: the .pt is read as data. Training takes the .pt itself
(tools/train.py --weights yolov5s.pt converts it once and caches the result); this tool writes a .pdparams
for other uses (set the anchors and number of classes it prints, when they are not the config's).
"""

import argparse
import json
import sys

from ppmulti.common.errors import exit_on_user_error
from ppmulti.common.flags import add
from ppmulti.common.stack import check_stack


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tools/convert_yolov5.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("weights",
                   help="YOLOv5 v6/v7 .pt: a release file, a train.py checkpoint (its ema, else model) or a state_dict")
    p.add_argument("out", help="the .pdparams to write")
    add(p, "cfg", default="yolov5s", help="ppmulti model to check it against: yolov5n/s/m/l/x or a .yml")
    return p


def run(args) -> int:
    check_stack()   # one line about a broken install, before ppdet is imported
    from ppmulti.rank.engine.pretrained import convert_file

    print(json.dumps(convert_file(args.weights, args.out, args.cfg)))
    return 0


def main(argv=None) -> int:
    return exit_on_user_error(run, build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
