"""Writing a run's resume state (weights/last.pdstate): paddle.save against ppmulti's save_nested, the same file.

What is measured
    The state a YOLO26n run writes after every epoch (``ppmulti.rank.engine.checkpoint.save``'s payload: the
    model's state dict, AdamW's after one step, the EMA's weights, the loop's counters and the RNG states), built
    from configs/yolo26/yolo26_n_500e_coco.yml with 3 classes on one thread, written to a file by
    ``paddle.save`` and by ``save_nested`` (what ppmulti uses) in alternated rounds; the table shows each way's
    median and spread. The two files are compared byte for byte every round (tests/test_hooks.py checks that
    paddle.load gives the same state back from both).

Run (an idle machine; about half a minute)
    python bench/checkpoint.py [--rounds 9] [--out bench/results/checkpoint.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "yolo26" / "yolo26_n_500e_coco.yml"


def yolo26n_state():
    """The nested state ppmulti writes to weights/last.pdstate for a YOLO26n run, after one AdamW step."""
    import numpy as np

    from ppmulti.rank.ppdet_bridge import register_extensions

    register_extensions()
    import paddle
    from ppdet.core.workspace import create

    from ppmulti.rank import compat
    from ppmulti.rank import config as config_mod

    paddle.set_device("cpu")
    compat.set_num_threads(1)
    cfg = config_mod.load(str(CONFIG), {"num_classes": 3, "UltraYOLO": {"verbose": False}})
    model = create(cfg.architecture)
    model.train()
    adamw = paddle.optimizer.AdamW(learning_rate=1e-3, weight_decay=5e-4, parameters=model.parameters())
    batch = {"image": paddle.rand([2, 3, 64, 64]),
             "gt_bbox": paddle.to_tensor(np.array([[[5, 5, 30, 30]]] * 2, np.float32)),
             "gt_class": paddle.zeros([2, 1, 1], "int32"), "pad_gt_mask": paddle.ones([2, 1, 1])}
    model(batch)["loss"].backward()
    adamw.step()
    ema = {k: v.clone() for k, v in model.state_dict().items()}
    return {"model": model.state_dict(), "optimizer": adamw.state_dict(), "lr": None,
            "train": {"epoch": 1, "global_step": 16}, "rng": {"python": random.getstate(),
                                                               "numpy": np.random.get_state()},
            "hooks": {"ema": {"weights": ema, "updates": 4}, "checkpoint": {"best_map": 0.0}}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "checkpoint.json"))
    a = ap.parse_args()
    import paddle

    from ppmulti.rank.engine.checkpoint import save_nested

    state = yolo26n_state()
    load = os.getloadavg()[0]
    times: dict[str, list[float]] = {"paddle.save": [], "save_nested": []}
    with tempfile.TemporaryDirectory() as tmp:
        files = {way: os.path.join(tmp, way + ".pdstate") for way in times}
        writers = {"paddle.save": paddle.save, "save_nested": save_nested}
        for _ in range(a.rounds):
            for way, write in writers.items():
                t = time.perf_counter()
                write(state, files[way])
                times[way].append(time.perf_counter() - t)
            if Path(files["paddle.save"]).read_bytes() != Path(files["save_nested"]).read_bytes():
                raise SystemExit("the two files differ")
        size = os.path.getsize(files["save_nested"])
    from importlib.metadata import version

    from ppmulti.common.atomic import atomic_write_text

    commit = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip()
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
              "command": "python bench/checkpoint.py " + " ".join(sys.argv[1:]),
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "load_before": round(load, 2), "model": "yolo26n, 3 classes", "bytes": size,
              "files_equal": True,
              "versions": {"paddlepaddle": version("paddlepaddle"), "python": platform.python_version()},
              "seconds": {way: {"median": round(statistics.median(v), 4), "min": round(min(v), 4),
                                "max": round(max(v), 4)} for way, v in times.items()}}
    result["speedup"] = round(result["seconds"]["paddle.save"]["median"] / result["seconds"]["save_nested"]["median"],
                              2)
    atomic_write_text(a.out, json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
