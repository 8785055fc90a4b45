"""``ppmulti bench``'s measuring run: starts each probe as its own process (or launch), side by side, and
collects their JSON. Run management, like ``ppmulti.procs.runs``: the probes themselves never start processes."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ppmulti.common.cpus import usable_cores
from ppmulti.common.errors import UserError
from ppmulti.common.paths import BENCH_PROBE, ROOT
from ppmulti.procs import supervisor

PROBE = BENCH_PROBE
_PORT_RACE = "Connection refused"
REPO = ROOT


@dataclass(frozen=True)
class BenchPlan:
    """What one ``ppmulti bench`` run measures."""

    models: tuple[str, ...] = ("ppyoloe_s", "yolov5s")
    ranks: tuple[int, ...] = (1, 2)
    img: int = 160
    batch: int = 16                 # global batch, the same for 1 and 2 ranks (strong scaling), as the demo
    steps: int = 12
    warmup: int = 2
    workers: int = 1
    repeat: int = 1                 # each case this many times, interleaved; medians reported
    train_images: int = 64
    out: Path = Path("runs/bench/exp")   # the report's directory; `ppmulti bench` picks a fresh runs/bench/expN
    data: Path | None = None
    timeout: float = 900.0
    env: dict = field(default_factory=dict)   # extra environment for every probe (A/B variants)
    one_size: bool = True           # --cfg models train at `img` only: equal work per step, comparable runs
    heartbeat_ab: bool = False      # the first model on the most ranks again without progress reports


@dataclass
class Case:
    kind: str                       # train / ppdet / loader / allreduce
    model: str
    ranks: int
    records: list[dict] = field(default_factory=list)   # one per rank
    started_at: float = 0.0
    wall_s: float = 0.0

    @property
    def rank0(self) -> dict:
        return min(self.records, key=lambda r: r.get("rank", 0))


def quick_plan(out: Path = BenchPlan.out, data: Path | None = None) -> BenchPlan:
    """Small enough for a CI test (about a minute on 2 cores): 64 px, batch 4, 5 steps."""
    return BenchPlan(img=64, batch=4, steps=5, warmup=1, train_images=32, out=out, data=data, timeout=300)


def train_argv(plan: BenchPlan, model: str, data: Path, run_dir: Path, extra_overrides: list[str] = ()) -> list[str]:
    """tools/train.py's command line for one model on the demo data, never evaluating or saving mid-run."""
    config = str(REPO / "configs/demo/ppyoloe_demo.yml") if model == "demo" else model
    if config.endswith((".yml", ".yaml")):   # a ppdet config over the demo COCO layout, at its own sizes
        model_flag = ["-c", config]
        data_flag = ["-o", *[f"{s}.dataset_dir={data}" for s in ("TrainDataset", "EvalDataset", "TestDataset")]]
    else:                                    # a --cfg model name on the YOLO layout at --img
        model_flag = ["--cfg", model]
        data_flag = ["--data", str(data / "data.yaml"), "--img", str(plan.img)]
    return [*model_flag, *data_flag, "--weights", "", "--batch", str(plan.batch), "--workers", str(plan.workers),
            "--epochs", "1000", "--noval", "--nosave", "--output", str(run_dir), "--exist-ok",
            "-o", "use_gpu=false", "snapshot_epoch=100000", "use_vdl=false", *MODEL_OVERRIDES.get(model, []),
            *extra_overrides]


# ATSS's warm-start assigner takes 9 anchors per level; at demo sizes the stride-32 level has fewer
# (64 px -> 2x2), so PP-YOLOE trains with task-aligned assignment from the first step, as the demo does.
MODEL_OVERRIDES = {m: ["PPYOLOEHead.static_assigner_epoch=0"] for m in ("ppyoloe_s", "ppyoloe_m", "ppyoloe_l")}


def _env(plan: BenchPlan) -> dict:
    from ppmulti.common.envvars import PYTHONUNBUFFERED, clean_launcher_env

    env = clean_launcher_env(dict(os.environ))
    env.update({k: str(v) for k, v in plan.env.items()})
    env.setdefault(PYTHONUNBUFFERED, "1")
    return env


