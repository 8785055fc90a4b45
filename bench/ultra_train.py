"""YOLOv8n, YOLO11n and YOLO26n trained from scratch by ultralytics itself and by ppmulti: final mAP50 and time.

What is compared (issue 43, item 7)
    The demo set (ppmulti.common.synthdata, seed 0: 256 train / 64 val images of 256 x 256, 3 classes, YOLO layout
    with data.yaml, written to WORK/demo). For every model yaml (--models, default yolov8n.yaml, yolo11n.yaml,
    yolo26n.yaml) and seed (--seeds, default 0,1,2) three cases train with the same keys,
    ``model=M data=D imgsz=S batch=B epochs=E workers=W device=cpu seed=K deterministic=True pretrained=False
    amp=False plots=False``:
      * ultralytics -- ``yolo detect train ...`` from --ultra-python's venv (ultralytics + torch; never a ppmulti
                       dependency), one process; torch takes every core.
      * ppmulti/1   -- ``ppmulti yolo detect train ...``, one process (Paddle threads: ppmulti's own rule).
      * ppmulti/2   -- the same with ``nproc=2``: 2 gloo ranks on this machine's CPUs, ``batch`` the global
                       batch (8 per rank), each rank with cores // 2 threads.
    ``workers=W`` is on both lines, and each tool does with it what it does for its users: ultralytics 8.4 sets
    workers to 0 on a CPU (BaseTrainer: loading in the training process), ppmulti runs W loader processes per rank.
    ``--cases`` picks a subset. Order: seed by seed, model by model, the three cases rotating one place each seed
    (U 1 2, 1 2 U, 2 U 1) so a drift in the machine's speed touches every case alike.

One metric
    Each run's final weights -- ultralytics' ``weights/last.pt`` and ppmulti's ``weights/last.pdparams``, both the
    EMA weights after the last epoch -- are scored after the run (untimed) by the same evaluator,
    ``ppmulti yolo val model=W data=D imgsz=S batch=B``: pycocotools' mAP50 with ultralytics' val settings (rect
    batches, conf 0.001, iou 0.7, max_det 300; YOLO26 read through its one-to-many head and NMS, ultralytics'
    default). It reads ultralytics' .pt without torch; bench/results/ultra_parity.md shows it within 0.002 mAP50 of
    ultralytics' own val on the same weights. Each side's own per-epoch mAP50 (its results.csv: both write
    ultralytics' columns) is recorded too, but only as the learning curve: both validate in ultralytics' trainer's
    rect batches, each with its own AP (ultralytics' interpolation, ppmulti pycocotools').

Time
    * process wall time: the training command from start to exit (start-up, every epoch and its validation, the
      final validation each tool runs);
    * training time: results.csv's ``time`` column at the last epoch, cumulative seconds since training started,
      each epoch's validation included, on both sides (ultralytics' BaseTrainer.save_metrics; ppmulti's
      ResultsHook, which starts its clock in before_train); per-epoch seconds are its differences.
    * time to target: the mean curve of ppmulti/2 over the seeds (mean cumulative seconds and mean mAP50, epoch by
      epoch; the last epoch's mAP50 is each seed's score by the evaluator above, the earlier ones its own
      validation) against ultralytics' mean final mAP50 (the evaluator's); the seconds to the first epoch that
      reaches it, as a fraction of ultralytics' mean training time.

Goals checked per model (PASS/FAIL in the markdown, with the numbers)
    1. accuracy: ppmulti/1's mean final mAP50 >= ultralytics' (the same recipe in one process);
    2. speed: ppmulti/1's mean process wall time <= ultralytics';
    3. scaling: ppmulti/2 reaches ultralytics' mean final mAP50 in <= 0.75 of ultralytics' mean training time.

Defaults and cost
    imgsz 160, batch 16, 20 epochs, workers 2: 27 trainings (3 models x 3 seeds x 3 cases) and 27 evaluations.
    Measured here on 2026-12-02, yolov8n at imgsz 160 for 2 epochs, while other jobs kept the load average at 8-13
    on the 2 cores (so the wall times are several times an idle machine's): seconds per epoch (results.csv, its
    validation included) ultralytics 33.4, ppmulti/1 37.7, ppmulti/2 26.2; CPU seconds of the whole command
    (start-up, 2 epochs, final validation) 41, 34 and 48; each evaluation 30-38 s wall. From the CPU seconds (about
    15 per epoch at this size, the 2 cores about 1.7x one) and the models' size (YOLO11n and YOLO26n 0.6-0.75 of
    YOLOv8n's GFLOPs): about 10 s an epoch on an idle machine, 3-3.5 min a yolov8n training, 60-75 minutes for
    the whole default run. Measured on 2026-12-03, idle: 91 minutes, 2.5-4.8 min a training, about 10 s an
    evaluation; on 2026-12-04 on a 2-core Intel Xeon: 67 minutes. ``--epochs 15`` takes a quarter off;
    ``--models``/``--seeds`` split it over sessions (the json resumes).
    Not alike, and not hidden: ultralytics' command validates best.pt once more after its last epoch (a few
    seconds, in its wall time); ppmulti's does not.

Resumable
    WORK keeps every run's directory (WORK/runs/<model>/<case>_seed<K>) and logs. The json (--out) is written
    atomically after every case; a case whose record is in it is not trained again, so an interrupted bench
    continues where it stopped (with the same settings: other settings are refused; --fresh starts over).

Run (on an idle machine):
    python bench/ultra_train.py --ultra-python ULTRA_VENV/bin/python
        [--models yolov8n.yaml yolo11n.yaml yolo26n.yaml] [--seeds 0,1,2] [--cases ultralytics,ppmulti/1,ppmulti/2]
        [--epochs 20] [--imgsz 160] [--batch 16] [--workers 2] [--ppmulti-keys sync_bn=True] [--work /tmp/ultra_train]
        [--fresh]
Writes bench/results/ultra_train.json and ultra_train.md (--out; the .md beside the .json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ppmulti.common.cpus import ULTRALYTICS_SPARE_CORES

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab  # noqa: E402  (the commit results name)
import time_to_accuracy as tta  # noqa: E402  (mean curves, seconds to a target, --seeds)
import ultra_parity  # noqa: E402  (ppmulti's val, its result line parsed)
import vs_yolov5 as vs  # noqa: E402  (running a timed command, threads per rank, offline ultralytics)

REPO = vs.REPO
CASES = ("ultralytics", "ppmulti/1", "ppmulti/2")
DEFAULT_MODELS = ("yolov8n.yaml", "yolo11n.yaml", "yolo26n.yaml")
DEFAULT_OUT = REPO / "bench" / "results" / "ultra_train.json"
SCALING_GOAL = 0.75
SETTINGS = ("epochs", "imgsz", "batch", "workers", "ppmulti_keys")   # what every record of one json must share
VERSIONS = """
import json, platform, torch, ultralytics
print("VERSIONS " + json.dumps({"ultralytics": ultralytics.__version__, "torch": torch.__version__,
                                "python": platform.python_version()}))
