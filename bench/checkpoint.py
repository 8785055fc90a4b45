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
import os
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab  # noqa: E402  (alternated rounds, the result json)

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "yolo26" / "yolo26_n_500e_coco.yml"


def yolo26n_state():
    """The nested state ppmulti writes to weights/last.pdstate for a YOLO26n run, after one AdamW step."""
    return yolo26n_run()[3]


def yolo26n_run(threads: int = 1):
    """A YOLO26n training on ``threads`` threads after one AdamW step: (model, optimizer, a batch, the state ppmulti
    writes to weights/last.pdstate)."""
    import numpy as np

    from ppmulti.rank.ppdet_bridge import register_extensions

    register_extensions()
    import paddle
    from ppdet.core.workspace import create

    from ppmulti.rank import compat
    from ppmulti.rank import config as config_mod

    paddle.set_device("cpu")
    compat.set_num_threads(threads)
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
    return model, adamw, batch, {
        "model": model.state_dict(), "optimizer": adamw.state_dict(), "lr": None,
        "train": {"epoch": 1, "global_step": 16}, "rng": {"python": random.getstate(), "numpy": np.random.get_state()},
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
    with tempfile.TemporaryDirectory() as tmp:
        files = {way: os.path.join(tmp, way + ".pdstate") for way in ("paddle.save", "save_nested")}

        def same_bytes(_: dict) -> None:
            if Path(files["paddle.save"]).read_bytes() != Path(files["save_nested"]).read_bytes():
                raise SystemExit("the two files differ")

        times = ab.alternate({"paddle.save": lambda: paddle.save(state, files["paddle.save"]),
                              "save_nested": lambda: save_nested(state, files["save_nested"])}, a.rounds, same_bytes)
        size = os.path.getsize(files["save_nested"])
    from importlib.metadata import version

    ab.write(a.out, "checkpoint.py", load, {"model": "yolo26n, 3 classes", "bytes": size, "files_equal": True},
             {"paddlepaddle": version("paddlepaddle")}, times)


if __name__ == "__main__":
    main()
