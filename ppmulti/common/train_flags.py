"""The train command's flags, ppmulti's own and YOLOv5's train.py ones (pure argparse: both sides parse them); the
ones other tools take too come from ppmulti.common.flags."""

from __future__ import annotations

import argparse
import os

from ppmulti.common.errors import UserError
from ppmulti.common.flags import add
from ppmulti.common.paths import TRAIN_SCRIPT
from ppmulti.common.ppdet_flags import add_ppdet_flags

# YOLOv5 train.py flags that ppmulti does not implement, with what they do there; each fails by name.
UNSUPPORTED = {
    "--quad": "the quad dataloader",
    "--bucket": "gsutil dataset buckets",
    "--upload_dataset": "W&B dataset upload",
    "--bbox_interval": "W&B bounding-box logging",
    "--artifact_alias": "W&B artifacts",
    "--entity": "W&B entity",
    "--local_rank": "torch.distributed.launch's rank flag (ppmulti launch sets ranks itself)",
    "--local-rank": "torch.distributed.launch's rank flag (ppmulti launch sets ranks itself)",
    "--ndjson-console": "NDJSON logging",
    "--ndjson-file": "NDJSON logging",
    "--evolve_population": "evolution seeded from a population directory",
    "--resume_evolve": "resuming evolution from a csv (ppmulti evolve resumes by itself)",
}


OPTIMIZERS = ("SGD", "Adam", "AdamW")


def add_train_flags(p: argparse.ArgumentParser) -> None:
    add(p, "config")
    add(p, "opt")
    p.add_argument("--eval", action="store_true", help="evaluate every snapshot_epoch and keep the best weights")
    p.add_argument("-r", "--resume", metavar="PATH", nargs="?", const=True, default=None,
                   help="a run directory or weights/last to continue from; bare --resume takes the newest run; "
                        "a PaddleDetection checkpoint (output/CONFIG/model_final or output/CONFIG/N: N.pdparams "
                        "beside N.pdopt) continues its weights, optimizer and epoch in a new run directory")
    add(p, "batch")
    p.add_argument("--accumulate", type=int, metavar="N",
                   help="batches whose gradients add up before each optimizer step: effective batch = global "
                        "batch x N, the lr scaled from it (default 1; --cfg/--data/--hyp runs: YOLOv5's "
                        "max(round(64 / global batch), 1))")
    add(p, "epochs")
    add(p, "output", help="run directory (default: runs/train/exp for YOLOv5 command lines, save_dir/<config name> "
                          "for -c ones; numbered unless --exist-ok)")
    add(p, "exist_ok", help="reuse the run directory instead of numbering a new one")
    p.add_argument("--sync-bn", "--sync_bn", dest="sync_bn", action="store_true",
                   help="BatchNorm statistics over all ranks' batches (SyncBatchNorm; CPU ranks: 2-3x the step time)")
    add(p, "seed", help="random seed (rank r seeds its augmentation with SEED + r; the initial weights with SEED)")
    p.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=None,
                   help="deterministic GPU kernels (FLAGS_cudnn_deterministic, FLAGS_embedding_deterministic, "
                        "CUBLAS_WORKSPACE_CONFIG) in every rank; default: on for YOLOv5 command lines "
                        "(--cfg/--data/--hyp, as YOLOv5 trains), off for -c lines")
    p.add_argument("--cudnn-benchmark", "--cudnn_benchmark", dest="cudnn_benchmark", action="store_true",
                   help="let cuDNN time its convolution algorithms and keep the fastest "
                        "(FLAGS_cudnn_exhaustive_search, torch's cudnn.benchmark); not with --deterministic")
    add(p, "workers")
    add(p, "weights", metavar="FILE",
        help="initial weights: a .pdparams, or a YOLOv5 .pt (yolov5s.pt: downloaded once when not on disk; "
             "converted without torch and cached beside it); '' trains from scratch")
    add(p, "device", help="cpu, one GPU id (0) or several (0,1,2,3): several start one rank per GPU")
    add(p, "nproc")
    # --no-amp: argparse's own on/off pair, and ultralytics' amp=False; YOLOv5 has no flag (AMP always on CUDA)
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                   help="mixed precision: float16 on GPUs, bfloat16 convolutions on CPUs with AVX512-BF16/AMX; "
                        "default: the config's amp key (-o amp=true), on for --cfg/--data/--hyp runs on GPUs")
    p.add_argument("--callback", dest="callback", action="append", default=None, metavar="EVENT=MODULE:FUNCTION",
                   help="FUNCTION(run) called in every rank at EVENT (ultralytics' names), e.g. "
                        "on_fit_epoch_end=my_callbacks:log; repeatable")
    p.add_argument("--logger", dest="logger", action="extend", nargs="+", default=None,
                   metavar="NAME", help="where rank 0 logs the run: visualdl (default), tensorboard (tb), mlflow, "
                                        "comma-separated or several, e.g. --logger visualdl,tensorboard,mlflow; "
                                        "none logs to no tracker")


