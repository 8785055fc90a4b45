"""Export trained weights as YOLOv5's export.py does (`python tools/export.py --weights RUN/weights/best.pdparams
--include onnx` writes RUN/weights/best.onnx), or as ppdet does (-c CONFIG: a Paddle inference model in
--output_dir, --format onnx for model.onnx beside it)."""

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from ppmulti.common.errors import UserError, exit_on_user_error
from ppmulti.common.flags import Flag, add, refusal, refusals
from ppmulti.common.stack import check_stack
from ppmulti.common.train_flags import parse_device
from ppmulti.common.ultra_keys import as_typed   # `ppmulti yolo`'s line: errors name its keys
from ppmulti.rank.tool_args import add_model_args, overrides, refuse_extra

FORMATS = ("paddle", "onnx")
# YOLOv5 export.py's other formats, refused by name (the first is what --include names them).
OTHER_FORMATS = ("torchscript", "openvino", "engine", "coreml", "saved_model", "pb", "tflite", "edgetpu", "tfjs")
# YOLOv5 export.py flags without an equivalent here; each is a row refused by name rather than ignored.
REFUSED: tuple[Flag, ...] = (
    refusal("export", ("--inplace",), "a PyTorch Detect() setting", action="store_true"),
    refusal("export", ("--keras",), "TensorFlow", action="store_true"),
    refusal("export", ("--optimize",), "TorchScript for mobile", action="store_true"),
    refusal("export", ("--int8",), "INT8 quantization", action="store_true"),
    refusal("export", ("--per-tensor",), "TensorFlow quantization", action="store_true"),
    refusal("export", ("--mlmodel",), "CoreML", action="store_true"),
    refusal("export", ("--verbose",), "TensorRT", action="store_true"),
    refusal("export", ("--workspace",), "TensorRT", type=int),
    refusal("export", ("--cache",), "TensorRT"),
    refusal("export", ("--agnostic-nms",), "TensorFlow's NMS (--nms puts per-class NMS into the ONNX graph)",
            action="store_true"),
    refusal("export", ("--topk-per-class",), "TF.js NMS", type=int),
    refusal("export", ("--topk-all",), "TF.js NMS", type=int),
    refusal("export", ("--iou-thres",), "TF.js NMS", type=float),
    refusal("export", ("--conf-thres",), "TF.js NMS", type=float),
)
UNSUPPORTED = refusals(REFUSED, "export")   # spelling -> why
PADDLE_DIR = "_paddle_model"   # YOLOv5's name for its Paddle export: best.pdparams -> best_paddle_model/


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tools/export.py", description=__doc__)
    add_model_args(p, config_required=False)
    add(p, "output_dir", help="with -c: where ppdet's exporter writes (default output_inference); without -c the "
                              "files go beside --weights, as YOLOv5 writes them")
    p.add_argument("--format", dest="format", choices=FORMATS,
                   help="with -c: paddle, Paddle's inference model (default); onnx, also model.onnx beside it, "
                        "through paddle2onnx (pip install -e \".[export]\")")
    p.add_argument("--include", nargs="+", metavar="FORMAT",
                   help="YOLOv5's spelling: onnx (W.onnx beside the weights W.pdparams), paddle "
                        "(W_paddle_model/), or both; with -c, one of them as --format")
    p.add_argument("--nms", dest="nms", action="store_const", const=True,
                   help="put per-class NMS into the graph (outputs: detections [N, 6] and their count); the default "
                        "with -c, off without it (YOLOv5's raw outputs)")
    p.add_argument("--no-nms", "--no_nms", dest="nms", action="store_const", const=False,
                   help="leave NMS out of the graph: outputs are boxes [B, N, 4] and scores [B, C, N] (the default "
                        "without -c, as YOLOv5's ONNX files; tools/detect.py runs the NMS)")
    p.add_argument("--dynamic", "--dynamic-batch", dest="dynamic", action="store_true",
                   help="ONNX: a symbolic batch dimension (needs NMS out of the graph)")
    add(p, "batch", default=1,
        help="ONNX: the fixed batch without --dynamic (default 1; above 1 needs NMS out of the graph)")
    p.add_argument("--opset", type=int, default=11, help="ONNX opset, 11 to 17 (default 11)")
    add(p, "imgsz", help="input size in pixels, square, a multiple of 32 (default: the run's)")
    add(p, "device", help="cpu or one GPU id to build the model on (the files are the same)")
    p.add_argument("--half", action="store_true",
                   help="FP16 export: ONNX with float16 weights and arithmetic (float32 inputs and outputs); "
                        "Paddle's inference model only where Paddle writes float16 (a GPU build of Paddle 2.6)")
    p.add_argument("--simplify", action="store_true",
                   help="ONNX: slim the graph with onnxslim, as YOLOv5 does (pip install onnxslim)")
    g = p.add_argument_group("the model without -c: the run's config.yml beside --weights, else --cfg/--data")
    add(g, "cfg")
    add(g, "data", help="a YOLOv5 data yaml (its nc and names) when the weights have no run directory")
    return p


