"""Where ppmulti keeps caches: the names of its shared-memory files (known to ranks and launcher) and the user
cache directory."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Mapping

from ppmulti.common import envvars as E

SHM_DIR = "/dev/shm"
CACHE_PREFIX = "ppmulti-cache-"


def shm_dir() -> str:
    """/dev/shm where it exists (Linux), else the temp dir: a file there is RAM only on Linux."""
    return SHM_DIR if os.path.isdir(SHM_DIR) else tempfile.gettempdir()


def launch_tag(launch_dir: str) -> str:
    """The part of a segment's name that says which launch (one per node) made it."""
    return "l" + hashlib.sha1(os.path.abspath(launch_dir).encode()).hexdigest()[:12]


def run_tag(environ: Mapping[str, str] | None = None) -> str:
    """Who shares one RAM cache: the ranks of one node of one launch attempt.

    Under ``ppmulti launch`` every node has its own launch directory (two loopback nodes on one machine too),
    so each node builds its own copy, and the launcher removes ``<launch tag>-*`` leftovers after every
    attempt. Under Paddle's launcher alone: the trainer endpoints (fresh ports every launch) and the node. A lone
    process: its pid.
    """
    env = os.environ if environ is None else environ
    info = E.worker_info(env)
    record = E.launch_record(env)
    if record.directory:
        return f"{launch_tag(record.directory)}-r{record.restart}"
    if E.in_paddle_worker(env):
        seed = f"{env.get(E.PADDLE_TRAINER_ENDPOINTS, '')}|{env.get(E.PADDLE_JOB_ID, '')}|{info.node_rank}"
        return "e" + hashlib.sha1(seed.encode()).hexdigest()[:12]
    return f"p{os.getpid()}"


def segment_path(key: str, environ: Mapping[str, str] | None = None) -> str:
    """The /dev/shm file of one RAM cache (``key``: the dataset's images, size and resize rule)."""
    return os.path.join(shm_dir(), f"{CACHE_PREFIX}{run_tag(environ)}-{key[:16]}")


def _names(directory: str) -> list[str]:
    """The entries of a shared-memory directory; none if it cannot be read."""
    try:
        return os.listdir(directory)
    except OSError:
        return []


def launch_leftovers(launch_dir: str, directory: str | None = None) -> list[str]:
    """RAM-cache files (segments, their lock and count files) a launch's ranks left behind: a rank killed while
    the cache was being built, before every rank had mapped it (afterwards the file is already unlinked)."""
    directory = directory or shm_dir()
    prefix = f"{CACHE_PREFIX}{launch_tag(launch_dir)}-"
    return [os.path.join(directory, n) for n in _names(directory) if n.startswith(prefix)]


def dead_lone_leftovers(directory: str | None = None) -> list[str]:
    """RAM-cache files of lone processes (``<prefix>p<pid>-...``, no launcher to sweep them) whose process is
    gone: one killed while it built its cache. The next RAM cache built on the node removes them."""
    from ppmulti.common.procfs import alive

    directory = directory or shm_dir()
    left = []
    for name in _names(directory):
        if name.startswith(CACHE_PREFIX + "p"):
            pid = name[len(CACHE_PREFIX) + 1:].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)):
                left.append(os.path.join(directory, name))
    return left


def paddle_shm_of(pids: set[int], directory: str | None = None) -> list[str]:
    """Paths of Paddle's data-loader shared memory (``paddle_<pid of the writing worker>_...``) written by ``pids``."""
    directory = directory or shm_dir()
    found = []
    for name in _names(directory):
        parts = name.split("_")
        if len(parts) >= 3 and parts[0] == "paddle" and parts[1].isdigit() and int(parts[1]) in pids:
            found.append(os.path.join(directory, name))
    return found


def remove_paddle_shm_of(pids: set[int], directory: str | None = None) -> list[str]:
    """Remove Paddle's data-loader shared memory written by ``pids``, workers that have ended: batches they made
    that no reader took. Returns the names removed."""
    removed = []
    for path in paddle_shm_of(pids, directory):
        try:
            os.unlink(path)
            removed.append(os.path.basename(path))
        except FileNotFoundError:
            pass
    return removed


def user_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$XDG_CACHE_HOME/ppmulti, else ~/.cache/ppmulti: caches of datasets whose folders are read-only."""
    env = os.environ if environ is None else environ
    base = env.get(E.XDG_CACHE_HOME) or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ppmulti"


def lock_path(what: str) -> str:
    """A node-local lock file for building ``what`` (a cache path) once: in the temp dir, so that no lock file
    is left in a dataset folder (the builder removes it when done)."""
    return os.path.join(tempfile.gettempdir(), f"ppmulti-lock-{hashlib.sha1(str(what).encode()).hexdigest()[:20]}")
