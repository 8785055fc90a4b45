"""The train command's flags as one table of rows (ppmulti's own, YOLOv5's train.py ones, the shared ones told
train's help, and YOLOv5's flags ppmulti refuses), the parser built from it (pure argparse: both sides parse them)."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from ppmulti.common.errors import UserError
from ppmulti.common.flags import BY_DEST, Flag, refusal, refusals
from ppmulti.common.paths import TRAIN_SCRIPT
from ppmulti.common.ppdet_flags import add_ppdet_flags

OPTIMIZERS = ("SGD", "MuSGD", "Adam", "AdamW")

YOLOV5 = "YOLOv5 train.py flags"   # the --help section of YOLOv5's own flags (the ones shared with ppmulti's aside)


def _t(names: tuple[str, ...], dest: str, help: str, **value) -> Flag:
    """A train flag: its spellings (the dash/underscore twin of each comes along), dest, help, argparse keywords."""
    return Flag(names, dest, help, ("train",), value)


def _shared(dest: str, help: str | None = None, **value) -> Flag:
    """A flag of the shared table (common/flags.py), with train's own help text or value keywords where they differ."""
    flag = BY_DEST[dest]
    assert "train" in flag.tools, dest
    return flag.told(help, **value)


def _in(group: str, rows: tuple[Flag, ...]) -> tuple[Flag, ...]:
    """``rows``, shown under --help's section ``group``."""
    return tuple(replace(flag, group=group) for flag in rows)


