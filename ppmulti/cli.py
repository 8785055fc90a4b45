"""The ``ppmulti`` command, the process side's front door: subcommands and their parsers only (no paddle import)."""

from __future__ import annotations

import argparse
import sys

from ppmulti.common.version import version_line
from ppmulti.common.errors import exit_on_user_error
from ppmulti.common.flags import add
from ppmulti.common.stack import check_stack

# Subcommands that train (so need Paddle and ppdet); the others also run where Paddle is absent (data tools,
# dry runs, the board) and refuse only a broken stack.
TRAINING_COMMANDS = ("demo", "bench", "yolo")


def _cmd_data_demo(args: argparse.Namespace) -> int:
    from ppmulti.common.synthdata import generate

    ds = generate(args.dir, fmt=args.format, n_train=args.train, n_val=args.val, size=args.size, seed=args.seed)
    print(f"demo dataset written to {ds.root} ({args.train} train / {args.val} val images, {args.format})")
    return 0


def _cmd_data_convert(args: argparse.Namespace) -> int:
    from ppmulti.common.layouts import convert

    ds, written = convert(args.src, args.dst, args.to)
    counts = ", ".join(f"{split} {len(samples)}" for split, samples in ds.splits.items())
    print(f"{args.to} dataset written to {args.dst} ({len(ds.names)} classes; images: {counts}): {written}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from ppmulti.procs.demo import run_demo

    return run_demo(args)


class _VersionAction(argparse.Action):
    """--version: the versions are read from package metadata only when asked (no import of paddle)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ppmulti",
        description="Multi-GPU and multi-machine YOLO training on PaddlePaddle (ppdet inside).")
    parser.add_argument("--version", action=_VersionAction,
                        help="print ppmulti's version and the Python, Paddle and ppdet it runs with, then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser("demo", help="generate the demo data, train the demo config, evaluate, summarise")
    add(demo, "data", default="dataset/demo", help="demo dataset directory (default: dataset/demo)")
    add(demo, "output", help="run directory (default: output/ppyoloe_demo, numbered)")
    add(demo, "epochs", help="epochs (default: the demo config's)")
    add(demo, "nproc", help="train as N ranks on this machine (gloo on CPU); default 2 where there are 2+ cores "
                            "(a Paddle CPU process keeps about one core busy), else 1")
    add(demo, "batch", default=16, help="global batch, split across the ranks (default 16)")
    add(demo, "config", help="config to train (default: configs/demo/ppyoloe_demo.yml)")
    add(demo, "verbose", help="also show Paddle's launcher, glog and topology lines (always kept in log/)")
    add(demo, "opt", help="config overrides, e.g. -o TrainReader.batch_size=4")
    demo.set_defaults(func=_cmd_demo)

    data = sub.add_parser("data", help="dataset utilities")
    data_sub = data.add_subparsers(dest="data_command", metavar="ACTION")
    gen = data_sub.add_parser("demo", help="write the synthetic demo detection dataset")
    gen.add_argument("dir", help="output directory, e.g. dataset/demo")
    gen.add_argument("--format", choices=("coco", "yolo", "both", "voc"), default="both",
                     help="layout: COCO json, YOLO txt + data.yaml, both of these (the default), or Pascal VOC xml")
    gen.add_argument("--train", type=int, default=256, help="training images (default 256)")
    gen.add_argument("--val", type=int, default=64, help="validation images (default 64)")
    gen.add_argument("--size", type=int, default=256, help="image side in pixels (default 256)")
    add(gen, "seed", help="random seed of the images and boxes")
    gen.set_defaults(func=_cmd_data_demo)
    conv = data_sub.add_parser("convert", help="write a YOLO, COCO or VOC dataset in another of these layouts")
    conv.add_argument("src", help="the dataset: a directory with data.yaml (YOLO), label_list.txt (VOC) or "
                                  "annotations/instances_<split>.json (COCO)")
    conv.add_argument("dst", help="output directory (may be SRC itself: images already there are not copied)")
    conv.add_argument("--to", required=True, choices=("yolo", "coco", "voc"), help="the layout to write")
    conv.set_defaults(func=_cmd_data_convert)
    data.set_defaults(func=lambda a: (data.print_help(), 2)[1])

    # each process-side command module registers its own parser
    from ppmulti.procs.bench import command as bench_command
    from ppmulti.procs.launch import command as launch_command
    from ppmulti.procs.runs import board as board_command
    from ppmulti.procs.runs import detach as detach_commands
    from ppmulti.procs.runs import evolve_run as evolve_command
    from ppmulti.procs import yolo_command

    for module in (launch_command, board_command, evolve_command, detach_commands, bench_command, yolo_command):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return exit_on_user_error(_checked, args)


def _checked(args: argparse.Namespace) -> int:
    check_stack(need_paddle=args.command in TRAINING_COMMANDS)   # before any subcommand imports ppdet
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
