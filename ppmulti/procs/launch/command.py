"""The ``ppmulti launch`` subcommand, and ``main(argv)`` for launching in-process from other ppmulti code."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ppmulti.common.errors import exit_on_user_error

HELP = "start one process per rank through Paddle's launcher (torchrun and fleetrun flags)"


def register(subparsers: Any) -> None:
    """Add ``launch`` to the ``ppmulti`` subcommands; its flags are parsed by ``parse_launch_args``.

    The script's own arguments follow the script and may look like anything, so this parser takes
    every word as data ('+' as its only prefix character: nothing looks like an option to it).
    """
    parser = subparsers.add_parser("launch", help=HELP, description=HELP, prefix_chars="+", add_help=False,
                                   usage="ppmulti launch [FLAGS] SCRIPT.py [SCRIPT ARGS ...]  (see --help)")
    parser.add_argument("launch_argv", nargs=argparse.REMAINDER, metavar="ARG")
    parser.set_defaults(func=lambda args: main(args.launch_argv))


def pop_detach(argv: list[str]) -> tuple[bool, list[str]]:
    """``--detach`` among ``ppmulti launch``'s own flags (before the script) -> (True, argv without it)."""
    from ppmulti.procs.launch.flags import split_argv

    for i, item in enumerate(argv):
        if item == "--detach":
            rest = argv[:i] + argv[i + 1:]
            flags, _, _ = split_argv(rest)
            return (True, rest) if i <= len(flags) else (False, argv)
    return False, argv


def user_command(launch_argv: list[str], process_argv: list[str], environ: Mapping[str, str]) -> list[str] | None:
    """The command the user typed to start this launch, in their dialect, for the line that says how to resume:
    ``python tools/train.py --nproc 2 ...`` when the train command re-ran itself under the launcher, else
    ``ppmulti launch ...`` (also for ``python -m ppmulti.cli launch``, ``ppmulti demo`` and detached launches);
    None on a node of the ssh fan-out (``--nodes``), whose user's command is on another machine."""
    from ppmulti.common import envvars as E

    if environ.get(E.PPMULTI_NODES_JOB):
        return None
    prog = os.path.basename(process_argv[0]) if process_argv else ""
    if prog.endswith(".py") and prog not in ("cli.py", "__main__.py", "command.py") and "--evolve" not in process_argv:
        return ["python", *process_argv]
    return ["ppmulti", "launch", *launch_argv]


@dataclass(frozen=True)
class RunPlace:
    """Where the ranks of a ppmulti training will make the run directory: ``base/name`` (numbered unless
    ``exist_ok``), and the flag that moves it (``where``)."""

    base: Path
    name: str
    exist_ok: bool
    where: str


def _is_train_script(script: str | None) -> bool:
    from ppmulti.common.paths import TRAIN_SCRIPT, TRAIN_TOOL

    try:
        return script is not None and Path(script).resolve() in (TRAIN_SCRIPT, TRAIN_TOOL)
    except OSError:
        return False


def run_place(script: str | None, script_args: list[str]) -> RunPlace | None:
    """The run directory a launch of ppmulti's train script will make, read from its flags (and the config's
    ``save_dir``) as the ranks will; None for another script, a resume, an evolution, or flags the ranks will
    refuse themselves (they say why)."""
    if not _is_train_script(script):
        return None
    from ppmulti.common import train_flags
    from ppmulti.common.errors import UserError

    try:
        with contextlib.redirect_stderr(io.StringIO()):   # argparse's complaint: the ranks print it
            args = train_flags.parse(list(script_args))
    except (SystemExit, UserError):
        return None
    if args.resume or getattr(args, "evolve", None) is not None:
        return None
    yolo = train_flags.yolo_style(args)
    output = args.output or train_flags.run_output(getattr(args, "project", None), getattr(args, "name", None),
                                                   yolo=yolo)
    return _place(output, yolo, bool(args.exist_ok), args.config, [x for group in (args.opt or []) for x in group])


def plan_place(run_plan: Any) -> RunPlace | None:
    """The run directory a resolved RunPlan (ppmulti.rank.entry) will make; None for a resume."""
    if run_plan.resume:
        return None
    return _place(run_plan.output, run_plan.record is not None, bool(run_plan.exist_ok), run_plan.config,
                  list(run_plan.overrides))