def run_case(plan: BenchPlan, kind: str, model: str, ranks: int, data: Path, work: Path,
             numel: float = 0, extra_overrides: list[str] = (), env: dict | None = None,
             label: str | None = None) -> Case:
    """Start one probe (``ranks`` > 1: through ``ppmulti launch``) and read its records; ``label`` names the
    case when it differs from the probe ``kind`` (the same probe under another ``env``)."""
    tag = f"{label or kind}_{Path(model).stem}_{ranks}r_{time.monotonic_ns()}"
    out = work / tag
    probe = [str(PROBE), kind, "--out", str(out), "--steps", str(plan.steps), "--warmup", str(plan.warmup)]
    if kind == "allreduce":
        probe += ["--numel", str(int(numel)), "--steps", "10"]
    else:
        if plan.one_size and not str(model).endswith((".yml", ".yaml")) and model != "demo":
            probe += ["--one-size", str(plan.img)]
        probe += ["--", *train_argv(plan, model, data, work / f"run_{tag}", extra_overrides)]
    if ranks == 1:
        cmd = [sys.executable, *probe]
    else:
        cmd = [sys.executable, "-m", "ppmulti.procs.launch.command", "--nproc_per_node", str(ranks),
               "--log_dir", str(work / f"log_{tag}"), *probe]
    log = work / f"{tag}.log"
    for attempt in range(2):
        case = Case(label or kind, model, ranks, started_at=time.time())
        with open(log, "wb") as f:
            # in the work directory: whatever a probe or ppdet writes relative to it stays out of the user's tree
            proc = supervisor.start(cmd, stdout=f, stderr=supervisor.STDOUT, cwd=work,
                                    env={**_env(plan), **(env or {})})
            if proc.wait(plan.timeout) is None:
                # SIGTERM to the case's group reaches ppmulti launch, which stops Paddle's launcher and ranks
                proc.stop()
                raise RuntimeError(f"bench case {kind} {model} x{ranks} took over {plan.timeout:.0f} s; log {log}")
        case.wall_s = time.time() - case.started_at
        # gloo picks its ports at random: on a crowded machine two ranks sometimes miss each other at
        # start-up (connect ... refused). That is the launch, not the figure being measured: once more.
        text = log.read_text(errors="replace") if proc.returncode else ""
        if not (ranks > 1 and attempt == 0 and _PORT_RACE in text):
            break
    files = sorted(out.glob("rank*.json"))
    if proc.returncode != 0 or len(files) != ranks:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        raise RuntimeError(f"bench case {kind} {model} x{ranks} failed (exit {proc.returncode}, "
                           f"{len(files)}/{ranks} records); log {log}:\n" + "\n".join(tail))
    case.records = [json.loads(p.read_text()) for p in files]
    return case


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def measure(plan: BenchPlan, progress=print) -> dict:
    """Every case of the plan, interleaved over ``repeat`` rounds; returns the summary the report prints."""
    from ppmulti.common.synthdata import exists, generate

    if plan.repeat < 1 or plan.steps < plan.warmup + 2:
        raise UserError(f"--repeat {plan.repeat} / --steps {plan.steps}: need repeat >= 1 and steps >= warmup + 2")
    work = Path(tempfile.mkdtemp(prefix="ppmulti_bench_"))
    data = plan.data
    if data is None:
        data = work / "data"
    if not exists(data):
        generate(data, fmt="both", n_train=plan.train_images, n_val=4, size=max(plan.img, 64), seed=0)
    cases: list[Case] = []
    load_start = os.getloadavg()[0]
    try:
        first = plan.models[0]
        for round_ in range(plan.repeat):
            tag = f"[bench] round {round_ + 1}/{plan.repeat}:"
            flip = round_ % 2 == 1
            for model in plan.models:
                order = list(plan.ranks)[::-1] if flip else list(plan.ranks)
                for ranks in order:
                    # ppdet's Trainer and the loader alone run right beside ppmulti's one-rank case (on a
                    # shared machine, neighbours in time see the most similar load), in turns first and second
                    if model == first and ranks == 1 and flip:
                        progress(f"{tag} {first} under ppdet's own Trainer")
                        cases.append(run_case(plan, "ppdet", first, 1, data, work))
                    progress(f"{tag} {model} training, {ranks} rank(s)")
                    cases.append(run_case(plan, "train", model, ranks, data, work))
                    if model == first and ranks == 1:
                        if not flip:
                            progress(f"{tag} {first} under ppdet's own Trainer")
                            cases.append(run_case(plan, "ppdet", first, 1, data, work))
                        progress(f"{tag} {first} data loader alone")
                        cases.append(run_case(plan, "loader", first, 1, data, work))
            if plan.heartbeat_ab:
                from ppmulti.common.envvars import PPMULTI_HEARTBEAT

                progress(f"{tag} {first} training, {max(plan.ranks)} rank(s), without progress reports")
                cases.append(run_case(plan, "train", first, max(plan.ranks), data, work,
                                      env={PPMULTI_HEARTBEAT: "0"}, label="train_nohb"))
            if max(plan.ranks) > 1:
                params = next(c.rank0["params"] for c in cases if c.kind == "train" and c.model == first)
                progress(f"{tag} all-reduce of {params} float32 gradients")
                cases.append(run_case(plan, "allreduce", first, max(plan.ranks), data, work, numel=params))
    finally:
        from ppmulti.common.envvars import PPMULTI_BENCH_KEEP

        if not os.environ.get(PPMULTI_BENCH_KEEP):
            shutil.rmtree(work, ignore_errors=True)
    result = summarise(plan, cases)
    result["machine"]["load_start"] = load_start
    return result


def _heartbeat_cost(plan: BenchPlan, pick) -> dict | None:
    """The watchdog's progress reports: the same case with and without them, and their own measured cost."""
    first, n = plan.models[0], max(plan.ranks)
    without = pick("train_nohb", first, n)
    if not without:
        return None
    with_ = pick("train", first, n)
    on, off = _median([c.rank0["step_s"] for c in with_]), _median([c.rank0["step_s"] for c in without])
    beat_us = _median([c.rank0.get("beat_us", 0.0) for c in with_])
    per_step = _median([c.rank0.get("beats_per_step", 0.0) for c in with_])
    return {"model": first, "ranks": n, "step_s_with": on, "step_s_without": off,
            "overhead": on / off - 1.0 if off else 0.0, "beat_us": beat_us, "beats_per_step": per_step,
            "beat_share_of_step": beat_us * 1e-6 * per_step / on if on else 0.0}


def summarise(plan: BenchPlan, cases: list[Case]) -> dict:
    """Medians over the rounds of each measured figure."""
    def pick(kind, model=None, ranks=None):
        return [c for c in cases if c.kind == kind and (model is None or c.model == model)
                and (ranks is None or c.ranks == ranks)]

    rows = []
    for model in plan.models:
        for ranks in plan.ranks:
            got = pick("train", model, ranks)
            rows.append({
                "model": model, "ranks": ranks,
                "img_s": _median([c.rank0["img_s"] for c in got]),
                "step_s": _median([c.rank0["step_s"] for c in got]),
                "launch_to_first_step_s": _median([c.rank0["first_step_at"] - c.started_at for c in got]),
                "peak_rss_mb": [round(_median([r["maxrss_mb"] for c in got for r in c.records if r["rank"] == k]), 1)
                                for k in range(ranks)],
                "cpu_util": _median([c.rank0["cpu_util"] for c in got]),
                "data_wait_s": _median([c.rank0["data_s"] for c in got]),
                "cpu_s_per_img": _median([c.rank0.get("cpu_s_per_img", 0.0) for c in got]),
                "threads": got[0].rank0.get("threads") if got else None,
                "params": got[0].rank0.get("params") if got else None,
            })
    first = plan.models[0]
    one = next((r for r in rows if r["model"] == first and r["ranks"] == 1), None)
    ppdet = _median([c.rank0["img_s"] for c in pick("ppdet")])
    loader = _median([c.rank0["img_s"] for c in pick("loader")])
    allreduce = pick("allreduce")
    result = {"plan": {k: (str(v) if isinstance(v, Path) else v) for k, v in plan.__dict__.items()},
              "machine": {"cores": usable_cores(), "load_1min": os.getloadavg()[0]},
              "rows": rows,
              "ppdet": {"model": first, "ppdet_img_s": ppdet, "ppmulti_img_s": one["img_s"] if one else 0.0,
                        "ratio": (one["img_s"] / ppdet) if one and ppdet else 0.0,
                        # both sides' convolution kernel: the ratio compares loops only when they agree
                        "conv_kernels": sorted({str(c.rank0.get("conv_kernel")) for c in pick("ppdet")}
                                               | {str(c.rank0.get("conv_kernel")) for c in pick("train", first, 1)})},
              "loader": {"model": first, "loader_img_s": loader, "model_img_s": one["img_s"] if one else 0.0,
                         "ratio": (loader / one["img_s"]) if one and one["img_s"] else 0.0,
                         "worker_num": plan.workers,
                         "cpu_s_per_img": _median([c.rank0.get("cpu_s_per_img", 0.0) for c in pick("loader")])}}
    cores = result["machine"]["cores"]
    train_cpu = one["cpu_s_per_img"] if one else 0.0
    load_cpu = result["loader"]["cpu_s_per_img"]
    if train_cpu > 0 and one and one.get("threads") == 1:
        # one rank computes on one core while its loader worker uses another; N ranks on N cores must fit
        # compute and loading of every image into those cores: at most N / (1 + load/compute) x one rank
        n = min(cores, max(plan.ranks))
        result["bound"] = {"ranks": n, "speedup": n / (1.0 + load_cpu / train_cpu), "train_cpu_s_per_img": train_cpu,
                           "load_over_compute": load_cpu / train_cpu}
    for model in plan.models:
        r1 = next((r for r in rows if r["model"] == model and r["ranks"] == 1), None)
        rn = [r for r in rows if r["model"] == model and r["ranks"] > 1]
        for r in rn:
            r["speedup"] = r["img_s"] / r1["img_s"] if r1 and r1["img_s"] else 0.0
    heartbeat = _heartbeat_cost(plan, pick)
    if heartbeat:
        result["heartbeat"] = heartbeat
    if allreduce:
        two = next((r for r in rows if r["model"] == first and r["ranks"] == max(plan.ranks)), None)
        med = _median([c.rank0["median_s"] for c in allreduce])
        result["allreduce"] = {"model": first, "ranks": max(plan.ranks), "bytes": allreduce[0].rank0["bytes"],
                               "seconds": med, "share_of_step": med / two["step_s"] if two and two["step_s"] else 0.0,
                               "effective_GB_s": (2 * (max(plan.ranks) - 1) / max(plan.ranks)
                                                  * allreduce[0].rank0["bytes"] / med / 1e9) if med else 0.0}
    return result
