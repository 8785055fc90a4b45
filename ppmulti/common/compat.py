"""The version seam: everything that depends on the Paddle or ppdet version goes through here.

Two halves. The launcher's half (Paddle's launcher argv and environment names, the installed version read
from package metadata) imports nothing heavy, so the process side may use it. The rank's half (private
attributes, ``paddle.base`` internals, ppdet's quirks, export mode) imports paddle or ppdet inside its
functions only; the process side never calls it. Supporting another Paddle is this file plus its tests.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os

from ppmulti.common.envvars import PADDLE_SOT_SWITCH

# ------------------------------------------------------------------ the launcher's half (no paddle import)
from dataclasses import dataclass  # noqa: E402  (imported in this half: each half keeps its own imports)
from functools import lru_cache  # noqa: E402

from ppmulti.common.envvars import FLAGS_START_PORT, PADDLE_DISTRI_BACKEND, PADDLE_START_PORT  # noqa: E402


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


PADDLE_2_6 = LauncherSpec(name="Paddle 2.6's launcher", since=(2, 6))

# Newest last; launcher_spec() takes the newest entry not newer than the installed Paddle.
LAUNCHERS: tuple[LauncherSpec, ...] = (PADDLE_2_6,)


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


@lru_cache(maxsize=1)
def _installed_spec() -> LauncherSpec:
    # package metadata is read once per process: the installed Paddle does not change under a launch
    return launcher_spec(installed_version() or ())


# ------------------------------------------------------------------ the rank's half (paddle/ppdet inside)
_IMPORTED = False


def import_ppdet() -> None:
    """Import ppdet without its unconditional numba notice on stdout (it would garble logs and CSV pipes)."""
    global _IMPORTED
    if _IMPORTED:
        return
    # pycocotools must be imported before paddle with some builds; the pins make both orders safe,
    # importing it first costs nothing and keeps older environments alive.
    import pycocotools.coco  # noqa: F401
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        import ppdet  # noqa: F401
        import ppdet.modeling  # noqa: F401
    for line in buf.getvalue().splitlines():
        if "numba" not in line and line.strip():
            print(line)
    # ppdet's logger writes every debug line twice through the root logger otherwise.
    logging.getLogger("ppdet").propagate = False
    _IMPORTED = True


@contextlib.contextmanager
def full_graph_to_static():
    """ppdet 2.6.0's exporter reads ``static_model.forward.main_program``, which Paddle 2.6's default
    symbolic (SOT) mode refuses ("Can't call main_program when full_graph=False"); the AST mode
    that ppdet was written for is chosen by Paddle's ENABLE_FALL_BACK switch, read at call time."""
    old = os.environ.get(PADDLE_SOT_SWITCH)
    os.environ[PADDLE_SOT_SWITCH] = "False"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(PADDLE_SOT_SWITCH, None)
        else:
            os.environ[PADDLE_SOT_SWITCH] = old


def set_num_threads(threads: int) -> None:
    """OpenMP and MKL threads of this process (Paddle has no public API for it)."""
    import paddle

    paddle.base.core.set_num_threads(threads)


def batch_sampler(loader):
    """The batch sampler inside a ppdet/Paddle DataLoader (a private attribute of paddle.io.DataLoader), or None."""
    return getattr(loader, "_batch_sampler", None)