def parse(argv) -> argparse.Namespace:
    """The command line, checked: unknown formats and flags refused by name; the mode (-c: ppdet's, else YOLOv5's)."""
    args, extra = build_parser().parse_known_args(argv)
    refuse_extra(extra, UNSUPPORTED, "export.py", "tools/export.py")
    args.formats = include_formats(args.include, args.format)
    args.yolov5 = not args.config
    if args.yolov5:
        if args.format:
            raise UserError("--format goes with -c CONFIG (ppdet's export); without -c use --include onnx|paddle")
        if args.output_dir:
            raise UserError("--output_dir goes with -c CONFIG; without -c the files go beside --weights "
                            "(as YOLOv5 writes them)")
        if not args.weights and not args.cfg:
            raise UserError("no weights given: pass --weights RUN/weights/best.pdparams (or -c CONFIG, or --cfg "
                            "MODEL.yaml alone for its untrained model)")
        if args.weights and Path(args.weights).suffix.lower() == ".onnx":
            raise UserError(f"--weights {args.weights}: already exported; pass the .pdparams it came from")
    elif len(args.formats) > 1:
        raise UserError(f"--include {' '.join(args.include)} with -c: one format per export")
    args.output_dir = args.output_dir or "output_inference"
    if args.nms is None:
        args.nms = not args.yolov5
    kind, ids, _ = parse_device(args.device, None)
    if len(ids) > 1:
        raise UserError(f"--device {args.device}: export builds the model on one device; pass one id or cpu")
    args.use_gpu = None if kind == "auto" else kind == "gpu"
    return args


def include_formats(include: list[str] | None, fmt: str | None) -> list[str]:
    """--include's formats (YOLOv5's names, onnx and paddle written here), else --format, else paddle."""
    if not include:
        return [fmt or "paddle"]
    if fmt:
        raise UserError("give the format once: --include (YOLOv5's) or --format (ppdet's)")
    out = []
    for item in (x.lower() for entry in include for x in entry.split(",") if x):
        if item in OTHER_FORMATS:
            raise UserError(f"--include {item}: a YOLOv5 format ppmulti does not write; use onnx or paddle")
        if item not in FORMATS:
            raise UserError(f"--include {item}: unknown format; use onnx or paddle")
        if item not in out:
            out.append(item)
    return out


def beside_weights(weights: Path, fmt: str) -> Path:
    """Where YOLOv5 writes a format: W.pdparams -> W.onnx, W_paddle_model/."""
    return weights.with_suffix(".onnx") if fmt == "onnx" else weights.with_name(weights.stem + PADDLE_DIR)


