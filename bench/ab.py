"""Two ways of doing one thing timed side by side: alternated rounds, and the result json with its commit and date."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]


def commit() -> str:
    """The checkout's commit as results name it (``-dirty`` when the tree has uncommitted changes)."""
    out = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def alternate(ways: dict[str, Callable[[], Any]], rounds: int,
              check: Callable[[dict[str, Any]], None] | None = None) -> dict[str, list[float]]:
    """Run every way once a round, in order, for ``rounds`` rounds; ``check`` sees each round's returns by way
    (it raises when the ways disagree). Returns each way's seconds, round by round."""
    times: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(rounds):
        returned = {}
        for way, run in ways.items():
            t = time.perf_counter()
            returned[way] = run()
            times[way].append(time.perf_counter() - t)
        if check is not None:
            check(returned)
    return times


def write(out: str, script: str, load_before: float, facts: dict[str, Any], versions: dict[str, str],
          times: dict[str, list[float]]) -> dict[str, Any]:
    """The result json (written atomically, and printed): when, at which commit, with which command and machine,
    ``facts``, each way's median/min/max seconds and the first way's median over the second's (``speedup``)."""
    from ppmulti.common.atomic import atomic_write_text

    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit(),
              "command": f"python bench/{script} " + " ".join(sys.argv[1:]),
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "load_before": round(load_before, 2), **facts,
              "versions": {**versions, "python": platform.python_version()},
              "seconds": {way: {"median": round(statistics.median(v), 4), "min": round(min(v), 4),
                                "max": round(max(v), 4)} for way, v in times.items()}}
    first, second = (result["seconds"][way]["median"] for way in list(times)[:2])
    result["speedup"] = round(first / second, 2)
    atomic_write_text(out, json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result
