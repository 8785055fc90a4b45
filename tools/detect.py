"""Detect objects as YOLOv5's detect.py does: `python tools/detect.py --weights RUN/weights/best.pdparams (or
best.onnx) --source IMAGES|VIDEO|URL|0`, annotated images and videos, YOLO-format labels, crops and a CSV in
runs/detect/exp*."""

import argparse
import sys
from pathlib import Path

from ppmulti.common.envvars import in_paddle_worker, set_visible_gpu
from ppmulti.common.errors import UserError, exit_on_user_error
from ppmulti.common.flags import Flag, add, refusal, refusals
from ppmulti.common.stack import check_stack
from ppmulti.common.train_flags import parse_device
from ppmulti.common.ultra_keys import as_typed   # `ppmulti yolo`'s line: errors name its keys
from ppmulti.rank.tool_args import add_model_args, overrides, refuse_extra

# YOLOv5 detect.py flags without an equivalent here; each is a row refused by name rather than ignored.
REFUSED: tuple[Flag, ...] = (
    refusal("detect", ("--view-img",), "showing results in a window", action="store_true"),
    refusal("detect", ("--augment",), "test-time augmentation", action="store_true"),
    refusal("detect", ("--visualize",), "feature maps", action="store_true"),
    refusal("detect", ("--update",), "stripping optimizers from .pt files", action="store_true"),
    refusal("detect", ("--half",), "FP16 inference", action="store_true"),
    refusal("detect", ("--dnn",), "OpenCV DNN for ONNX", action="store_true"),
    refusal("detect", ("--data",), "class names from a data yaml (they come from the weights' run, its config.yml)"),
)
UNSUPPORTED = refusals(REFUSED, "detect")   # spelling -> why


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tools/detect.py", description=__doc__)
    add_model_args(p, config_required=False)
    p.set_defaults(weights=None, cfg=None, data=None)   # what resolve_model reads besides -c and --weights
    for action in p._actions:   # YOLOv5's --weights help: a .pdparams, a run directory or an exported .onnx
        if action.dest == "weights":
            action.help = ("a .pdparams file, a run directory (weights/best) or a .onnx file exported by "
                           "tools/export.py; the model comes from the weights' run (its config.yml) unless -c")
    p.add_argument("--source", default="data/images",
                   help="an image or video file, a folder, a glob ('imgs/*.jpg'), a .txt file of paths, a stream "
                        "URL (rtsp://, rtmp://, http(s)://) or a webcam index (0) (default: data/images)")
    add(p, "imgsz", help="inference size in pixels, square, a multiple of 32 (default: the run's; an ONNX file's "
                         "own size)")
    add(p, "conf_thres", default=0.25, help="confidence threshold (default 0.25)")
    add(p, "iou_thres", default=0.45, help="NMS IoU threshold (default 0.45)")
    add(p, "max_det", default=1000, help="maximum detections per image (default 1000)")
    add(p, "device", help="cpu or one GPU id")
    add(p, "end2end")
    add(p, "save_txt")
    add(p, "save_conf")
    p.add_argument("--save-crop", "--save_crop", dest="save_crop", action="store_true",
                   help="write each box's part of the image to crops/CLASS/NAME.jpg")
    p.add_argument("--save-csv", "--save_csv", dest="save_csv", action="store_true",
                   help="write predictions.csv: Image Name, Prediction, Confidence (one row per box)")
    add(p, "nosave", help="do not write annotated images and videos")
    p.add_argument("--vid-stride", "--vid_stride", dest="vid_stride", type=int, default=1,
                   help="detect on every Nth frame of a video or stream (default 1)")
    p.add_argument("--classes", nargs="+", type=int, help="keep these class indices only: --classes 0 2 3")
    p.add_argument("--agnostic-nms", "--agnostic_nms", dest="agnostic_nms", action="store_true",
                   help="NMS across classes")
    add(p, "project", default="runs/detect", help="results go to PROJECT/NAME (default runs/detect)")
    add(p, "name", default="exp")
    add(p, "exist_ok")
    p.add_argument("--line-thickness", "--line_thickness", dest="line_thickness", type=int, default=3,
                   help="box line width in pixels (default 3)")
    p.add_argument("--hide-labels", "--hide_labels", dest="hide_labels", action="store_true",
                   help="draw boxes without class names")
    p.add_argument("--hide-conf", "--hide_conf", dest="hide_conf", action="store_true",
                   help="draw class names without confidences")
    return p