"""


# ============================================================================ pure parts (tested)
def read_epochs(csv_path: str | os.PathLike) -> list[dict]:
    """A results.csv (ultralytics' columns, either side) as epochs: cumulative ``time``, that epoch's ``seconds``
    and its own ``mAP50`` (None where the epoch was not validated)."""
    from ppmulti.common.metrics import read_results

    cols = read_results(csv_path)
    if "time" not in cols or "mAP50" not in cols:
        raise SystemExit(f"{csv_path}: no time or metrics/mAP50(B) column: not an ultralytics-style results.csv")
    epochs, before = [], 0.0
    for epoch, t, m in zip(cols["epoch"], cols["time"], cols["mAP50"]):
        epochs.append({"epoch": int(epoch), "time": round(t, 3), "seconds": round(t - before, 3),
                       "mAP50": None if math.isnan(m) else round(m, 4)})
        before = t
    return epochs


def rotation(seeds: list[int], models: list[str], cases: list[str]) -> list[tuple[int, str, str]]:
    """(seed, model, case) in running order: seed by seed, model by model, the cases rotated one place a seed."""
    order = []
    for i, seed in enumerate(seeds):
        shift = i % len(cases)
        for model in models:
            order += [(seed, model, case) for case in cases[shift:] + cases[:shift]]
    return order


def stale_runs(runs: dict[str, dict], settings: dict) -> list[str]:
    """The records trained with other settings than ``settings`` (epochs, imgsz, batch, workers): a resumed
    bench must not mix them."""
    def full(given: dict) -> dict:   # a record written before --ppmulti-keys existed ran with none
        return {"ppmulti_keys": [], **given}

    return [key for key, r in runs.items() if "settings" not in r or full(r["settings"]) != full(settings)]


def target_curve(run: dict) -> list[dict]:
    """A run's epochs with the last one's mAP50 replaced by the evaluator's score of its final weights."""
    epochs = [dict(e) for e in run["epochs"]]
    if epochs:
        epochs[-1]["mAP50"] = run["final"]["mAP50"]
    return epochs


def _spread(values: list[float]) -> dict:
    return {"mean": round(statistics.fmean(values), 4), "min": round(min(values), 4), "max": round(max(values), 4),
            "n": len(values)}


def summarize(runs: dict[str, dict], model: str) -> dict:
    """One model's cases over their seeds (final mAP50, times, mean curve) and the three goal checks."""
    cases: dict[str, dict] = {}
    for case in CASES:
        done = sorted((r for r in runs.values() if r["model"] == model and r["case"] == case),
                      key=lambda r: r["seed"])
        if not done:
            continue
        curve = tta.mean_curve([target_curve(r) for r in done])
        total = 0.0
        for e in curve:   # mean cumulative seconds, epoch by epoch
            total += e["seconds"]
            e["time"] = round(total, 3)
        cases[case] = {
            "seeds": [r["seed"] for r in done],
            "final_mAP50": _spread([r["final"]["mAP50"] for r in done]),
            "final_mAP50_per_seed": [r["final"]["mAP50"] for r in done],
            "own_final_mAP50": _spread([tta.final_map(r["epochs"]) for r in done]),
            "wall_s": _spread([r["wall_s"] for r in done]),
            "cpu_s": _spread([r["cpu_s"] for r in done]),
            "train_s": _spread([r["epochs"][-1]["time"] for r in done]),
            "s_per_epoch": round(statistics.fmean(r["epochs"][-1]["time"] / len(r["epochs"]) for r in done), 3),
            "mean_curve": curve}
    return {"cases": cases, "goals": goals(cases)}


def goals(cases: dict[str, dict]) -> dict[str, dict]:
    """The three checks of issue 43 item 7 (a check whose cases were not run is absent)."""
    out: dict[str, dict] = {}
    u, one, two = (cases.get(c) for c in CASES)
    if u is None:
        return out
    target, u_train = u["final_mAP50"]["mean"], u["train_s"]["mean"]
    if one is not None:
        a = one["final_mAP50"]["mean"]
        out["accuracy"] = {"ok": a >= target, "ppmulti": a, "ultralytics": target,
                           "text": f"ppmulti/1 mean final mAP50 {a:.3f} vs ultralytics {target:.3f}"}
        w, uw = one["wall_s"]["mean"], u["wall_s"]["mean"]
        out["speed"] = {"ok": w <= uw, "ppmulti": w, "ultralytics": uw, "ratio": round(w / uw, 3),
                        "text": f"ppmulti/1 mean wall {w:.0f} s vs ultralytics {uw:.0f} s ({w / uw:.2f}x)"}
    if two is not None:
        reach = tta.seconds_to(two["mean_curve"], target)
        ratio = None if reach is None else round(reach[0] / u_train, 3)
        text = (f"ppmulti/2 reaches {target:.3f} " + (f"at epoch {reach[1]} in {reach[0]:.0f} s = {ratio:.2f} of "
                                                     f"ultralytics' {u_train:.0f} s" if reach else
                                                     f"in none of its epochs (final {two['final_mAP50']['mean']:.3f})")
                + f" (at most {SCALING_GOAL} asked)")
        out["scaling"] = {"ok": ratio is not None and ratio <= SCALING_GOAL, "reach": reach, "ratio": ratio,
                          "ultralytics_train_s": u_train, "target": target, "text": text}
    return out


def curve_text(curve: list[dict], points: int = 5) -> str:
    """A mean curve at about ``points`` epochs spread evenly, the last included: ``0.12 @4, ... (s @epoch)``."""
    step = max(1, math.ceil(len(curve) / points))
    picked = curve[len(curve) - 1::-step][::-1]
    return ", ".join(("-" if e["mAP50"] is None else f"{e['mAP50']:.2f}") + f" @{e['epoch']} ({e['time']:.0f} s)"
                     for e in picked)


def markdown(result: dict) -> str:
    """The results as a page: conditions, one table per model, the goal checks."""
    c, m = result["conditions"], result["machine"]
    lines = ["# YOLOv8n, YOLO11n, YOLO26n from scratch: ultralytics against ppmulti", "",
             f"Measured {result['started']} to {result['finished']} UTC at commit {result['commit']} with",
             "", "```", result["command"], "```", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['platform']}; load average before the first case "
             f"{m['load_before']}, the highest before a case {m['load_max']} (the 1-minute average, which "
             "still counts the case before it).",
             f"Versions: {', '.join(f'{k} {v}' for k, v in result['versions'].items())}.",
             f"Data: {c['data']}. Keys on both sides: `{c['keys']}`. Seeds {c['seeds']}.",
             "Final mAP50: each run's last weights scored by `ppmulti yolo val` (pycocotools, ultralytics' val "
             "settings); own: the run's own last validation (results.csv). Training s: results.csv `time` at the "
             "last epoch; wall s: the whole training command; CPU s: its processes' user + system seconds. Curves: the "
             "runs' own validation averaged over the seeds, the last epoch the evaluator's, with the mean "
             "cumulative seconds.", ""]
    for model, s in result["summary"].items():
        lines += [f"## {model}", "",
                  "| case | final mAP50 mean (min-max) | per seed | own final mAP50 | wall s | training s "
                  "| s/epoch | CPU s |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for case, r in s["cases"].items():
            f = r["final_mAP50"]
            lines.append(f"| {case} | {f['mean']:.3f} ({f['min']:.3f}-{f['max']:.3f}) | "
                         + " / ".join(f"{v:.3f}" for v in r["final_mAP50_per_seed"])
                         + f" | {r['own_final_mAP50']['mean']:.3f} | {r['wall_s']['mean']:.0f} | "
                           f"{r['train_s']['mean']:.0f} | {r['s_per_epoch']:.1f} | {r['cpu_s']['mean']:.0f} |")
        lines.append("")
        for case, r in s["cases"].items():
            lines.append(f"- {case}, mean mAP50 by epoch: {curve_text(r['mean_curve'])}")
        for name, g in s["goals"].items():
            lines.append(f"- {name}: **{'PASS' if g['ok'] else 'FAIL'}** -- {g['text']}")
        lines.append("")
    return "\n".join(lines)


# ============================================================================ running
def _cases(text: str) -> list[str]:
    cases = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad or not cases or len(set(cases)) != len(cases):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct cases from {','.join(CASES)}, comma-separated")
    return [c for c in CASES if c in cases]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ultra-python", required=True, help="python of a venv with ultralytics and torch (its `yolo` "
                                                         "beside it)")
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="model yamls, both sides")
    ap.add_argument("--seeds", type=tta._seeds, default=[0, 1, 2], help="training seeds: 0,1,2")
    ap.add_argument("--cases", type=_cases, default=list(CASES), help="ultralytics,ppmulti/1,ppmulti/2")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--imgsz", type=int, default=160)
    ap.add_argument("--batch", type=int, default=16, help="global batch, both sides")
    ap.add_argument("--workers", type=int, default=2, help="loader workers per process, both sides")
    ap.add_argument("--ppmulti-keys", nargs="*", default=[],
                    help="keys of ppmulti's own added to its lines, e.g. sync_bn=True (docs/from-ultralytics.md)")
    ap.add_argument("--work", default="/tmp/ultra_train", help="data, every run's directory and logs")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="the json (the .md is written beside it)")
    ap.add_argument("--fresh", action="store_true", help="forget the json's records and train every case again")
    return ap.parse_args(argv)


