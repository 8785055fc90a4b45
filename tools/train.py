"""Train a detector: `python tools/train.py -c configs/yolo.yml [--eval] [-o key=value ...]` (see --help)."""

import sys

from ppmulti.procs.train_command import main

if __name__ == "__main__":
    sys.exit(main())