def add_yolov5_flags(p: argparse.ArgumentParser) -> None:
    """YOLOv5 train.py's flags (the ones shared with ppmulti's own are added by train_cli)."""
    g = p.add_argument_group("YOLOv5 train.py flags")
    add(g, "cfg", help="model: a ppdet .yml, a YOLOv5 model yaml, or a name (yolov5s, yolov5n.yaml, ppyoloe_s)")
    add(g, "data", help="dataset: a YOLOv5 data yaml (path/train/val/nc/names) or a ppdet dataset .yml")
    g.add_argument("--hyp", help="YOLOv5 hyperparameter yaml, e.g. configs/hyps/hyp.scratch-low.yaml")
    add(g, "imgsz", help="train and val image size (pixels)")
    add(g, "project", help="runs go to PROJECT/NAME (default runs/train for YOLOv5 command lines)")
    add(g, "name", help="run name under --project (default exp; exp2, exp3, ... when taken, unless --exist-ok)")
    g.add_argument("--optimizer", choices=OPTIMIZERS, help="SGD (Nesterov momentum), Adam or AdamW")
    g.add_argument("--cos-lr", "--cos_lr", dest="cos_lr", action="store_true", help="cosine lr decay (default linear)")
    add(g, "single_cls", help="train every class as one class")
    g.add_argument("--noval", action="store_true", help="validate only after the last epoch")
    add(g, "nosave", help="save weights only after the last epoch")
    g.add_argument("--save-period", "--save_period", dest="save_period", type=int, default=-1,
                   help="also keep weights/epochN every N epochs")
    g.add_argument("--patience", type=int, default=None,
                   help="stop after N validated epochs without a better fitness (0.1 mAP50 + 0.9 mAP50-95)")
    g.add_argument("--freeze", type=int, nargs="+", default=None,
                   help="freeze backbone layers: one N = the first N (10 = YOLOv5's whole backbone), or indices")
    g.add_argument("--label-smoothing", "--label_smoothing", dest="label_smoothing", type=float, default=None,
                   help="class label smoothing epsilon (YOLOv5 models)")
    g.add_argument("--noautoanchor", action="store_true",
                   help="accepted: ppmulti never recomputes anchors (they come from the model config)")
    g.add_argument("--cache", nargs="?", const="ram", default=None, choices=("ram", "disk"),
                   help="cache decoded training images: ram (bare --cache; one shared copy per node, not per rank) "
                        "or disk (.npy files beside the images)")
    g.add_argument("--mosaic-buffer", "--mosaic_buffer", dest="mosaic_buffer", type=int, default=None, metavar="N",
                   help="mosaic tiles from each loader's last N images (default 0: the whole set, as YOLOv5); "
                        "one image load per sample instead of four, but 2 ranks learned less per epoch that way")
    add(g, "noplots", help="draw no pictures (results.png, labels.jpg, confusion_matrix.png, ...)")
    add(g, "multi_scale", help="every step a random size in [0.5, 1.5] x imgsz (multiples of 32), the same on every "
                               "rank; the batch is resized on the device")
    g.add_argument("--image-weights", "--image_weights", dest="image_weights", action="store_true",
                   help="draw each epoch's images by class weights (rare classes and classes with a low mAP more "
                        "often), the same draw on every rank, then sharded")
    g.add_argument("--rect", action="store_true",
                   help="rectangular training: no mosaic, no shuffle, images in aspect-ratio order, each batch "
                        "letterboxed to its own stride-aligned shape (YOLOv5 data yamls, YOLOv5 reader)")
    # --- --evolve (ppmulti/procs/runs/evolve_run.py) ---
    g.add_argument("--evolve", type=int, nargs="?", const=300, default=None, metavar="N",
                   help="evolve hyperparameters for N generations (default 300) in PROJECT/NAME (runs/evolve/exp); "
                        "the same command resumes; ppmulti evolve runs one worker per device")
    add(g, "storage", help="with --evolve: Optuna storage of the population (default "
                           "sqlite:///PROJECT/NAME/evolve.db; postgresql://user@host/db shares it across machines)")