def run(args) -> int:
    check_stack()   # one line about a broken install, before ppdet is imported
    from ppmulti.rank.engine.onnx_export import OnnxOptions

    opts = OnnxOptions(nms=args.nms, dynamic=args.dynamic, batch=args.batch, opset=args.opset,
                       simplify=args.simplify, half=args.half)
    if "onnx" in args.formats:
        opts.check()   # before the model is built
    elif args.dynamic or args.batch != 1:
        raise UserError("--dynamic and --batch-size apply to ONNX; Paddle's inference model takes any batch")
    elif args.simplify:
        raise UserError("--simplify applies to ONNX: add --include onnx (or --format onnx with -c)")
    if args.half and "paddle" in args.formats:
        check_paddle_half()
    if args.yolov5:
        return run_yolov5(args, opts)
    from ppmulti.rank.eval_setup import detect_edit

    edit = detect_edit(args.imgsz, args.use_gpu, one_image=False)
    if args.formats == ["onnx"]:
        from ppmulti.rank.engine.onnx_export import export_onnx

        dst = export_onnx(args.config, overrides(args), args.weights, args.output_dir, opts, edit,
                          convert=converter(keep=True))
        print(f"ONNX model written to {dst}")
        return 0
    from ppmulti.rank.engine.inference import export

    dst = export(args.config, overrides(args), args.weights, args.output_dir, nms=args.nms, edit=edit)
    if args.half:
        from ppmulti.rank import compat

        compat.paddle_model_to_half(dst)
    print(f"inference model written to {dst}")
    return 0


def converter(keep: bool):
    """paddle2onnx's conversion in a child process (ppmulti/procs/onnx_convert.py): its native crashes become one
    line naming the model and what to use instead (``keep``: the Paddle model it converted stays for the user)."""
    from ppmulti.procs import onnx_convert

    def convert(model_dir: Path, opset: int, architecture: str, version: str) -> bytes:
        return onnx_convert.convert(model_dir, opset, architecture, version, keep=model_dir if keep else None)

    return convert


def check_paddle_half() -> None:
    """One line, before the model is built, where this Paddle cannot write a float16 inference model."""
    from ppmulti.rank import compat

    why = compat.paddle_half_unavailable()
    if why:
        raise UserError(f"--half for Paddle's inference model: {why}. Export it without --half, or "
                        f"--include onnx --half (--format onnx with -c) for a float16 ONNX file")


def run_yolov5(args, opts) -> int:
    """YOLOv5's export: the model from the weights' run, each format written beside the weights. --cfg alone
    (`ppmulti yolo export model=yolo11n.yaml`): the untrained model, as ultralytics exports a yaml, named after the
    yaml (yolo11n.onnx in the working directory)."""
    from ppmulti.rank.engine.inference import export, save_initial_weights
    from ppmulti.rank.engine.onnx_export import export_onnx
    from ppmulti.rank.eval_setup import detect_edit, resolve_model

    model = resolve_model(args)
    if model.note:
        print(model.note, file=sys.stderr)
    # the files are named after the weights (W.pdparams -> W.onnx); an untrained model's after its yaml
    home = Path(model.weights) if model.weights else Path(args.cfg).with_suffix(".pdparams")
    edit = detect_edit(args.imgsz, args.use_gpu, model, one_image=False)
    with tempfile.TemporaryDirectory(prefix=".export-", dir=home.parent) as tmp:
        weights = home
        if not model.weights:   # --cfg alone: its initial weights, in the temporary directory
            weights = Path(tmp) / home.name
            save_initial_weights(model.config, overrides(args), weights, edit)
        written = []
        if "onnx" in args.formats:
            written.append(export_onnx(model.config, overrides(args), str(weights), tmp, opts, edit,
                                       dst=beside_weights(home, "onnx"), convert=converter(keep=False)))
        if "paddle" in args.formats:
            if "onnx" in args.formats:
                model_dir = next(p for p in Path(tmp).iterdir() if p.is_dir())   # the ONNX's own Paddle model
            else:
                model_dir = export(model.config, overrides(args), str(weights), tmp, nms=args.nms, edit=edit)
            if args.half:
                from ppmulti.rank import compat

                compat.paddle_model_to_half(model_dir)
            dst = beside_weights(home, "paddle")
            if dst.exists():
                shutil.rmtree(dst)
            shutil.move(str(model_dir), str(dst))
            written.append(dst)
    for dst in written:
        print(f"{'ONNX model' if dst.suffix == '.onnx' else 'inference model'} written to {dst}")
    return 0


def main(argv=None) -> int:
    return exit_on_user_error(lambda a: run(parse(a)), argv, said=as_typed)


if __name__ == "__main__":
    sys.exit(main())