def train_keys(a: argparse.Namespace, model: str, seed: int, data: Path) -> list[str]:
    return [f"model={model}", f"data={data}", f"imgsz={a.imgsz}", f"batch={a.batch}", f"epochs={a.epochs}",
            f"workers={a.workers}", "device=cpu", f"seed={seed}", "deterministic=True", "pretrained=False",
            "amp=False", "plots=False"]


def run_case(a: argparse.Namespace, work: Path, data: Path, seed: int, model: str, case: str) -> dict:
    """Train one case (its directory made anew), then score its last weights with the evaluator."""
    name = Path(model).stem
    slug = f"{case.replace('/', '')}_seed{seed}"
    project, logs = work / "runs" / name, work / "logs" / name
    run_dir = project / slug
    shutil.rmtree(run_dir, ignore_errors=True)   # ultralytics appends to an existing results.csv
    logs.mkdir(parents=True, exist_ok=True)
    keys = [*train_keys(a, model, seed, data), f"project={project}", f"name={slug}", "exist_ok=True"]
    if case == "ultralytics":
        cmd = [str(Path(a.ultra_python).parent / "yolo"), "detect", "train", *keys]
        env = {**vs._run_env(), **vs.OFFLINE_ENV, "YOLO_CONFIG_DIR": str(work / "ultra_config")}
        threads, weights = None, run_dir / "weights" / "last.pt"
    else:
        nproc = int(case.split("/")[1])
        cmd = [str(Path(sys.executable).parent / "ppmulti"), "yolo", "detect", "train", *keys]
        cmd += ([f"nproc={nproc}"] if nproc > 1 else []) + list(a.ppmulti_keys)
        threads, env = vs.ppmulti_threads(nproc, auto=True, spare=ULTRALYTICS_SPARE_CORES)   # the yolo line's rule
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        weights = run_dir / "weights" / "last.pdparams"
    load = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    cpu, t = _children_cpu(), time.perf_counter()
    vs._run(cmd, logs / f"{slug}.log", env=env, cwd=work)
    wall, cpu = round(time.perf_counter() - t, 2), round(_children_cpu() - cpu, 2)
    if not weights.is_file():
        raise SystemExit(f"{case} {name} seed {seed}: no {weights} after training; see {logs / f'{slug}.log'}")
    final = ultra_parity.pp_val(
        [str(Path(sys.executable).parent / "ppmulti"), "yolo", "val", f"model={weights}", f"data={data}",
         f"imgsz={a.imgsz}", f"batch={a.batch}", f"project={work / 'val' / name}", f"name={slug}", "exist_ok=True"],
        logs / f"{slug}_val.log")
    return {"model": name, "case": case, "seed": seed, "started": started, "load_before": round(load, 2),
            "wall_s": wall, "cpu_s": cpu, "threads": threads, "run_dir": f"WORK/{run_dir.relative_to(work)}",
            "weights": f"WORK/{weights.relative_to(work)}", "command": _portable(cmd, a.ultra_python, work),
            "final": final, "epochs": read_epochs(run_dir / "results.csv"),
            "settings": {k: getattr(a, k) for k in SETTINGS}}


