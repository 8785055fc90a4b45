"""One training step of YOLOv8n / YOLO11n / YOLO26n, ultralytics (torch) against ppmulti (Paddle), by phase.

What is measured
    The same synthetic batch on both sides (--batch images of --imgsz pixels, 3 boxes each, 3 classes): the
    model in training mode, its loss (ultralytics' ``DetectionModel.loss``; ppmulti's ``UltraYOLO`` with its
    ultralytics loss, after the trainer's CPU set-up: oneDNN convolutions and SiLU), backward, and an AdamW step.
    Each phase is timed separately over --steps steps after 3 warm-up steps; the table shows medians in ms.
    No data loading, no EMA, no validation: what is left when the step alone is compared. Each side runs in its
    own process with --threads intra-op threads (ultralytics' trainer sets torch to cores - 1); the sides
    alternate for --rounds rounds and each keeps its best round.

Usage (an ultralytics venv of your own; never a ppmulti dependency)
    python -m venv /path/ultra && /path/ultra/bin/pip install ultralytics torch
    python bench/ultra_step.py --ultra-python /path/ultra/bin/python [--threads 1] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODELS = ("yolov8n.yaml", "yolo11n.yaml", "yolo26n.yaml")
PHASES = ("forward_loss", "backward", "optimizer")

# both sides: a batch of random images with three boxes each, the same for every step
COMMON = r'''
import json, sys, time
import numpy as np
model_name = sys.argv[1]
imgsz, batch, threads, steps = (int(v) for v in sys.argv[2:6])
rng = np.random.default_rng(0)
images = rng.random((batch, 3, imgsz, imgsz), dtype=np.float32)
centres = rng.uniform(0.25, 0.75, (batch, 3, 2)).astype(np.float32)
sizes = rng.uniform(0.1, 0.4, (batch, 3, 2)).astype(np.float32)
classes = rng.integers(0, 3, (batch, 3)).astype(np.float32)

def timed(step):
    for _ in range(3):
        step({})
    times = {}
    for _ in range(steps):
        step(times)
    print("STEP " + json.dumps({k: sorted(v)[len(v) // 2] * 1000 for k, v in times.items()}))

def mark(times, key, t):
    now = time.perf_counter()
    times.setdefault(key, []).append(now - t)
    return now
'''

ULTRA = COMMON + r'''
import torch
torch.set_num_threads(threads)
from ultralytics.cfg import get_cfg
from ultralytics.nn.tasks import DetectionModel
model = DetectionModel(model_name, nc=3, verbose=False)
model.args = get_cfg()
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=5e-4)
b = {"img": torch.from_numpy(images), "batch_idx": torch.arange(batch).repeat_interleave(3).float(),
     "cls": torch.from_numpy(classes.reshape(-1, 1)),
     "bboxes": torch.from_numpy(np.concatenate([centres, sizes], -1).reshape(-1, 4))}

def step(times):
    t = time.perf_counter()
    loss, _ = model.loss(b)
    t = mark(times, "forward_loss", t)
    loss.sum().backward()
    t = mark(times, "backward", t)
    opt.step()
    opt.zero_grad()
    mark(times, "optimizer", t)

with torch.autograd.set_detect_anomaly(False):
    timed(step)
'''

PPMULTI = COMMON + r'''
from ppmulti.rank.ppdet_bridge import register_extensions
register_extensions()
import paddle
from ppdet.core.workspace import create
from ppmulti.rank import compat, config as config_mod
from ppmulti.rank.ops.cpu import setup_cpu_ops
paddle.set_device("cpu")
compat.set_num_threads(threads)
family = {"yolov8n.yaml": "yolov8/yolov8_n_500e_coco.yml", "yolo11n.yaml": "yolo11/yolo11_n_500e_coco.yml",
          "yolo26n.yaml": "yolo26/yolo26_n_500e_coco.yml"}[model_name]
cfg = config_mod.load(sys.argv[6] + "/configs/" + family, {"num_classes": 3, "UltraYOLO": {"verbose": False}})
model = create(cfg.architecture)
model.train()
print("CPU " + setup_cpu_ops(model))
opt = paddle.optimizer.AdamW(learning_rate=1e-3, weight_decay=5e-4, parameters=model.parameters())
xyxy = np.concatenate([centres - sizes / 2, centres + sizes / 2], -1) * imgsz
inputs = {"image": paddle.to_tensor(images), "gt_bbox": paddle.to_tensor(xyxy),
          "gt_class": paddle.to_tensor(classes.reshape(batch, 3, 1).astype("int32")),
          "pad_gt_mask": paddle.ones([batch, 3, 1], dtype="float32")}

def step(times):
    t = time.perf_counter()
    loss = model(inputs)["loss"]
    t = mark(times, "forward_loss", t)
    loss.backward()
    t = mark(times, "backward", t)
    opt.step()
    opt.clear_grad()
    mark(times, "optimizer", t)

timed(step)
'''


def run_side(cmd: list[str], env: dict) -> tuple[dict, str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    out = proc.stdout + proc.stderr
    if proc.returncode or "STEP " not in out:
        raise SystemExit(f"failed ({proc.returncode}): {cmd[0]} ...\n{out[-3000:]}")
    cpu = next((line[4:] for line in out.splitlines() if line.startswith("CPU ")), "")
    return json.loads(out.rsplit("STEP ", 1)[1].splitlines()[0]), cpu


def best(rounds: list[dict]) -> dict:
    """The round with the smallest whole step."""
    return min(rounds, key=lambda r: sum(r[p] for p in PHASES))


def markdown(result: dict) -> str:
    lines = ["# One training step, ultralytics against ppmulti, by phase\n",
             f"Measured {result['date']} at commit {result['commit']} with\n",
             f"```\n{result['command']}\n```\n",
             f"Machine: {result['machine']}; load average before the first round {result['load']:.2f}. "
             f"Versions: {result['versions']}. Batch {result['batch']} at {result['imgsz']} px, {result['threads']} "
             f"thread(s) per side, median of {result['steps']} steps, best of {result['rounds']} rounds "
             f"(ms). ppmulti's CPU kernels for the last model: {result['cpu_ops']}.\n",
             "| model | side | forward + loss | backward | optimizer | step | ppmulti / ultralytics |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for model, sides in result["models"].items():
        u = sum(sides["ultralytics"][p] for p in PHASES)
        for side in ("ultralytics", "ppmulti"):
            r = sides[side]
            total = sum(r[p] for p in PHASES)
            ratio = f"{total / u:.2f}x" if side == "ppmulti" else ""
            lines.append(f"| {model} | {side} | " + " | ".join(f"{r[p]:.0f}" for p in PHASES)
                         + f" | {total:.0f} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ultra-python", required=True, help="a python with ultralytics and torch")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--imgsz", type=int, default=160)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "ultra_step.json"))
    a = ap.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": str(a.threads)}
    load = os.getloadavg()[0]
    models: dict = {}
    cpu_ops = ""
    for model in a.models.split(","):
        args = [model, str(a.imgsz), str(a.batch), str(a.threads), str(a.steps)]
        rounds: dict = {"ultralytics": [], "ppmulti": []}
        for _ in range(a.rounds):   # alternate, so a slow moment of the machine hits both
            rounds["ultralytics"].append(run_side([a.ultra_python, "-c", ULTRA, *args], env)[0])
            side, cpu_ops = run_side([sys.executable, "-c", PPMULTI, *args, str(REPO)], env)
            rounds["ppmulti"].append(side)
        models[model] = {k: best(v) for k, v in rounds.items()}
        print(model, json.dumps(models[model]), flush=True)
    versions = subprocess.run([a.ultra_python, "-c", "import torch, ultralytics; print(f'ultralytics "
                               "{ultralytics.__version__}, torch {torch.__version__}')"],
                              capture_output=True, text=True).stdout.strip()
    import paddle  # noqa: E402  only for its version, after the timed processes

    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result = {"command": "python bench/ultra_step.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores", "load": load,
              "versions": f"{versions}, paddlepaddle {paddle.__version__}", "imgsz": a.imgsz, "batch": a.batch,
              "threads": a.threads, "steps": a.steps, "rounds": a.rounds, "cpu_ops": cpu_ops, "models": models}
    from ppmulti.common.atomic import atomic_write_text  # noqa: E402

    atomic_write_text(a.out, json.dumps(result, indent=1) + "\n")
    atomic_write_text(Path(a.out).with_suffix(".md"), markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
