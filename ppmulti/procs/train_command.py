"""The train command (tools/train.py, ``ppmulti demo``, every rank of a training): several devices are re-run
under ``ppmulti launch``, ``--evolve`` goes to evolution, a single process or a rank trains through the rank
side's entry point; a rank of a launch trains the RunPlan its launcher resolved instead of parsing argv."""

from __future__ import annotations

import argparse
import os
import sys

from ppmulti.common.envvars import in_paddle_worker, set_device_order, set_visible_gpu
from ppmulti.common.errors import UserError, exit_on_user_error
from ppmulti.common.stack import check_stack
from ppmulti.common.train_flags import parse, relaunch_argv


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    check_stack()   # one line about a broken install, not a traceback from inside ppdet
    if getattr(args, "evolve", None) is not None:
        from ppmulti.procs.runs.evolve_run import evolve_from_train

        return evolve_from_train(args, argv)
    if getattr(args, "storage", None) is not None:
        raise UserError("--storage is where --evolve keeps its population: add --evolve N, or drop --storage")
    from ppmulti.rank import entry

    kind, ids, nranks = entry.with_device(args)
    if kind == "gpu":
        set_device_order()   # before paddle starts CUDA: --device ids follow nvidia-smi
    plan = entry.resolve(args)   # checks the flags before any process starts
    if not in_paddle_worker():
        if kind == "gpu":
            entry.check_gpu_ids(ids)
        if nranks > 1:
            # never single-process DataParallel: one process per device, started by Paddle's launcher, whose
            # ranks train this plan (made once, here)
            from ppmulti.procs.launch.command import main as launch_main

            return launch_main(relaunch_argv(argv, kind, ids, nranks), run_plan=plan)
        if kind == "gpu":
            set_visible_gpu(ids[0])
        from ppmulti.common.paths import TRAIN_SCRIPT
        from ppmulti.procs.launch.command import check_run_place

        check_run_place(str(TRAIN_SCRIPT), argv, plan)   # a file in the way, a place not writable: before Paddle starts
    return entry.train(plan)


def _run_rank(argv: list[str]) -> int | None:
    """A rank of a launch whose launcher resolved these arguments: train its plan (None: resolve here)."""
    from ppmulti.common.envvars import PPMULTI_RUN_PLAN

    if not (in_paddle_worker() and os.environ.get(PPMULTI_RUN_PLAN)):
        return None   # run alone: the plan is resolved from argv in this process
    from ppmulti.rank import entry

    plan = entry.plan_from_environ(argv)
    if plan is None:
        return None
    check_stack()
    return entry.train(plan)


def main(argv: list[str] | None = None) -> int:
    def start(a: list[str]) -> int:
        rc = _run_rank(a)
        return run(parse(a), a) if rc is None else rc

    return exit_on_user_error(start, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
