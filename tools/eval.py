"""Evaluate weights (COCO bbox mAP) as YOLOv5's val.py does: `python tools/eval.py --data data.yaml --weights W
--img 640`, or on a ppdet config with -c; shards the images across ranks when launched."""

import argparse
import json
import sys
from pathlib import Path

from ppmulti.common.envvars import in_paddle_worker, set_visible_gpu
from ppmulti.common.errors import UserError, exit_on_user_error
from ppmulti.common.flags import Flag, add, refusal, refusals
from ppmulti.common.ppdet_flags import add_ppdet_flags
from ppmulti.common.ppdet_flags import resolve as resolve_ppdet
from ppmulti.common.stack import check_stack
from ppmulti.common.train_flags import parse_device
from ppmulti.common.ultra_keys import as_typed   # `ppmulti yolo`'s line: errors name its keys
from ppmulti.rank.tool_args import add_model_args, overrides, refuse_extra

# YOLOv5 val.py flags without an equivalent here; each is a row refused by name rather than ignored.
REFUSED: tuple[Flag, ...] = (
    refusal("eval", ("--augment",), "test-time augmentation", action="store_true"),
    refusal("eval", ("--save-hybrid",), "label+prediction txt files", action="store_true"),
    refusal("eval", ("--half",), "FP16 inference", action="store_true"),
    refusal("eval", ("--dnn",), "OpenCV DNN for ONNX", action="store_true"),
)
UNSUPPORTED = refusals(REFUSED, "eval")   # spelling -> why
TASKS = {"train": "the train split", "test": "the test split", "speed": "speed benchmarks",
         "study": "size studies"}   # --task values other than val, refused by name


def build_parser(prog: str = "tools/eval.py") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__)
    add_model_args(p, config_required=False)
    p.add_argument("--save-json", "--save_json", dest="save_json", nargs="?", const=True,
                   help="--save-json FILE: also write the metrics to FILE; bare --save-json (YOLOv5's): write the "
                        "detections as COCO json, <weights stem>_predictions.json in the results directory")
    g = p.add_argument_group("YOLOv5 val.py flags (the model: -c, else --cfg, else the run's config.yml beside "
                             "--weights, else yolov5n/s/m/l/x inferred from the weights' shapes)")
    add(g, "cfg")
    add(g, "data", help="a YOLOv5 data yaml (its val split, names, nc) or a ppdet dataset .yml")
    add(g, "imgsz", help="inference size in pixels, a multiple of 32 (default: the config's; YOLOv5 configs 640)")
    add(g, "batch", help="images per batch and rank (default: the config's EvalReader batch_size)")
    add(g, "conf_thres", help="confidence threshold (default: the config's; YOLOv5 configs 0.001 as val.py)")
    add(g, "iou_thres", help="NMS IoU threshold (default: the config's; YOLOv5 configs 0.6 as val.py)")
    add(g, "max_det", help="maximum detections per image (default: the config's; YOLOv5 configs 300 as val.py)")
    add(g, "rect")
    add(g, "end2end")
    add(g, "device", help="cpu or one GPU id (several GPUs: ppmulti launch --gpus 0,1 tools/eval.py ...)")
    add(g, "workers", help="data loader worker processes (default: the config's worker_num)")
    add(g, "single_cls", help="the data's classes as one (for weights trained with --single-cls)")
    g.add_argument("--task", default="val", help="val: the data's val split (the only one evaluated here)")
    add(g, "project", help="results go to PROJECT/NAME (default runs/val; without -c always written)")
    add(g, "name")
    add(g, "exist_ok")
    add(g, "save_txt", help="write labels/<image stem>.txt of the detections: class xc yc w h, normalised (YOLO "
                            "format)")
    add(g, "save_conf")
    add(g, "verbose", help="print every class's row of the table (default: only under 50 classes)")
    add(g, "noplots", help="no confusion_matrix.png, PR/F1/P/R_curve.png in the results directory")
    add_ppdet_flags(p, "eval")
    return p


def parse(argv, prog: str = "tools/eval.py") -> argparse.Namespace:
    args, extra = build_parser(prog).parse_known_args(argv)
    refuse_extra(extra, UNSUPPORTED, "val.py", prog)
    ppdet = resolve_ppdet(args, "eval")   # PaddleDetection's eval.py flags, as the -o keys they stand for
    if ppdet:
        args.opt = list(args.opt or []) + [ppdet]
    if args.task != "val":
        why = TASKS.get(args.task, "an unknown task")
        raise UserError(f"--task {args.task}: YOLOv5 val.py's task for {why}, which ppmulti does not run; "
                        f"--task val (the data's val split) is the one evaluated")
    if args.weights and Path(args.weights).suffix.lower() == ".onnx":
        raise UserError(f"--weights {args.weights}: evaluation runs Paddle weights; pass the .pdparams (or .pt) it "
                        f"was exported from (an .onnx file is for predicting)")
    args.save_dir_wanted = not args.config or bool(args.project or args.name)
    if (args.save_txt or args.save_json is True) and not args.save_dir_wanted:
        raise UserError("--save-txt and a bare --save-json write into the results directory: add --project DIR "
                        "(or give --save-json FILE for the metrics)")
    for flag, value, low, high in (("--conf-thres", args.conf_thres, 0.0, 1.0),
                                   ("--iou-thres", args.iou_thres, 0.0, 1.0),
                                   ("--max-det", args.max_det, 1, None), ("--batch-size", args.batch, 1, None),
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
    from ppmulti.rank.engine.inference import ValOutputs, evaluate
    from ppmulti.rank.eval_setup import resolve_model, val_edit

    model = resolve_model(args)
    if model.note and dist.is_main():
        print(model.note, file=sys.stderr)
    outputs = None
    if args.save_dir_wanted:
        stem = Path(model.weights).stem if model.weights else "model"
        outputs = ValOutputs(Path(args.project or "runs/val"), args.name or "exp", args.exist_ok, args.save_txt,
                             args.save_conf, f"{stem}_predictions.json" if args.save_json is True else None,
                             plots=not args.noplots)
    metrics_file = args.save_json if isinstance(args.save_json, str) else None
    result = evaluate(model.config, overrides(args), model.weights, metrics_file, edit=val_edit(args, model),
                      outputs=outputs, verbose=args.verbose)
    if dist.is_main():
        if outputs is not None:
            print(f"Results saved to {result['save_dir']}", file=sys.stderr)
        print(json.dumps(result))
    return 0


def main(argv=None, prog: str = "tools/eval.py") -> int:
    return exit_on_user_error(lambda a: run(parse(a, prog)), argv, said=as_typed)


if __name__ == "__main__":
    sys.exit(main())