def _portable(cmd: list[str], ultra_python: str, work: Path) -> str:
    """The command as the results show it: this machine's venv paths as ULTRA_VENV, a bare ``ppmulti``, and the
    bench's work directory as WORK."""
    text = " ".join(cmd).replace(str(Path(ultra_python).parent.parent), "ULTRA_VENV")
    return text.replace(str(Path(sys.executable).parent / "ppmulti"), "ppmulti").replace(str(work), "WORK")


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children and theirs: a case's CPU time, which a
    loaded machine changes less than its wall time."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() else ""
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform()}


def _versions(ultra_python: str) -> dict:
    out = subprocess.run([ultra_python, "-c", VERSIONS], capture_output=True, text=True)
    if out.returncode or "VERSIONS " not in out.stdout:
        raise SystemExit(f"--ultra-python {ultra_python}: cannot import ultralytics and torch there "
                         f"({(out.stderr.strip().splitlines() or ['no output'])[-1]}); give a venv's python that has "
                         "them (pip install ultralytics torch)")
    ultra = json.loads(out.stdout.rsplit("VERSIONS ", 1)[1].splitlines()[0])
    from importlib.metadata import version

    return {"ultralytics": ultra["ultralytics"], "torch": ultra["torch"], "ultralytics' Python": ultra["python"],
            "ppmulti": version("ppmulti"), "paddlepaddle": version("paddlepaddle"), "paddledet": version("paddledet"),
            "pycocotools": version("pycocotools"), "ppmulti's Python": platform.python_version()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    from ppmulti.common.atomic import atomic_write_text
    from ppmulti.common.synthdata import exists, generate

    out = Path(a.out)
    versions = _versions(a.ultra_python)
    result = json.loads(out.read_text()) if out.is_file() and not a.fresh else {}
    runs: dict[str, dict] = result.get("runs", {})
    stale = stale_runs(runs, {s: getattr(a, s) for s in SETTINGS})
    if stale:
        raise SystemExit(f"{out} holds runs with other settings ({stale[0]}: "
                         + ", ".join(f"{s} {runs[stale[0]].get('settings', {}).get(s)}" for s in SETTINGS)
                         + "); give --fresh to start over, or another --out")
    work = Path(a.work).resolve()
    data_dir = work / "demo"
    if not exists(data_dir, fmt="yolo"):
        generate(data_dir, fmt="yolo")
    data = data_dir / "data.yaml"
    # a resumed bench keeps its first start's facts; the commit shown is the runs' own
    machine = result.get("machine") or {**_machine(), "load_before": round(os.getloadavg()[0], 2)}
    head = ab.commit()
    result.update({"what": "final mAP50 (one evaluator) and time of ultralytics and ppmulti training the same "
                           "models from scratch with the same keys",
                   "started": result.get("started") or time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                   "commit": head, "versions": versions, "machine": machine,
                   "command": "python bench/ultra_train.py " + " ".join(
                       {"--ultra-python": "ULTRA_VENV/bin/python", "--work": "WORK"}.get(argv[i - 1], x) if i else x
                       for i, x in enumerate(argv)),
                   "conditions": {"data": "ppmulti demo set (synthdata seed 0), 256 train / 64 val, 256 px, 3 classes",
                                  "keys": " ".join(train_keys(a, "M", 0, Path("demo/data.yaml"))).replace(
                                      "seed=0", "seed=K"),
                                  "seeds": a.seeds, "models": a.models, "cases": a.cases,
                                  **{k: getattr(a, k) for k in SETTINGS}},
                   "runs": runs})

    def write() -> None:
        models = list(dict.fromkeys(r["model"] for r in runs.values()))
        result["summary"] = {m: summarize(runs, m) for m in models}
        result["commit"] = ", ".join(dict.fromkeys(r["commit"] for r in runs.values())) or result["commit"]
        loads = [r["load_before"] for r in runs.values()]
        result["machine"]["load_max"] = max(loads) if loads else None
        atomic_write_text(out, json.dumps(result, indent=1) + "\n")
        atomic_write_text(out.with_suffix(".md"), markdown(result) + "\n")

    for seed, model, case in rotation(a.seeds, a.models, a.cases):
        key = f"{Path(model).stem} {case} seed {seed}"
        if key in runs:
            print(f"{key}: done before, kept", flush=True)
            continue
        r = runs[key] = {**run_case(a, work, data, seed, model, case), "commit": head}
        result["finished"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
        print(f"{key}: final mAP50 {r['final']['mAP50']:.3f}, wall {r['wall_s']:.0f} s, training "
              f"{r['epochs'][-1]['time']:.0f} s", flush=True)
        write()
    write()
    print(out.with_suffix(".md").read_text())
    print(f"written {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
