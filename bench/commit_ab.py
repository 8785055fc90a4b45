"""One ``ppmulti yolo detect train`` at two commits, alternated: what a change to the training loop did to an epoch.

BASE is checked out in a temporary git worktree; each run imports ppmulti from its own tree (PYTHONPATH first,
before the editable install), with the same keys, data and threads, in a new run directory each round. Rounds
alternate BASE and the checkout, so a slow spell of the host falls on both. Reported for each: the whole
command's wall time, the training time results.csv ends with, and the median epoch (epoch 1 left out: it
builds the loader workers and compiles).

Run (on an idle machine; commit the change first, so that the json names both commits):
    python bench/commit_ab.py --base REV [--rounds 3] [--model yolov8n.yaml] [--epochs 8] [--imgsz 160]
        [--batch 16] [--workers 2] [--work /tmp/commit_ab] [--out bench/results/commit_ab.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ppmulti.common.cpus import ULTRALYTICS_SPARE_CORES

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab  # noqa: E402  (alternated rounds, the result json)
import ultra_train  # noqa: E402  (results.csv as epochs)
import vs_yolov5 as vs  # noqa: E402  (a timed command, threads per rank)

REPO = ab.REPO


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the commit to compare the checkout with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="yolov8n.yaml")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--imgsz", type=int, default=160)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", default="/tmp/commit_ab")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "commit_ab.json"))
    return ap.parse_args(argv)


def epoch_summary(epochs: list[dict]) -> dict:
    """A run's training seconds (results.csv's last ``time``) and its median epoch after the first."""
    later = [e["seconds"] for e in epochs[1:]] or [e["seconds"] for e in epochs]
    return {"train_s": epochs[-1]["time"], "median_epoch_s": round(statistics.median(later), 3)}


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    from ppmulti.common.synthdata import exists, generate

    work = Path(a.work).resolve()
    data_dir = work / "demo"
    if not exists(data_dir, fmt="yolo"):
        generate(data_dir, fmt="yolo")
    base_tree = work / "base"
    base = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", a.base], capture_output=True, text=True,
                          check=True).stdout.strip()
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)], capture_output=True)
    shutil.rmtree(base_tree, ignore_errors=True)
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base_tree), base], check=True,
                   capture_output=True)
    threads, env = vs.ppmulti_threads(1, auto=True, spare=ULTRALYTICS_SPARE_CORES)   # the yolo line's rule
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    keys = [f"model={a.model}", f"data={data_dir / 'data.yaml'}", f"imgsz={a.imgsz}", f"batch={a.batch}",
            f"epochs={a.epochs}", f"workers={a.workers}", "device=cpu", "seed=0", "deterministic=True",
            "pretrained=False", "amp=False", "plots=False"]
    ways = {"checkout": ("head", REPO), f"base {base}": ("base", base_tree)}
    runs: dict[str, list[dict]] = {way: [] for way in ways}

    def train(way: str, label: str, tree: Path):
        def run() -> None:
            name = f"{label}{len(runs[way]) + 1}"
            project = work / "runs"
            shutil.rmtree(project / name, ignore_errors=True)
            cmd = [str(Path(sys.executable).parent / "ppmulti"), "yolo", "detect", "train", *keys,
                   f"project={project}", f"name={name}", "exist_ok=True"]
            vs._run(cmd, work / f"{name}.log", env={**env, "PYTHONPATH": str(tree)}, cwd=work)
            runs[way].append(epoch_summary(ultra_train.read_epochs(project / name / "results.csv")))
        return run

    load = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        times = ab.alternate({way: train(way, *place) for way, place in ways.items()}, a.rounds)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)], capture_output=True)
    facts = {"started": started, "what": "one ppmulti yolo detect train at the checkout and at BASE, alternated",
             "keys": " ".join(keys).replace(str(data_dir), "demo"), "threads": threads, "rounds": a.rounds,
             "runs": runs,
             "median": {way: {k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0]}
                        for way, rs in runs.items()}}
    from importlib.metadata import version

    ab.write(a.out, "commit_ab.py", load, facts, {"paddlepaddle": version("paddlepaddle")}, times)
    return 0


if __name__ == "__main__":
    sys.exit(main())
