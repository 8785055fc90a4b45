"""The launcher's version seam: how the installed Paddle's ``paddle.distributed.launch`` is spelled and behaves.

Read by the process side, so it imports nothing heavy: the installed version comes from package metadata. What a
rank reads from Paddle's and ppdet's internals lives in ppmulti/rank/compat.py. Supporting another Paddle is these
two files plus their tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

from ppmulti.common.envvars import (FLAGS_FIXED_PORT, FLAGS_PRINT_LAUNCHER_ENV, FLAGS_START_PORT, HTTP_PROXY_ORIGINAL,
                                    HTTPS_PROXY_ORIGINAL, PADDLE_AUTO_CLUSTER, PADDLE_DISTRI_BACKEND,
                                    PADDLE_PG_TIMEOUT, PADDLE_START_PORT)


def installed_version(dist: str = "paddle") -> tuple[int, ...] | None:
    """The installed Paddle's (or another distribution's) version as numbers, read from package metadata
    without importing it; None when not installed. ``paddle`` looks for any of Paddle's wheels."""
    from importlib import metadata

    names = ("paddlepaddle", "paddlepaddle-gpu") if dist == "paddle" else (dist,)
    for name in names:
        try:
            text = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        return tuple(int(p) for p in text.split("+")[0].split(".")[:3] if p.isdigit())
    return None


def paddle3(version: tuple[int, ...] | None = None) -> bool:
    """True for Paddle 3 or newer: ``version``, default the installed Paddle (False when none is installed)."""
    version = installed_version() if version is None else version
    return bool(version) and tuple(version) >= (3,)


@dataclass(frozen=True)
class LauncherSpec:
    """How one Paddle's ``python -m paddle.distributed.launch`` is spelled and behaves, as ppmulti drives it.

    ppmulti decides *what* to ask for (flags.py: LaunchPlan -> argv); this says *how* that Paddle spells it
    and which of its habits ppmulti has to work around. Another Paddle is another instance plus golden tests.
    """

    name: str                                  # in messages and --help, e.g. "Paddle 2.6's launcher"
    since: tuple[int, ...]                     # the oldest Paddle version this entry describes
    module: str = "paddle.distributed.launch"  # run as ``python -m MODULE``
    # Flag spellings, one per thing ppmulti passes.
    nproc_flag: str = "--nproc_per_node"
    devices_flag: str = "--devices"
    master_flag: str = "--master"              # ADDR:PORT of its HTTP rendezvous
    nnodes_flag: str = "--nnodes"
    rank_flag: str = "--rank"                  # the node rank, not the global one
    host_flag: str = "--host"
    ips_flag: str = "--ips"
    start_port_flag: str = "--start_port"
    log_dir_flag: str = "--log_dir"
    job_id_flag: str = "--job_id"
    # Any of these (or any flag it does not know) makes it fall back to its legacy fleet/launch.py.
    legacy_flags: tuple[str, ...] = ("--legacy", "--selected_gpus", "--selected_gpu")
    default_start_port: int = 6070             # first worker port under --ips (its --start_port default)
    # Variables fleetrun users set for the first worker port, lowest precedence first; ppmulti turns the
    # last one set into --start_port, because ppmulti clears PADDLE_* from the launcher's environment and
    # this launcher ignores FLAGS_START_PORT.
    start_port_vars: tuple[str, ...] = (FLAGS_START_PORT, PADDLE_START_PORT)
    # Environment (name, value) that makes its ranks use gloo on the CPU.
    cpu_env: tuple[tuple[str, str], ...] = ((PADDLE_DISTRI_BACKEND, "gloo"),)
    # It binds rank i to GPU i whenever it sees GPUs, gloo ranks too: CPU ranks <= visible GPUs.
    cpu_ranks_take_gpus: bool = True
    # It runs a script as ``python -u SCRIPT`` only when the name ends so (controllers/controller.py).
    script_suffix: str = ".py"
    # --max_restart/--elastic_level restart only under an etcd master; ppmulti restarts the launch itself.
    restarts_need_etcd: bool = True
    # Its workers get PADDLE_MASTER under --ips too, not only in master mode (the store is the same one:
    # the first trainer endpoint, which envvars.master_endpoint falls back to), and it logs
    # "master is set by args, it will be overwritten by ..." on every --ips launch.
    master_in_ips_mode: bool = False
    # The variable that pins its master-mode worker ports to VALUE + node_rank + i (None: random free ports).
    fixed_port_var: str | None = None
    # Variables it adds to every worker beyond 2.6's set; envvars._LAUNCH_STATE clears them before a nested launch.
    extra_worker_env: tuple[str, ...] = ()
    # The variable without which it no longer prints a failed worker's environment (None: it always does).
    env_dump_var: str | None = None
    # Where it writes workerlog.N, envlog.N, backup_env.N.json and JOB.POD.log without --log_dir.
    default_log_dir: str = "log"


PADDLE_2_6 = LauncherSpec(name="Paddle 2.6's launcher", since=(2, 6))
# Same argv as 2.6 (every flag ppmulti passes kept its spelling, default and legacy fallback; checked against
# Paddle 3.3.1's paddle/distributed/launch); what changed is what it gives its workers and reads from the env.
PADDLE_3 = LauncherSpec(name="Paddle 3.x's launcher", since=(3,), master_in_ips_mode=True,
                        fixed_port_var=FLAGS_FIXED_PORT,
                        extra_worker_env=(PADDLE_AUTO_CLUSTER, HTTP_PROXY_ORIGINAL, HTTPS_PROXY_ORIGINAL),
                        env_dump_var=FLAGS_PRINT_LAUNCHER_ENV)

# Newest last; launcher_spec() takes the newest entry not newer than the installed Paddle.
LAUNCHERS: tuple[LauncherSpec, ...] = (PADDLE_2_6, PADDLE_3)


def launcher_spec(version: tuple[int, ...] | None = None) -> LauncherSpec:
    """The launcher facts for ``version`` (default: the installed Paddle). Without Paddle (a dry run on a
    laptop) or older than every entry: the oldest entry, the one ppmulti was written against."""
    if version is None:
        return _installed_spec()
    chosen = LAUNCHERS[0]
    for spec in LAUNCHERS:
        if tuple(version) >= spec.since:
            chosen = spec
    return chosen


# Collective timeouts, read in paddle/distributed/parallel.py and collective.py of 2.6.2 and 3.3.1 (the same in
# both): NCCL's process group takes PADDLE_PG_TIMEOUT (milliseconds, default 1,800,000 = 30 minutes); gloo's is
# created without a timeout (ProcessGroupGloo.create / create_gloo_comm_context take none), so gloo's built-in
# 30 s applies and no variable changes it.
GLOO_COLLECTIVE_TIMEOUT = 30.0


def collective_timeout_env(device: str, hang_timeout: float, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that make a GPU collective hang surface after the hang watchdog has spoken (twice its
    timeout, at least a minute more) instead of after 30 minutes; nothing when the user set PADDLE_PG_TIMEOUT,
    the watchdog is off, or the ranks use gloo (whose timeout cannot be set)."""
    if device != "gpu" or hang_timeout <= 0 or PADDLE_PG_TIMEOUT in environ:
        return {}
    return {PADDLE_PG_TIMEOUT: str(int((hang_timeout + max(60.0, hang_timeout)) * 1000))}


@lru_cache(maxsize=1)
def _installed_spec() -> LauncherSpec:
    # package metadata is read once per process: the installed Paddle does not change under a launch
    return launcher_spec(installed_version() or ())