def _place(output: str | None, yolo: bool, exist_ok: bool, config: str | None, overrides: list[str]) -> RunPlace | None:
    if output:
        where = "--project DIR (or --output DIR)" if yolo else "--output DIR"
        return RunPlace(Path(output).parent, Path(output).name, exist_ok, where)
    if not config:
        return None
    save_dir = None
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep and key.strip() == "save_dir":
            save_dir = value.strip()
    if save_dir is None:
        from ppmulti.common.yamlread import load_config_chain

        try:
            save_dir = str(load_config_chain(config)[0].get("save_dir") or "output")
        except Exception:   # a config the ranks cannot read either: they say why
            return None
    return RunPlace(Path(save_dir), Path(config).stem, exist_ok, "-o save_dir=DIR (or --output DIR)")


def check_run_place(script: str | None, script_args: list[str], run_plan: Any = None) -> None:
    """Before any rank starts: a file where the run directory goes (``runs``, ``output``) is one line naming it;
    read from the train script's resolved plan when there is one."""
    from ppmulti.common.rundir import check_run_place as check

    place = plan_place(run_plan) if run_plan is not None else run_place(script, script_args)
    if place is not None:
        check(place.base, place.name, place.exist_ok, place.where)


def _launch(argv: list[str], run_plan: Any = None) -> int:
    from ppmulti.procs.launch.cluster_env import resolve
    from ppmulti.procs.launch.flags import build_parser, build_plan, parse_launch_args, split_argv
    from ppmulti.procs.launch.runner import local_addresses, run, visible_gpu_count

    # --- --detach (ppmulti/procs/runs/detach.py): the same launch, started again in a new session ---
    from ppmulti.common.errors import UserError
    from ppmulti.procs.runs.detach import start

    detach, argv = pop_detach(list(argv))
    if detach:
        detached = parse_launch_args(argv)
        if detached.script is None:   # bad flags fail here, not in a log nobody reads
            raise UserError("--detach needs a script to launch, e.g. ppmulti launch --detach tools/train.py -c CFG")
        if _is_train_script(detached.script):   # so do bad train values (the detached launch resolves them again)
            from ppmulti.rank.entry import resolve_script_args

            resolve_script_args(detached.script_args)
        return start("launch", argv)
    # --- end --detach ---
    flags, _, _ = split_argv(list(argv))
    if "-h" in flags or "--help" in flags:
        build_parser().print_help()
        return 0
    if not argv:
        build_parser().print_help(sys.stderr)
        return 2
    ns = parse_launch_args(argv)
    from ppmulti.procs.launch.nodes import check_nodes_only_flags, launch_nodes

    if ns.nodes:
        from ppmulti.procs.launch.runner import choose_log_dir

        # a file named log here: every node's logs go to the same other place, which the fan-out's own log follows
        log_dir, note = choose_log_dir(ns.log_dir, "log")
        if note:
            print(f"ppmulti launch: {note}", file=sys.stderr, flush=True)
            argv = ["--log_dir", str(log_dir), *argv]
        return launch_nodes(argv)   # ssh fan-out: the same launch on every node (nodes.py)
    check_nodes_only_flags(ns)
    environ: dict[str, str] = dict(os.environ)
    if _is_train_script(ns.script) and not ns.dry_run:
        # the train script's flags resolved once, here, before any rank starts: a bad value is one line now,
        # and every rank trains this plan instead of parsing its argv again (the train command's own relaunch
        # hands over the plan it resolved). A dry run shows the launch only: no download, no plan.
        from ppmulti.common import envvars as E
        from ppmulti.rank.entry import plan_message, resolve_script_args

        if run_plan is None:
            run_plan = resolve_script_args(ns.script_args)
        if run_plan is not None:
            environ[E.PPMULTI_RUN_PLAN] = plan_message(run_plan, ns.script_args)
    # address discovery can wait on DNS; only multi-node launches need it
    need_addrs = bool(ns.ips or ns.master_addr or ns.master)
    plan = build_plan(ns, environ, local_addresses() if need_addrs else set(), visible_gpu_count(environ),
                      resolve=resolve)
    if plan.node_rank == 0 and not ns.dry_run:   # node 0's rank 0 makes the run directory
        check_run_place(ns.script, ns.script_args, run_plan)
    return run(plan, dry_run=ns.dry_run, environ=environ, command=user_command(argv, sys.argv, os.environ)).exit_code


def main(argv: list[str] | None = None, run_plan: Any = None) -> int:
    """``ppmulti launch ARGV``; returns the exit code (bad flags: one line on stderr and 2). ``run_plan``: the
    RunPlan the train command resolved from its own flags, for the ranks of its relaunch."""
    return exit_on_user_error(_launch, list(sys.argv[1:] if argv is None else argv), run_plan)


if __name__ == "__main__":
    sys.exit(main())