def parse(argv) -> argparse.Namespace:
    """The command line, checked: YOLOv5 flags without an equivalent refused by name, values in range."""
    args, extra = build_parser().parse_known_args(argv)
    refuse_extra(extra, UNSUPPORTED, "detect.py", "tools/detect.py")
    if not args.weights:
        raise UserError("no weights given: pass --weights RUN/weights/best.pdparams (or a run directory, or an "
                        "exported .onnx)")
    for flag, value, low, high in (("--conf-thres", args.conf_thres, 0.0, 1.0),
                                   ("--iou-thres", args.iou_thres, 0.0, 1.0),
                                   ("--max-det", args.max_det, 1, None),
                                   ("--line-thickness", args.line_thickness, 1, None),
                                   ("--vid-stride", args.vid_stride, 1, None)):
        if value < low or (high is not None and value > high):
            raise UserError(f"{flag} {value}: use a value {'in [0, 1]' if high else f'of at least {low}'}")
    if args.classes is not None and min(args.classes) < 0:
        raise UserError(f"--classes {' '.join(map(str, args.classes))}: class indices start at 0")
    kind, ids, _ = parse_device(args.device, None)
    if len(ids) > 1:
        raise UserError(f"--device {args.device}: detect runs on one GPU; pass one id")
    args.use_gpu = None if kind == "auto" else kind == "gpu"
    if kind == "gpu" and not in_paddle_worker():
        set_visible_gpu(ids[0])
    return args


def is_onnx(weights: str) -> bool:
    return Path(weights).suffix.lower() == ".onnx"


def run(args) -> int:
    from ppmulti.rank.engine.sources import resolve_source

    source = resolve_source(args.source)   # names checked before anything heavy is imported
    _console()
    check_stack()   # one line about a broken install, before ppdet is imported
    from ppmulti.rank.engine.sources import FrameReader

    try:
        with FrameReader(source, args.vid_stride) as frames:   # opened before the model loads; closed on any exit
            if frames.stream_info:
                print(frames.stream_info, file=sys.stderr)
            return _detect(args, frames)
    except KeyboardInterrupt:   # while the model loads (run_detect handles its own): one line, not a traceback
        print("stopped by Ctrl-C before the first frame", file=sys.stderr)
        return 130


def _console() -> None:
    """A line a frame on stderr, as YOLOv5 prints them, whichever Paddle is installed (Paddle 3 configures the root
    logger, Paddle 2.6 does not, and ppmulti's INFO lines were lost there)."""
    import logging

    log = logging.getLogger("ppmulti")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _detect(args, frames) -> int:
    from ppmulti.common.rundir import new_run_dir
    from ppmulti.rank.engine.detect import DetectOptions, NmsOptions, OnnxBackend, PaddleBackend, run_detect
    from ppmulti.rank.eval_setup import detect_edit, resolve_model, resolve_onnx_model

    if is_onnx(args.weights):
        config, note = resolve_onnx_model(args)
        backend = OnnxBackend(config, overrides(args), Path(args.weights), lambda cfg: None, bool(args.use_gpu))
        if args.imgsz and backend.size and args.imgsz != backend.size:
            raise UserError(f"--imgsz {args.imgsz}: {args.weights} was exported for {backend.size} px; pass "
                            f"--imgsz {backend.size} or export again with --imgsz {args.imgsz}")
        detect_edit(args.imgsz or backend.size, args.use_gpu)(backend.cfg)
        if backend.nms_inside and args.iou_thres != 0.45:
            print(f"note: {args.weights} holds NMS (its IoU threshold as exported); --iou-thres applies to "
                  f"--agnostic-nms only", file=sys.stderr)
    else:
        model = resolve_model(args)
        note = model.note
        edit = detect_edit(args.imgsz, args.use_gpu, model, end2end=args.end2end)
        backend = PaddleBackend(model.config, overrides(args), model.weights, edit)
    if note:
        print(note, file=sys.stderr)
    save_dir = new_run_dir(args.project, args.name, args.exist_ok)
    opts = DetectOptions(NmsOptions(args.conf_thres, args.iou_thres, tuple(args.classes) if args.classes else None,
                                    args.agnostic_nms, args.max_det),
                         save_dir, save_img=not args.nosave, save_txt=args.save_txt, save_conf=args.save_conf,
                         save_crop=args.save_crop, save_csv=args.save_csv, line_thickness=args.line_thickness,
                         hide_labels=args.hide_labels, hide_conf=args.hide_conf)
    counts = run_detect(backend, frames, opts)
    parts = [f"{counts['images']} images"] if counts["images"] or not (counts["video_frames"] or
                                                                        counts["stream_frames"]) else []
    parts += [f"{counts[k]} {what} frames" for k, what in (("video_frames", "video"), ("stream_frames", "stream"))
              if counts[k]]
    print(f"{', '.join(parts)}, {counts['detections']} detections in {counts['seconds']:.1f}s", file=sys.stderr)
    for path, written in counts["videos"]:
        print(f"{written} frames written to {path}", file=sys.stderr)
    if args.save_txt:
        written = len(list((save_dir / "labels").glob("*.txt")))
        print(f"{written} labels saved to {save_dir / 'labels'}", file=sys.stderr)
    print(f"Results saved to {save_dir}")
    return 130 if counts["interrupted"] else 0   # the shell's code for a run stopped by Ctrl-C


def main(argv=None) -> int:
    return exit_on_user_error(lambda a: run(parse(a)), argv, said=as_typed)


if __name__ == "__main__":
    sys.exit(main())
