"""Processes as Linux shows them in /proc (start time, liveness, environment, tagged processes) and exit codes."""

from __future__ import annotations

import os
import time
from typing import Iterator


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name (state first), None for a gone, dead or zombie process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else fields
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """``pid``'s start time in clock ticks since boot (None: no such live process); guards against pid reuse."""
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def state(pid: int) -> str | None:
    """``pid``'s state letter (R running, S sleeping, D disk, T stopped, t traced), None when gone."""
    fields = _stat(pid)
    return None if fields is None else fields[0]


def children(pid: int) -> list[int]:
    """``pid``'s child processes (every thread's), from /proc/PID/task/*/children."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def tree(pid: int) -> list[int]:
    """``pid`` and every live descendant (a data loader's workers, a compiler the rank runs)."""
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in seen or not alive(p):
            continue
        seen.append(p)
        todo.extend(children(p))
    return seen


def cpu_seconds(pids: list[int]) -> float:
    """CPU time used by ``pids`` and by their reaped children (user + system), in seconds."""
    ticks = 0
    for pid in pids:
        fields = _stat(pid)
        if fields is not None:
            ticks += sum(int(x) for x in fields[11:15])   # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    return _stat(pid) is not None


def pids() -> Iterator[int]:
    """Every process id in /proc."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def _read(pid: int, name: str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return None   # gone, or another user's


def environ(pid: int) -> dict[str, str] | None:
    """``pid``'s environment, None when it cannot be read (gone, or another user's)."""
    raw = _read(pid, "environ")
    if raw is None:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


PF_KTHREAD = 0x00200000   # /proc/PID/stat's flags: a kernel thread (no memory of its own, so no environment)
EXEC_WINDOW_ROUNDS, EXEC_WINDOW_WAIT = 5, 0.02


def tagged(key: str, value: str, sid: int | None = None, cmdline_mark: bytes | None = None) -> list[int]:
    """Live processes other than this one whose environment has ``key=value``; also those in session ``sid``
    and, with ``cmdline_mark``, those whose command line contains it (then one whose command line cannot be
    read is left out).

    A process inside exec shows an empty environment and command line from the moment the kernel swaps in its
    new memory until it has built the new stack, and Python's Popen returns within that window: a user process
    read so is read again, in up to EXEC_WINDOW_ROUNDS rounds EXEC_WINDOW_WAIT s apart for all of them."""
    me = os.getpid()
    found, empty = [], []
    for pid in pids():
        if pid == me:
            continue
        fields = _stat(pid)
        if fields is None:
            continue
        if sid is not None and int(fields[3]) == sid:
            found.append(pid)
            continue
        if int(fields[6]) & PF_KTHREAD:
            continue
        verdict = _tag_matches(pid, key, value, cmdline_mark)
        if verdict is None:
            empty.append(pid)
        elif verdict:
            found.append(pid)
    for _ in range(EXEC_WINDOW_ROUNDS):
        if not empty:
            break
        time.sleep(EXEC_WINDOW_WAIT)
        verdicts = {pid: _tag_matches(pid, key, value, cmdline_mark) for pid in empty}
        found += [pid for pid, verdict in verdicts.items() if verdict]
        empty = [pid for pid, verdict in verdicts.items() if verdict is None and alive(pid)]
    return found


def _tag_matches(pid: int, key: str, value: str, cmdline_mark: bytes | None) -> bool | None:
    """Whether ``pid`` carries the tag; None while both its environment and command line read empty (inside
    exec, see ``tagged``; a process started with an empty environment has its command line)."""
    env = environ(pid)
    if env is None:
        return False
    if env.get(key) == value:
        return True
    if env and cmdline_mark is None:
        return False
    cmdline = _read(pid, "cmdline")   # read only for a mark, or to tell an empty environment from exec's window
    if cmdline is None:
        return False
    if not env and not cmdline:
        return None
    return cmdline_mark is not None and cmdline_mark in cmdline


def exit_code(returncode: int) -> int:
    """A Popen return code as a shell reports it: killed by signal N (returncode -N) -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode
