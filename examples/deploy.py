"""Run an exported detector on one image, in Paddle Inference or onnxruntime, and print its boxes.

    python examples/deploy.py output_inference/ppyoloe_demo dataset/demo/images/val/000000.jpg
    python examples/deploy.py output_inference/ppyoloe_demo dataset/demo/images/val/000000.jpg --onnx

MODEL_DIR is what `tools/export.py -c CONFIG --weights W --output_dir DIR` writes (model.json or model.pdmodel,
model.pdiparams, infer_cfg.yml), with model.onnx beside them after `--format onnx`. The preprocessing is read from
infer_cfg.yml; both runtimes take the same inputs and return rows of class, score, x1, y1, x2, y2 (NMS included).
Needs numpy, opencv-python and PyYAML, then paddlepaddle or onnxruntime: not ppmulti or ppdet.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import cv2
import numpy as np
import yaml


def preprocess(image_path: str, infer_cfg: dict) -> dict[str, np.ndarray]:
    """The model's inputs for one image: the steps infer_cfg.yml lists (Resize, NormalizeImage, Permute)."""
    bgr = cv2.imread(image_path)
    if bgr is None:
        raise SystemExit(f"error: {image_path}: not a readable image")
    img = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB).astype(np.float32)
    h0, w0 = img.shape[:2]
    for op in infer_cfg["Preprocess"]:
        kind = op["type"]
        if kind == "Resize":
            th, tw = op["target_size"]
            if op.get("keep_ratio"):
                scale = min(min(th, tw) / min(h0, w0), max(th, tw) / max(h0, w0))
                th, tw = round(h0 * scale), round(w0 * scale)
            img = cv2.resize(img, (tw, th), interpolation=int(op.get("interp", 1)))
        elif kind == "NormalizeImage":
            if op.get("is_scale", True):
                img = img / 255.0
            if op.get("norm_type", "mean_std") == "mean_std":
                img = (img - np.array(op["mean"], np.float32)) / np.array(op["std"], np.float32)
        elif kind == "Permute":
            img = img.transpose(2, 0, 1)
        else:
            raise SystemExit(f"error: infer_cfg.yml asks for {kind}, which this example does not implement")
    h, w = img.shape[1:] if img.shape[0] == 3 else img.shape[:2]
    return {"image": img[None].astype(np.float32), "im_shape": np.array([[h, w]], np.float32),
            "scale_factor": np.array([[h / h0, w / w0]], np.float32)}


def run_paddle(model_dir: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import paddle
    import paddle.inference as inference

    program = model_dir / "model.json"   # Paddle 3's PIR program; Paddle 2.6 writes model.pdmodel
    if not program.is_file():
        program = model_dir / "model.pdmodel"
    config = inference.Config(str(program), str(model_dir / "model.pdiparams"))
    config.disable_gpu()            # config.enable_use_gpu(256, 0) on a GPU
    if int(paddle.__version__.split(".")[0]) >= 3:
        config.disable_mkldnn()     # Paddle 3.3's oneDNN executor cannot run the necks' nearest-neighbour upsampling
    predictor = inference.create_predictor(config)
    for name in predictor.get_input_names():
        predictor.get_input_handle(name).copy_from_cpu(feeds[name])
    predictor.run()
    return predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()


def run_onnx(model_dir: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", type=Path, help="the directory tools/export.py wrote")
    parser.add_argument("image", help="an image file")
    parser.add_argument("--onnx", action="store_true", help="run model.onnx in onnxruntime (default: Paddle Inference)")
    parser.add_argument("--threshold", type=float, default=0.5, help="lowest score printed (default 0.5)")
    args = parser.parse_args()
    infer_cfg = yaml.safe_load((args.model_dir / "infer_cfg.yml").read_text())
    names = infer_cfg.get("label_list") or []
    feeds = preprocess(args.image, infer_cfg)
    rows = (run_onnx if args.onnx else run_paddle)(args.model_dir, feeds)
    for cls, score, x1, y1, x2, y2 in rows.reshape(-1, 6):
        if score >= args.threshold:
            name = names[int(cls)] if 0 <= int(cls) < len(names) else str(int(cls))
            print(f"{name} {score:.3f} {x1:.1f} {y1:.1f} {x2:.1f} {y2:.1f}")


if __name__ == "__main__":
    main()
