"""Validation's forward pass of YOLOv8n, YOLO11n and YOLO26n on a CPU: conv, BatchNorm and SiLU as separate oneDNN
and Paddle ops against one oneDNN convolution with the BatchNorm folded in and SiLU as its post-op.

What is measured
    Each model as ``ppmulti yolo`` validates it on a CPU (the trainer's oneDNN ops, eval mode, no gradient), built
    from its ultralytics yaml with 3 classes and BatchNorm statistics drawn at random (a trained model's are not
    0 and 1), one forward pass of a batch of 32 images at 160 px (the bench/ultra_train.py runs' validation
    batch) on one thread, as a one-process run on 2 cores validates. The two ways alternate round by round on the
    same model and input (the fold switched off by ``ppmulti.rank.ops.silu._folds``); every round the head's
    decoded boxes and class scores for every anchor (before YOLO26's top-k, whose order near-equal scores may swap)
    are compared: at most 1e-4 of the largest value apart, or the bench stops. The json has each way's median,
    min and max seconds and, per model, the separate ops' median over the folded one's.

Run (an idle machine; about a minute)
    python bench/eval_fold.py [--rounds 11] [--out bench/results/eval_fold.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab  # noqa: E402  (alternated rounds, the result json)

REPO = Path(__file__).resolve().parents[1]
MODELS = ("yolov8n", "yolo11n", "yolo26n")
BATCH, SIZE = 32, 160


def build(name: str):
    """``name`` in eval mode with the trainer's CPU ops, BatchNorm statistics drawn from a fixed seed."""
    import numpy as np
    import paddle

    import ppmulti.rank.models  # noqa: F401  (registers the models)
    from ppmulti.rank.models.ultra_model import UltraDetectionModel
    from ppmulti.rank.ops.cpu import setup_cpu_ops

    paddle.seed(0)
    model = UltraDetectionModel(f"{name}.yaml", nc=3)
    rng = np.random.default_rng(0)
    for layer in model.sublayers():
        if isinstance(layer, paddle.nn.BatchNorm2D):
            c = layer._mean.shape[0]
            layer._mean.set_value(rng.normal(0, 0.5, c).astype("float32"))
            layer._variance.set_value(rng.uniform(0.2, 2.0, c).astype("float32"))
    setup_cpu_ops(model)
    model.eval()
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "eval_fold.json"))
    a = ap.parse_args()
    import numpy as np
    import paddle

    from ppmulti.rank import compat
    from ppmulti.rank.ops import silu

    paddle.set_device("cpu")
    compat.set_num_threads(1)
    folds = silu._folds
    x = paddle.to_tensor(np.random.default_rng(1).standard_normal((BATCH, 3, SIZE, SIZE)).astype("float32"))
    ways, outputs = {}, {}
    for name in MODELS:
        model = build(name)
        head = _detect_head(model)
        decode = head.inference
        for kind, rule in (("separate", lambda layer, inp: False), ("folded", folds)):
            def run(model=model, rule=rule, key=(name, kind), head=head, decode=decode):
                silu._folds = rule
                head.inference = lambda branch, key=key: _kept(outputs, key, decode(branch))
                with paddle.no_grad():
                    model(x)
            run()   # each way's oneDNN primitives are made once, before the rounds
            ways[f"{name} {kind}"] = run

    def same(_: dict) -> None:
        for name in MODELS:
            a_, b_ = outputs[(name, "separate")], outputs[(name, "folded")]
            if np.abs(a_ - b_).max() > 1e-4 * np.abs(a_).max():
                raise SystemExit(f"{name}: the folded forward's outputs differ from the separate ops'")

    load = os.getloadavg()[0]
    try:
        times = ab.alternate(ways, a.rounds, check=same)
    finally:
        silu._folds = folds
    ratios = {name: round(statistics.median(times[f"{name} separate"]) / statistics.median(times[f"{name} folded"]),
                          3) for name in MODELS}
    ab.write(a.out, "eval_fold.py", load, {"batch": BATCH, "imgsz": SIZE, "threads": 1, "rounds": a.rounds,
                                           "separate_over_folded": ratios},
             {"paddle": paddle.__version__}, times)


def _detect_head(model):
    """The model's ultralytics Detect head."""
    from ppmulti.rank.models.ultra_head import UltraDetect

    return next(layer for layer in model.sublayers() if isinstance(layer, UltraDetect))


def _kept(outputs: dict, key, decoded):
    """``decoded`` (the head's boxes and scores for every anchor), kept as numpy under ``key``."""
    outputs[key] = decoded.numpy()
    return decoded


if __name__ == "__main__":
    main()
