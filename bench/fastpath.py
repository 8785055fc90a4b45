"""Fast-path changes measured before and after, side by side: the demo config with 1 and 2 ranks under
variants (threads per rank, loader workers, shared memory, one training size), interleaved over rounds.

Each case is one probe (``ppmulti.rank.bench_probe train``, real processes, 2 ranks through ``ppmulti launch``)
of ``--steps`` steps; the figure is images/s over the steps after the warm-up, median over the rounds.
Prints a markdown table and writes it with the raw records to ``--out``.

    python bench/fastpath.py --rounds 2 --steps 12
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ppmulti.common.envvars import KMP_BLOCKTIME, PPMULTI_CPU_CONV, PPMULTI_CPU_THREADS  # noqa: E402
from ppmulti.procs.bench import runner  # noqa: E402

FIXED = str(REPO / "bench/configs/demo_fixed160.yml")
DEMO = "demo"

# label -> (config, ranks, env, workers, extra -o overrides)
SPIN, SLEEP = {PPMULTI_CPU_THREADS: "2", KMP_BLOCKTIME: "200"}, {PPMULTI_CPU_THREADS: "2", KMP_BLOCKTIME: "0"}
CASES = {
    "1 rank, 2 threads": (DEMO, 1, {PPMULTI_CPU_THREADS: "2"}, 1, []),
    "1 rank, 1 thread": (DEMO, 1, {PPMULTI_CPU_THREADS: "1"}, 1, []),
    "2 ranks, 1 thread each, worker_num 1 (config as is)": (DEMO, 2, {}, 1, []),
    "2 ranks, 2 threads each (oversubscribed)": (DEMO, 2, {PPMULTI_CPU_THREADS: "2"}, 1, []),
    "2 ranks, worker_num 0 (loading in the rank)": (DEMO, 2, {}, 0, []),
    "2 ranks, worker_num 1, shared memory": (DEMO, 2, {}, 1, ["TrainReader.use_shared_memory=true"]),
    "2 ranks, worker_num 1, no shared memory": (DEMO, 2, {}, 1, ["TrainReader.use_shared_memory=false"]),
    "1 rank, threads as ppmulti chooses them": (DEMO, 1, {}, 1, []),
    "1 rank, one size (160 px)": (FIXED, 1, {}, 1, []),
    "2 ranks, one size (160 px)": (FIXED, 2, {}, 1, []),
    "1 rank, 2 threads, OpenMP spinning 200 ms (before)": (DEMO, 1, SPIN, 1, []),
    "1 rank, 2 threads, idle threads sleep (after)": (DEMO, 1, SLEEP, 1, []),
    "2 ranks, 2 threads each, spinning 200 ms": (DEMO, 2, SPIN, 1, []),
    "2 ranks, 2 threads each, idle threads sleep": (DEMO, 2, SLEEP, 1, []),
    "1 rank, Paddle's conv2d (before)": (DEMO, 1, {PPMULTI_CPU_CONV: "paddle"}, 1, []),
    "1 rank, oneDNN conv op (after)": (DEMO, 1, {PPMULTI_CPU_CONV: "onednn"}, 1, []),
    "2 ranks, Paddle's conv2d (before)": (DEMO, 2, {PPMULTI_CPU_CONV: "paddle"}, 1, []),
    "2 ranks, oneDNN conv op (after)": (DEMO, 2, {PPMULTI_CPU_CONV: "onednn"}, 1, []),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16, help="global batch (default 16, as the demo)")
    ap.add_argument("--cases", help="comma-separated case numbers (1-based) to run; default all")
    ap.add_argument("--data", help="demo dataset dir (default: 128 images of 256 px generated)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "fastpath"))
    args = ap.parse_args()
    from ppmulti.common.synthdata import exists, generate
    from ppmulti.common.atomic import atomic_write_text

    work = Path(tempfile.mkdtemp(prefix="ppmulti_fastpath_"))
    data = Path(args.data) if args.data else work / "data"
    if not exists(data):
        generate(data, fmt="both", n_train=128, n_val=4, size=256, seed=0)
    labels = list(CASES)
    if args.cases:
        labels = [labels[int(i) - 1] for i in args.cases.split(",")]
    base = runner.BenchPlan(batch=args.batch, steps=args.steps, warmup=2)
    got: dict[str, list[dict]] = {k: [] for k in labels}
    for r in range(args.rounds):
        order = labels if r % 2 == 0 else list(reversed(labels))
        for label in order:
            config, ranks, env, workers, extra = CASES[label]
            plan = replace(base, env=env, workers=workers)
            print(f"[fastpath] round {r + 1}/{args.rounds}: {label}", flush=True)
            try:
                case = runner.run_case(plan, "train", config, ranks, data, work, extra_overrides=extra)
            except RuntimeError as exc:
                print(f"  failed: {str(exc).splitlines()[0]}", flush=True)
                continue
            rec = dict(case.rank0, launch_to_first_step_s=case.rank0["first_step_at"] - case.started_at)
            rec.pop("step_times", None)
            got[label].append(rec)
            print(f"  {rec['img_s']:.2f} img/s, {rec['cpu_util']:.2f} cores busy (rank 0)", flush=True)
    med = {k: statistics.median([x["img_s"] for x in v]) if v else 0.0 for k, v in got.items()}
    one = med.get(labels[0]) or 0.0
    lines = [f"| case | images/s (median of {args.rounds}) | each round | vs first row |", "| --- | --- | --- | --- |"]
    for k in labels:
        each = ", ".join(f"{x['img_s']:.2f}" for x in got[k])
        lines.append(f"| {k} | {med[k]:.2f} | {each} | {med[k] / one if one else 0:.2f}x |")
    fixed = [k for k in labels if "one size" in k]
    if len(fixed) == 2 and med[fixed[0]]:
        lines.append(f"\n2 ranks vs 1 with one size: {med[fixed[1]] / med[fixed[0]]:.2f}x")
    table = "\n".join(lines) + "\n"
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "fastpath.md", table)
    atomic_write_text(out / "fastpath.json", json.dumps(got, indent=1) + "\n")


if __name__ == "__main__":
    main()
