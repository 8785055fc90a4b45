"""``ppmulti bench`` on two Python/Paddle stacks side by side: runs alternate (A B A B ...), one table of ratios.

Each stack is a Python interpreter that has ppmulti installed (a venv made by README's command). Every round
runs ``PY -m ppmulti.cli bench --repeat 1 --out OUT/<stack>-<round>`` for each stack in turn, so background load
and thermal drift fall on both; the table gives each case's images/s per round, the median of the rounds,
the ratio of the medians (B / A) and the spread (max / min - 1) within each stack, which says how far the ratio
can be trusted. The load average is recorded before every run.

Run:  python bench/stacks.py --python A=/path/venv311/bin/python --python B=/path/venv312/bin/python --rounds 3 \
          -- --steps 36
(``ppmulti bench``'s default 12 steps per case spread 24-40% between runs of one stack on a 2-core VM; 36 steps
brought most cases under 15%. Read a ratio only beside its spread.)
Writes OUT/stacks.json and OUT/stacks.md (default bench/results/stacks); extra arguments after ``--`` go to
``ppmulti bench`` (e.g. ``-- --models yolov5s --ranks 1``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _version(python: str) -> str:
    code = ("import sys; from importlib import metadata as m; "
            "print(f\"Python {sys.version.split()[0]}, paddlepaddle {m.version('paddlepaddle')}\")")
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def _cases(bench: dict) -> dict[str, dict]:
    """Case name -> {img_s, rss_mb (peak per rank, max), cpu_util, data_wait_s} from one bench.json."""
    cases = {}
    for row in bench["rows"]:
        cases[f"{row['model']}, {row['ranks']} rank{'s' if row['ranks'] > 1 else ''}"] = {
            "img_s": row["img_s"], "rss_mb": max(row["peak_rss_mb"]), "cpu_util": row["cpu_util"],
            "data_wait_s": row["data_wait_s"]}
    p = bench["ppdet"]
    cases[f"ppdet's Trainer, {p['model']}, 1 rank"] = {"img_s": p["ppdet_img_s"]}
    return cases


def run(stacks: dict[str, str], rounds: int, out: Path, extra: list[str]) -> dict:
    """Alternate the stacks for ``rounds`` rounds; return {stack: {version, runs: [{load, cases}]}}."""
    result = {name: {"python": py, "version": _version(py), "runs": []} for name, py in stacks.items()}
    for r in range(rounds):
        for name, py in stacks.items():
            dest = out / f"{name}-{r + 1}"
            load = os.getloadavg()[0]
            print(f"round {r + 1}/{rounds}: {name} ({result[name]['version']}), load {load:.2f}", flush=True)
            started = time.time()
            subprocess.run([py, "-m", "ppmulti.cli", "bench", "--repeat", "1", "--out", str(dest), *extra],
                           cwd=REPO, check=True, stdout=subprocess.DEVNULL)
            bench = json.loads((dest / "bench.json").read_text())
            result[name]["runs"].append({"load_1min": load, "seconds": time.time() - started,
                                         "cases": _cases(bench)})
    return result


def table(result: dict) -> str:
    """Markdown: per case, each stack's runs and median, the ratio of medians (last / first) and the spreads."""
    names = list(result)
    first, last = names[0], names[-1]
    lines = [" / ".join(f"{n}: {result[n]['version']}" for n in names), "",
             "| case | " + " | ".join(f"{n} img/s (runs; median)" for n in names)
             + f" | {last} / {first} | spread {' / '.join(names)} | peak RSS per rank {' / '.join(names)} |",
             "| --- |" + " --- |" * (len(names) + 3)]
    for case in result[first]["runs"][0]["cases"]:
        cells, medians, spreads, rss = [], {}, [], []
        for n in names:
            values = [run["cases"][case]["img_s"] for run in result[n]["runs"] if case in run["cases"]]
            medians[n] = statistics.median(values)
            cells.append(f"{' / '.join(f'{v:.2f}' for v in values)}; **{medians[n]:.2f}**")
            spreads.append(f"{(max(values) / min(values) - 1) * 100:.0f}%" if min(values) > 0 else "-")
            mem = [run["cases"][case].get("rss_mb") for run in result[n]["runs"]]
            rss.append(f"{statistics.median(mem):.0f} MB" if all(mem) else "-")
        ratio = medians[last] / medians[first] if medians[first] else 0.0
        lines.append(f"| {case} | " + " | ".join(cells) + f" | **{ratio:.2f}** | {' / '.join(spreads)} | "
                     f"{' / '.join(rss)} |")
    loads = [f"{run['load_1min']:.2f}" for n in names for run in result[n]["runs"]]
    lines += ["", f"load average (1 min) before each run: {', '.join(loads)}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    given = list(argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", action="append", required=True, metavar="NAME=PYTHON",
                    help="a stack: a name and an interpreter with ppmulti installed (give two or more)")
    ap.add_argument("--rounds", type=int, default=3, help="alternations (default 3)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "stacks"))
    ns = ap.parse_args(argv)
    stacks = dict(item.split("=", 1) for item in ns.python)
    if len(stacks) < 2 or any(not Path(py).exists() for py in stacks.values()):
        ap.error("give at least two --python NAME=PYTHON with existing interpreters")
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(stacks, ns.rounds, out, extra)
    # each results file carries its command and date (docs/performance.md links them)
    import shlex
    import time

    command = "python bench/stacks.py " + shlex.join(given)
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    (out / "stacks.json").write_text(json.dumps({"command": command, "date": date, **result}, indent=1))
    text = f"# Paddle stacks side by side\n\nCommand: `{command}`; {date}.\n\n" + table(result)
    (out / "stacks.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
