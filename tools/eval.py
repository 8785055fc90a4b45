"""Evaluate weights (COCO bbox mAP) as YOLOv5's val.py does: `python tools/eval.py --data data.yaml --weights W
--img 640`, or on a ppdet config with -c; shards the images across ranks when launched."""

import argparse
import json
import sys

from ppmulti.common.envvars import in_paddle_worker, set_visible_gpu
from ppmulti.common.errors import UserError, exit_on_user_error
from ppmulti.common.stack import check_stack
from ppmulti.common.train_flags import parse_device
from ppmulti.rank.tool_args import add_model_args, overrides

# YOLOv5 val.py flags without an equivalent here; each is refused by name rather than ignored.
UNSUPPORTED = {
    "--task": "speed/study benchmarks and other splits (the data yaml's val split is evaluated)",
    "--augment": "test-time augmentation",
    "--verbose": "per-class mAP",
    "--save-txt": "label txt files", "--save-hybrid": "label txt files", "--save-conf": "label txt files",
    "--project": "a runs/val directory (pass --save-json FILE for the metrics)", "--name": "a runs/val directory",
    "--exist-ok": "a runs/val directory",
    "--half": "FP16 inference", "--dnn": "OpenCV DNN for ONNX",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tools/eval.py", description=__doc__)
    add_model_args(p, config_required=False)
    p.add_argument("--save-json", help="also write the metrics to this json file")
    g = p.add_argument_group("YOLOv5 val.py flags (the model: -c, else --cfg, else the run's config.yml beside "
                             "--weights, else yolov5n/s/m/l/x inferred from the weights' shapes)")
    g.add_argument("--cfg", help="model: a name (yolov5s, ppyoloe_s), a YOLOv5 model yaml or a ppdet .yml")
    g.add_argument("--data", help="a YOLOv5 data yaml (its val split, names, nc) or a ppdet dataset .yml")
    g.add_argument("--imgsz", "--img", "--img-size", dest="imgsz", type=int,
                   help="inference size in pixels, a multiple of 32 (default: the config's; YOLOv5 configs 640)")
    g.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int,
                   help="images per batch and rank (default: the config's EvalReader batch_size)")
    g.add_argument("--conf-thres", "--conf_thres", dest="conf_thres", type=float,
                   help="confidence threshold (default: the config's; YOLOv5 configs 0.001 as val.py)")
    g.add_argument("--iou-thres", "--iou_thres", dest="iou_thres", type=float,
                   help="NMS IoU threshold (default: the config's; YOLOv5 configs 0.6 as val.py)")
    g.add_argument("--max-det", "--max_det", dest="max_det", type=int,
                   help="maximum detections per image (default: the config's; YOLOv5 configs 300 as val.py)")
    g.add_argument("--device", help="cpu or one GPU id (several GPUs: ppmulti launch --gpus 0,1 tools/eval.py ...)")
    g.add_argument("--workers", type=int, help="data loader worker processes (default: the config's worker_num)")
    g.add_argument("--single-cls", "--single_cls", dest="single_cls", action="store_true",
                   help="the data's classes as one (for weights trained with --single-cls)")
    return p


def parse(argv) -> argparse.Namespace:
    args, extra = build_parser().parse_known_args(argv)
    for item in extra:
        name = item.split("=", 1)[0]
        if name in UNSUPPORTED:
            raise UserError(f"{name} is a YOLOv5 val.py flag that ppmulti does not support "
                            f"({UNSUPPORTED[name]}); remove it")
        raise UserError(f"unknown argument {item!r}; see tools/eval.py --help")
    for flag, value, low, high in (("--conf-thres", args.conf_thres, 0.0, 1.0),
                                   ("--iou-thres", args.iou_thres, 0.0, 1.0),
                                   ("--max-det", args.max_det, 1, None), ("--batch-size", args.batch_size, 1, None),
                                   ("--workers", args.workers, 0, None)):
        if value is not None and (value < low or (high is not None and value > high)):
            raise UserError(f"{flag} {value}: use a value {'in [0, 1]' if high else f'of at least {low}'}")
    kind, ids, _ = parse_device(args.device, None)
    if len(ids) > 1:
        raise UserError(f"--device {args.device}: one process evaluates on one GPU; for several run "
                        f"`ppmulti launch --gpus {args.device} tools/eval.py ...` (one rank per GPU)")
    args.use_gpu = None if kind == "auto" else kind == "gpu"
    if kind == "gpu" and not in_paddle_worker():
        set_visible_gpu(ids[0])
    return args


def run(args) -> int:
    check_stack()   # one line about a broken install, before ppdet is imported
    from ppmulti.rank import dist
    from ppmulti.rank.engine.inference import evaluate
    from ppmulti.rank.eval_setup import resolve_model, val_edit

    model = resolve_model(args)
    if model.note and dist.is_main():
        print(model.note, file=sys.stderr)
    result = evaluate(model.config, overrides(args), model.weights, args.save_json, edit=val_edit(args, model))
    if dist.is_main():
        print(json.dumps(result))
    return 0


def main(argv=None) -> int:
    return exit_on_user_error(lambda a: run(parse(a)), argv)


if __name__ == "__main__":
    sys.exit(main())
