"""The train command (tools/train.py, ``ppmulti demo``, every rank of a training): several devices are re-run
under ``ppmulti launch``, ``--evolve`` goes to evolution, a single process or a rank trains through the rank
side's entry point."""

from __future__ import annotations

import argparse
import sys

from ppmulti.common.envvars import in_paddle_worker, set_device_order, set_visible_gpu
from ppmulti.common.errors import UserError, exit_on_user_error
from ppmulti.common.stack import check_stack
from ppmulti.common.train_flags import parse, parse_device, relaunch_argv


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    check_stack()   # one line about a broken install, not a traceback from inside ppdet
    if getattr(args, "evolve", None) is not None:
        from ppmulti.procs.runs.evolve_run import evolve_from_train

        return evolve_from_train(args, argv)
    if getattr(args, "storage", None) is not None:
        raise UserError("--storage is where --evolve keeps its population: add --evolve N, or drop --storage")
    kind, ids, nranks = parse_device(args.device, args.nproc)
    if kind == "gpu":
        set_device_order()   # before paddle starts CUDA: --device ids follow nvidia-smi
    from ppmulti.rank import entry

    if kind in ("cpu", "gpu"):
        args.opt = list(args.opt or []) + [[f"use_gpu={'true' if kind == 'gpu' else 'false'}"]]
    options = entry.options_from_args(args)   # checks the flags before any process starts
    if not in_paddle_worker():
        if kind == "gpu":
            entry.check_gpu_ids(ids)
        if nranks > 1:
            # never single-process DataParallel: one process per device, started by Paddle's launcher
            from ppmulti.procs.launch.command import main as launch_main

            return launch_main(relaunch_argv(argv, kind, ids, nranks))
        if kind == "gpu":
            set_visible_gpu(ids[0])
        from ppmulti.common.paths import TRAIN_SCRIPT
        from ppmulti.procs.launch.command import check_run_place

        check_run_place(str(TRAIN_SCRIPT), argv)   # a file in the way, a place not writable: before Paddle starts
    return entry.train(options)


def main(argv: list[str] | None = None) -> int:
    return exit_on_user_error(lambda a: run(parse(a), a), argv)


if __name__ == "__main__":
    sys.exit(main())
