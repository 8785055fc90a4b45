"""Every convolution of one YOLOv5s forward (or, with --model, an ultralytics model's), forward + backward, on
ppmulti's oneDNN op (float32, and its bf16 variant that --amp uses on CPUs with AVX512-BF16/AMX) and Paddle's conv2d
(and, with --torch PYTHON, torch's), each layer timed for every kernel in one process, best of --repeat.

    python bench/conv_layers.py [--model yolo11n.yaml] [--img 160] [--batch 16] [--threads 2] [--torch PYTHON]

The machine's speed can move between runs (a shared VM): compare the kernels within one run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TORCH_SCRIPT = r'''
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[2]))
out = []
for xs, ws, s, p, g, bias, n in json.loads(open(sys.argv[1]).read()):
    x = torch.randn(*xs, requires_grad=True)
    w = (torch.randn(*ws) * 0.1).requires_grad_()
    b = torch.zeros(ws[0], requires_grad=True) if bias else None
    def step():
        y = torch.nn.functional.conv2d(x, w, b, stride=s, padding=p, groups=g)
        y.backward(torch.ones_like(y))
    step()
    best = 1e9
    for _ in range(int(sys.argv[3])):
        t = time.perf_counter()
        for _ in range(4):
            step()
        best = min(best, (time.perf_counter() - t) / 4 * 1000)
    out.append(best)
print(json.dumps(out))
'''


def _layer_shapes(img: int, batch: int, model_name: str | None) -> list[tuple]:
    """(input shape, weight shape, stride, padding, groups, bias, count) of every Conv2D in one forward of
    YOLOv5s or the ultralytics model named."""
    import paddle
    from ppdet.core.workspace import create

    from ppmulti.rank import compat
    from ppmulti.rank import config as config_mod

    if model_name:
        from ppmulti.rank.models.ultra_model import UltraDetectionModel

        model = UltraDetectionModel(model_name)
    else:
        cfg = config_mod.load(REPO / "configs" / "yolov5" / "yolov5_s_300e_coco.yml")
        model = create(cfg.architecture)
    model.train()
    seen: collections.Counter = collections.Counter()
    plain = paddle.nn.Conv2D.forward

    def record(layer, x):
        facts = compat.conv2d_facts(layer)
        seen[(tuple(x.shape), tuple(layer.weight.shape), facts.stride[0], facts.padding[0], facts.groups,
              layer.bias is not None)] += 1
        return plain(layer, x)

    paddle.nn.Conv2D.forward = record
    try:
        image = paddle.randn([batch, 3, img, img])
        if model_name:
            model(image)
        else:
            model.neck(model.backbone({"image": image}))
    finally:
        paddle.nn.Conv2D.forward = plain
    return [(list(xs), list(ws), s, p, g, b, n) for (xs, ws, s, p, g, b), n in seen.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="an ultralytics model yaml (yolo11n.yaml...) instead of YOLOv5s")
    ap.add_argument("--img", type=int, default=160)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="timed rounds of 4 steps per layer and kernel; best kept")
    ap.add_argument("--torch", help="a python with torch (e.g. bench/.venv-yolov5/bin/python) to time torch too")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "conv_layers.json"))
    args = ap.parse_args()
    from ppmulti.rank.ppdet_bridge import register_extensions

    register_extensions()
    import paddle

    from ppmulti.rank import compat
    from ppmulti.common.atomic import atomic_write_text
    from ppmulti.rank.ops import conv as ops_conv

    paddle.set_device("cpu")
    compat.set_num_threads(args.threads)
    op = ops_conv.load_op()
    bf16 = ops_conv.load_bf16_op()
    shapes = _layer_shapes(args.img, args.batch, args.model)
    rows = []
    for xs, ws, s, p, g, bias, n in shapes:
        x = paddle.randn(xs)
        x.stop_gradient = False
        w = paddle.randn(ws) * 0.1
        w.stop_gradient = False
        b = None
        if bias:
            b = paddle.zeros([ws[0]])
            b.stop_gradient = False

        def paddle_conv(x=x, w=w, b=b, s=s, p=p, g=g):
            return paddle.nn.functional.conv2d(x, w, b, stride=s, padding=p, groups=g)

        kernels = {"onednn": lambda: op(x, w, [s, s], [p, p], g, b),
                   "onednn_bf16": lambda: bf16(x, w, [s, s], [p, p], g, b),
                   "paddle": paddle_conv}
        best = {}
        for _ in range(args.repeat):
            for name, f in kernels.items():   # alternate, so a slow moment hits both
                y = f()
                y.backward(paddle.ones_like(y))
                t = time.perf_counter()
                for _ in range(4):
                    y = f()
                    y.backward(paddle.ones_like(y))
                best[name] = min(best.get(name, 1e9), (time.perf_counter() - t) / 4 * 1000)
        rows.append({"input": xs, "weight": ws, "stride": s, "padding": p, "groups": g, "bias": bias, "count": n,
                     **{f"{k}_ms": round(v, 3) for k, v in best.items()}})
    if args.torch:
        spec = Path(args.out).with_suffix(".shapes.json")
        spec.write_text(json.dumps(shapes))
        proc = subprocess.run([args.torch, "-c", TORCH_SCRIPT, str(spec), str(args.threads), str(args.repeat)],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""}, check=True)
        spec.unlink()
        for row, ms in zip(rows, json.loads(proc.stdout.strip().splitlines()[-1])):
            row["torch_ms"] = round(ms, 3)
    kernels = ["onednn", "onednn_bf16", "paddle"] + (["torch"] if args.torch else [])
    totals = {k: sum(r[f"{k}_ms"] * r["count"] for r in rows) for k in kernels}
    print("| input | weight | stride | groups | bias | count | " + " | ".join(f"{k} ms" for k in kernels) + " |")
    print("| --- | --- | --- | --- | --- | --- | " + " | ".join("---" for _ in kernels) + " |")
    for r in sorted(rows, key=lambda r: -r["onednn_ms"] * r["count"]):
        print(f"| {r['input']} | {r['weight']} | {r['stride']} | {r['groups']} | {r['bias']} | {r['count']} | "
              + " | ".join(f"{r[f'{k}_ms']:.2f}" for k in kernels) + " |")
    print(f"\nsum over {sum(r['count'] for r in rows)} convolutions (ms, forward + backward): "
          + ", ".join(f"{k} {v:.0f}" for k, v in totals.items())
          + f"; Paddle / oneDNN {totals['paddle'] / totals['onednn']:.2f}x"
          + f"; oneDNN float32 / bf16 {totals['onednn'] / totals['onednn_bf16']:.2f}x"
          + (f"; oneDNN / torch {totals['onednn'] / totals['torch']:.2f}x" if args.torch else ""))
    atomic_write_text(args.out, json.dumps({"model": args.model or "yolov5s", "img": args.img, "batch": args.batch,
                                            "threads": args.threads,
                                            "totals_ms": totals, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
