"""The ``ppmulti launch`` subcommand, and ``main(argv)`` for launching in-process from other ppmulti code."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

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


def _launch(argv: list[str]) -> int:
    from ppmulti.procs.launch.cluster_env import resolve
    from ppmulti.procs.launch.flags import build_parser, build_plan, parse_launch_args, split_argv
    from ppmulti.procs.launch.runner import local_addresses, run, visible_gpu_count

    # --- --detach (ppmulti/procs/runs/detach.py): the same launch, started again in a new session ---
    from ppmulti.common.errors import UserError
    from ppmulti.procs.runs.detach import start

    detach, argv = pop_detach(list(argv))
    if detach:
        if parse_launch_args(argv).script is None:   # bad flags fail here, not in a log nobody reads
            raise UserError("--detach needs a script to launch, e.g. ppmulti launch --detach tools/train.py -c CFG")
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
        return launch_nodes(argv)   # ssh fan-out: the same launch on every node (nodes.py)
    check_nodes_only_flags(ns)
    # address discovery can wait on DNS; only multi-node launches need it
    need_addrs = bool(ns.ips or ns.master_addr or ns.master)
    plan = build_plan(ns, os.environ, local_addresses() if need_addrs else set(), visible_gpu_count(os.environ),
                      resolve=resolve)
    return run(plan, dry_run=ns.dry_run)


def main(argv: list[str] | None = None) -> int:
    """``ppmulti launch ARGV``; returns the exit code (bad flags: one line on stderr and 2)."""
    return exit_on_user_error(_launch, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