def reject_unknown(extra: list[str]) -> None:
    """Leftover argv after parsing: name the first flag and say why it is refused."""
    for item in extra:
        name = item.split("=", 1)[0]
        if name in UNSUPPORTED:
            raise UserError(f"{name} is a YOLOv5 flag that ppmulti does not support ({UNSUPPORTED[name]}); remove it")
        if name.startswith("-"):
            raise UserError(f"unknown flag {name}; see tools/train.py --help")
    if extra:
        raise UserError(f"unexpected argument {extra[0]!r}; see tools/train.py --help")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tools/train.py",
                                description="Train a detector from a ppdet config "
                                            "(one process, or one rank of a launch).")
    add_train_flags(p)
    add_yolov5_flags(p)
    add_ppdet_flags(p, "train")
    return p


def parse_device(device: str | None, nproc: int | None) -> tuple[str, list[int], int]:
    """``--device``/``--nproc`` -> (kind "cpu"/"gpu"/"auto", gpu ids, number of ranks wanted)."""
    if nproc is not None and nproc < 1:
        raise UserError(f"--nproc {nproc}: need at least 1 process")
    if device is None or device == "":
        return "auto", [], nproc or 1
    if device.lower() == "cpu":
        return "cpu", [], nproc or 1
    try:
        ids = [int(x) for x in device.replace("cuda:", "").split(",") if x.strip() != ""]
    except ValueError:
        raise UserError(f"--device {device!r}: expected cpu, a GPU id like 0, or ids like 0,1,2,3") from None
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
        raise UserError(f"--device {device!r}: expected distinct non-negative GPU ids like 0,1")
    if nproc is not None and nproc != len(ids):
        raise UserError(f"--nproc {nproc} disagrees with --device {device} ({len(ids)} GPUs); give one of them")
    return "gpu", ids, len(ids)


def relaunch_argv(argv: list[str], kind: str, ids: list[int], nranks: int) -> list[str]:
    """The ``ppmulti launch`` argv that re-runs this training as one process per device."""
    rest = _strip_flags(argv, {"--device", "--nproc"})
    if kind == "gpu":
        return ["--gpus", ",".join(map(str, ids)), str(TRAIN_SCRIPT), *rest]
    return ["--nproc_per_node", str(nranks), "--device", "cpu", str(TRAIN_SCRIPT), *rest, "-o", "use_gpu=false"]


def _strip_flags(argv: list[str], names: set[str]) -> list[str]:
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        name = item.split("=", 1)[0]
        if name in names:
            skip = "=" not in item
            continue
        out.append(item)
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Parse, refusing leftovers by name (a YOLOv5 flag ppmulti lacks is never silently ignored)."""
    args, extra = build_parser().parse_known_args(argv)
    reject_unknown(extra)
    return args


DEFAULT_PROJECT = os.path.join("runs", "train")
DEFAULT_NAME = "exp"


def run_output(project: str | None, name: str | None, yolo: bool = False) -> str | None:
    """``--project/--name`` -> the run directory (numbered by the trainer unless --exist-ok): YOLOv5 command
    lines default to ``runs/train/exp`` as YOLOv5 does; ``-c`` lines without either keep ppdet's
    ``save_dir/<config name>`` (None here)."""
    if project is None and name is None and not yolo:
        return None
    return os.path.join(project or DEFAULT_PROJECT, name or DEFAULT_NAME)


EDIT_FLAGS = ("cfg", "data", "hyp", "imgsz", "optimizer", "cos_lr", "single_cls", "label_smoothing", "rect",
              "mosaic_buffer")


STYLE_FLAGS = ("cfg", "data", "hyp")   # any of these: a YOLOv5-style run (validate and save every epoch)


def yolo_style(args: argparse.Namespace) -> bool:
    return any(getattr(args, k, None) is not None for k in STYLE_FLAGS)


def wants_edit(args: argparse.Namespace) -> bool:
    """Whether any EDIT_FLAGS flag was given (0 is a value: ``--mosaic-buffer 0``)."""
    values = (getattr(args, k, None) for k in EDIT_FLAGS)
    return any(v is not None and v is not False for v in values)