# Every flag of tools/train.py but PaddleDetection's (ppdet_flags adds those), in --help's order.
TRAIN: tuple[Flag, ...] = (
    _shared("config"),
    _shared("opt"),
    _t(("--eval",), "eval", "evaluate every snapshot_epoch and keep the best weights", action="store_true"),
    _t(("-r", "--resume"), "resume",
       "a run directory or weights/last to continue from (more --epochs extend it); bare --resume takes "
       "the newest run; "
       "a PaddleDetection checkpoint (output/CONFIG/model_final or output/CONFIG/N: N.pdparams "
       "beside N.pdopt) continues its weights, optimizer and epoch in a new run directory",
       metavar="PATH", nargs="?", const=True, default=None),
    _shared("batch"),
    _t(("--accumulate",), "accumulate",
       "batches whose gradients add up before each optimizer step: effective batch = global "
       "batch x N, the lr scaled from it (default 1; --cfg/--data/--hyp runs: YOLOv5's "
       "max(round(64 / global batch), 1))", type=int, metavar="N"),
    _shared("epochs"),
    _shared("output", "run directory (default: runs/train/exp for YOLOv5 command lines, save_dir/<config name> "
                      "for -c ones; numbered unless --exist-ok)"),
    _shared("exist_ok", "reuse the run directory instead of numbering a new one"),
    _t(("--sync-bn",), "sync_bn",
       "BatchNorm statistics over all ranks' batches (SyncBatchNorm; CPU ranks: 2-3x the step time)",
       action="store_true"),
    _shared("seed", "random seed (rank r seeds its augmentation with SEED + r; the initial weights with SEED)"),
    _t(("--deterministic",), "deterministic",
       "deterministic GPU kernels (FLAGS_cudnn_deterministic, FLAGS_embedding_deterministic, "
       "CUBLAS_WORKSPACE_CONFIG) in every rank; default: on for YOLOv5 command lines "
       "(--cfg/--data/--hyp, as YOLOv5 trains), off for -c lines",
       action=argparse.BooleanOptionalAction, default=None),
    _t(("--cudnn-benchmark",), "cudnn_benchmark",
       "let cuDNN time its convolution algorithms and keep the fastest "
       "(FLAGS_cudnn_exhaustive_search, torch's cudnn.benchmark); not with --deterministic", action="store_true"),
    _shared("workers"),
    _shared("weights", "initial weights: a .pdparams, or a YOLOv5 .pt (yolov5s.pt: downloaded once when not on "
                       "disk; converted without torch and cached beside it); '' trains from scratch", metavar="FILE"),
    _shared("device", "cpu, one GPU id (0) or several (0,1,2,3): several start one rank per GPU"),
    _shared("nproc"),
    # --no-amp: argparse's own on/off pair, and ultralytics' amp=False; YOLOv5 has no flag (AMP always on CUDA)
    _t(("--amp",), "amp",
       "mixed precision: float16 on GPUs, bfloat16 convolutions on CPUs with AVX512-BF16/AMX; "
       "default: the config's amp key (-o amp=true), on for --cfg/--data/--hyp runs on GPUs",
       action=argparse.BooleanOptionalAction, default=None),
    _t(("--callback",), "callback",
       "FUNCTION(run) called in every rank at EVENT (ultralytics' names), e.g. "
       "on_fit_epoch_end=my_callbacks:log; repeatable", action="append", default=None, metavar="EVENT=MODULE:FUNCTION"),
    _t(("--logger",), "logger",
       "where rank 0 logs the run: visualdl (default), tensorboard (tb), mlflow, "
       "comma-separated or several, e.g. --logger visualdl,tensorboard,mlflow; none logs to no tracker",
       action="extend", nargs="+", default=None, metavar="NAME"),
    *_in(YOLOV5, (
        _shared("cfg", "model: a ppdet .yml, a YOLOv5 model yaml, or a name (yolov5s, yolov5n.yaml, ppyoloe_s)"),
        _shared("data", "dataset: a YOLOv5 data yaml (path/train/val/nc/names) or a ppdet dataset .yml"),
        _t(("--hyp",), "hyp", "YOLOv5 hyperparameter yaml, e.g. configs/hyps/hyp.scratch-low.yaml"),
        _shared("imgsz", "train and val image size (pixels)"),
        _shared("project", "runs go to PROJECT/NAME (default runs/train for YOLOv5 command lines)"),
        _shared("name", "run name under --project (default exp; exp2, exp3, ... when taken, unless --exist-ok)"),
        _t(("--optimizer",), "optimizer", "SGD (Nesterov), MuSGD, Adam or AdamW",
           choices=OPTIMIZERS),
        _t(("--cos-lr",), "cos_lr", "cosine lr decay (default linear)", action="store_true"),
        _shared("single_cls", "train every class as one class"),
        _t(("--noval",), "noval", "validate only after the last epoch", action="store_true"),
        _shared("nosave", "save weights only after the last epoch"),
        _t(("--save-period",), "save_period", "also keep weights/epochN every N epochs", type=int, default=-1),
        _t(("--patience",), "patience",
           "stop after N validated epochs without a better fitness (0.1 mAP50 + 0.9 mAP50-95)", type=int,
           default=None),
        _t(("--freeze",), "freeze",
           "freeze backbone layers: one N = the first N (10 = YOLOv5's whole backbone), or indices", type=int,
           nargs="+", default=None),
        _t(("--label-smoothing",), "label_smoothing", "class label smoothing epsilon (YOLOv5 models)", type=float,
           default=None),
        _t(("--noautoanchor",), "noautoanchor",
           "accepted: ppmulti never recomputes anchors (they come from the model config)", action="store_true"),
        _t(("--cache",), "cache",
           "cache decoded training images: ram (bare --cache; one shared copy per node, not per rank) "
           "or disk (.npy files beside the images)", nargs="?", const="ram", default=None, choices=("ram", "disk")),
        _t(("--mosaic-buffer",), "mosaic_buffer",
           "mosaic tiles from each loader's last N images (default 0: the whole set, as YOLOv5); "
           "one image load per sample instead of four, but 2 ranks learned less per epoch that way",
           type=int, default=None, metavar="N"),
        _shared("noplots", "draw no pictures (results.png, labels.jpg, confusion_matrix.png, ...)"),
        _shared("multi_scale", "every step a random size in [0.5, 1.5] x imgsz (multiples of 32), the same on every "
                               "rank; the batch is resized on the device"),
        _t(("--image-weights",), "image_weights",
           "draw each epoch's images by class weights (rare classes and classes with a low mAP more "
           "often), the same draw on every rank, then sharded", action="store_true"),
        _shared("rect", "rectangular training: no mosaic, no shuffle, images in aspect-ratio order, each batch "
                        "letterboxed to its own stride-aligned shape (YOLOv5 data yamls, YOLOv5 reader)"),
        # --- --evolve (ppmulti/procs/runs/evolve_run.py) ---
        _t(("--evolve",), "evolve",
           "evolve hyperparameters for N generations (default 300) in PROJECT/NAME (runs/evolve/exp); "
           "the same command resumes; ppmulti evolve runs one worker per device",
           type=int, nargs="?", const=300, default=None, metavar="N"),
        _shared("storage", "with --evolve: Optuna storage of the population (default "
                           "sqlite:///PROJECT/NAME/evolve.db; postgresql://user@host/db shares it across machines)"),
        # YOLOv5 train.py flags that ppmulti does not implement, with what they do there; each fails by name
        refusal("train", ("--quad",), "the quad dataloader", action="store_true"),
        refusal("train", ("--bucket",), "gsutil dataset buckets"),
        refusal("train", ("--upload_dataset",), "W&B dataset upload", nargs="?", const=True),
        refusal("train", ("--bbox_interval",), "W&B bounding-box logging", type=int),
        refusal("train", ("--artifact_alias",), "W&B artifacts"),
        refusal("train", ("--entity",), "W&B entity"),
        refusal("train", ("--local_rank", "--local-rank"),
                "torch.distributed.launch's rank flag (ppmulti launch sets ranks itself)", type=int),
        refusal("train", ("--ndjson-console",), "NDJSON logging", action="store_true"),
        refusal("train", ("--ndjson-file",), "NDJSON logging", action="store_true"),
        refusal("train", ("--evolve_population",), "evolution seeded from a population directory"),
        refusal("train", ("--resume_evolve",), "resuming evolution from a csv (ppmulti evolve resumes by itself)"),
    )),
)


def refused(flag: Flag) -> bool:
    """Whether the row is a flag train refuses by name (not in the parser)."""
    return flag.refuses("train")


# spelling -> why, of each refused YOLOv5 flag
UNSUPPORTED: dict[str, str] = refusals(TRAIN, "train")


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
    groups: dict = {"": p}   # group title -> where its rows go, made in the table's order
    for flag in TRAIN:
        if not refused(flag):
            if flag.group not in groups:
                groups[flag.group] = p.add_argument_group(flag.group)
            flag.add_to(groups[flag.group])
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
