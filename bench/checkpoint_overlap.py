"""An epoch's checkpoint written in the loop against written in the background while training goes on.

What is measured
    A YOLO26n training (configs/yolo26/yolo26_n_500e_coco.yml, 3 classes, --threads threads (all cores), 8
    images of 160 px a step) and the checkpoint ppmulti writes after an epoch: ``weights/last`` (.pdparams,
    .pdstate, .json), fsynced, in a directory on this disk. Each round runs both ways, alternated:
      * in the loop -- ``checkpoint.save``, then ``--steps`` training steps (what the trainer did before);
      * background  -- ``checkpoint.snapshot`` (the copy taken between two steps), the write handed to
                       ``BackgroundWriter``, the same steps, then ``wait`` (what the checkpoint hook does now).
    The difference of the medians is what an epoch's checkpoint costs the training thread less, the write's
    competition for the cores included.

Run (an idle machine; about two minutes)
    python bench/checkpoint_overlap.py [--rounds 15] [--steps 6] [--threads N]
        [--out bench/results/checkpoint_overlap.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab  # noqa: E402  (alternated rounds, the result json)
from checkpoint import yolo26n_run  # noqa: E402  (the model, optimizer and state of a YOLO26n run)

REPO = ab.REPO


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=6, help="training steps after each checkpoint")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="training threads (fewer than the cores: a core free, as the CPU of a run on a GPU is)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "checkpoint_overlap.json"))
    a = ap.parse_args()
    import numpy as np
    import paddle

    from ppmulti.rank.engine import checkpoint as ckpt

    threads = a.threads
    model, adamw, _, state = yolo26n_run(threads)
    batch = {"image": paddle.rand([8, 3, 160, 160]),
             "gt_bbox": paddle.to_tensor(np.array([[[10, 10, 60, 60], [70, 40, 150, 120]]] * 8, np.float32)),
             "gt_class": paddle.to_tensor(np.array([[[0], [2]]] * 8, np.int32)), "pad_gt_mask": paddle.ones([8, 2, 1])}
    train_state = ckpt.TrainState(epoch=1, global_step=16, world_size=1, global_batch=8)
    hooks = {"ema": state["hooks"]["ema"], "checkpoint": {"best_map": 0.0}}
    writer = ckpt.BackgroundWriter()

    def steps() -> None:
        for _ in range(a.steps):
            model(batch)["loss"].backward()
            adamw.step()
            adamw.clear_grad()

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=REPO) as tmp:   # this disk, as a run's weights/ directory
        stem = {way: Path(tmp) / way / "weights" / "last" for way in ("loop", "background")}

        def in_loop() -> None:
            ckpt.save(stem["loop"], model, model.state_dict(), adamw, None, train_state, hooks)
            steps()

        def background() -> None:
            snap = ckpt.snapshot(stem["background"], model, model.state_dict(), adamw, None, train_state, hooks)
            writer.submit(snap.write)
            steps()
            writer.wait()

        steps()   # warm: the first steps build the kernels
        times = ab.alternate({"in the loop": in_loop, "background": background}, a.rounds)
        size = sum(os.path.getsize(str(stem["background"]) + s) for s in (ckpt.WEIGHTS, ckpt.STATE))
    from importlib.metadata import version

    ab.write(a.out, "checkpoint_overlap.py", load, {"model": "yolo26n, 3 classes, 8 images of 160 px a step",
                                                    "threads": threads, "steps": a.steps, "checkpoint_bytes": size},
             {"paddlepaddle": version("paddlepaddle")}, times)


if __name__ == "__main__":
    main()
