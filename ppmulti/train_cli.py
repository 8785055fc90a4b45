"""The training command line shared by tools/train.py, ppmulti demo and launched ranks: flags -> a run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ppmulti.engine.trainer import TrainOptions
from ppmulti.errors import UserError, exit_on_user_error


def add_train_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", help="ppdet YAML config, e.g. configs/yolo.yml")
    p.add_argument("-o", "--opt", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override config values, e.g. -o epoch=10 TrainReader.batch_size=4")
    p.add_argument("--eval", action="store_true", help="evaluate every snapshot_epoch and keep the best weights")
    p.add_argument("--resume", metavar="PATH", nargs="?", const=True, default=None,
                   help="a run directory or weights/last to continue from; bare --resume takes the newest run")
    p.add_argument("--batch", "--batch-size", "--batch_size", dest="batch", type=int,
                   help="GLOBAL batch size, split evenly across ranks (e.g. 64)")
    p.add_argument("--epochs", type=int, help="number of epochs (overrides the config's epoch)")
    p.add_argument("--output", metavar="DIR", help="run directory (default: save_dir/<config name>, numbered)")
    p.add_argument("--exist-ok", "--exist_ok", dest="exist_ok", action="store_true",
                   help="reuse the run directory instead of numbering a new one")
    p.add_argument("--sync-bn", "--sync_bn", dest="sync_bn", action="store_true",
                   help="convert BatchNorm to SyncBatchNorm across ranks (GPU only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, help="data loader worker processes per rank")
    p.add_argument("--weights", metavar="PDPARAMS", help="initial weights (.pdparams); '' trains from scratch")
    p.add_argument("--device", help="cpu, one GPU id (0) or several (0,1,2,3): several start one rank per GPU")
    p.add_argument("--nproc", type=int, help="with --device cpu: number of CPU ranks to start (gloo)")


def options_from_args(args: argparse.Namespace) -> TrainOptions:
    from ppmulti import yolo_flags

    overrides = [item for group in (args.opt or []) for item in group]
    config = args.config
    yolo_style = yolo_flags.yolo_style(args)
    if getattr(args, "cfg", None):
        if args.config:
            raise UserError(f"give the model once: -c {args.config} or --cfg {args.cfg}, not both")
        config = yolo_flags.resolve_cfg(args.cfg).config
    if not config:
        raise UserError("no config given: pass -c CONFIG (e.g. -c configs/yolo.yml) or --cfg MODEL (e.g. --cfg yolov5s)")
    weights = args.weights
    if weights == "":
        overrides.append("pretrain_weights=")   # YOLOv5's --weights '': from scratch
        weights = None
    output = args.output or yolo_flags.run_output(getattr(args, "project", None), getattr(args, "name", None))
    validate = args.eval or (yolo_style and not getattr(args, "noval", False))
    if getattr(args, "patience", None) and not validate:
        raise UserError("--patience needs validation every epoch: drop --noval (or add --eval)")
    resume = args.resume
    if resume is True:
        resume = str(newest_run(output))
    return TrainOptions(config=config, overrides=overrides, validate=validate, resume=resume,
                        batch=args.batch, epochs=args.epochs, output=output, exist_ok=args.exist_ok,
                        sync_bn=args.sync_bn, seed=args.seed, workers=args.workers, weights=weights,
                        config_edit=yolo_flags.config_edit(args) if yolo_flags.wants_edit(args) else None,
                        nosave=getattr(args, "nosave", False), save_period=getattr(args, "save_period", -1),
                        patience=getattr(args, "patience", None), freeze=getattr(args, "freeze", None),
                        noplots=getattr(args, "noplots", False))


def newest_run(output: str | None) -> Path:
    """Bare ``--resume``: the most recently written ``weights/last`` under the usual run roots."""
    roots = [Path(output).parent] if output else [Path("runs/train"), Path("output")]
    found = [p for root in roots if root.is_dir() for p in root.glob("*/weights/last.pdstate")]
    if not found:
        raise UserError(f"--resume without a path: no run with weights/last.pdstate under "
                        f"{' or '.join(map(str, roots))}; pass the run directory")
    return max(found, key=lambda p: p.stat().st_mtime).parent.parent


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tools/train.py",
                                description="Train a detector from a ppdet config (one process, or one rank of a launch).")
    add_train_flags(p)
    from ppmulti.yolo_flags import add_yolov5_flags

    add_yolov5_flags(p)
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
    from ppmulti.paths import TRAIN_SCRIPT

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


def _check_gpu_ids(ids: list[int]) -> None:
    import paddle

    count = paddle.device.cuda.device_count() if paddle.is_compiled_with_cuda() else 0
    bad = [i for i in ids if i >= count]
    if bad:
        raise UserError(f"--device {','.join(map(str, ids))}: GPU {bad[0]} does not exist "
                        f"(this machine has {count} usable GPU(s)); use --device cpu or ids below {count}")


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    from ppmulti import dist
    from ppmulti.engine.trainer import train
    from ppmulti.env import in_paddle_worker

    # --- --evolve N (ppmulti/runs/evolve_run.py): candidates trained as subprocesses by the evolve engine ---
    if getattr(args, "evolve", None) is not None:
        from ppmulti.runs.evolve_run import evolve_from_train

        return evolve_from_train(args, list(sys.argv[1:] if argv is None else argv))
    # --- end --evolve ---
    kind, ids, nranks = parse_device(args.device, args.nproc)
    if kind in ("cpu", "gpu"):
        args.opt = list(args.opt or []) + [[f"use_gpu={'true' if kind == 'gpu' else 'false'}"]]
    options = options_from_args(args)   # checks the flags before any process starts
    if not in_paddle_worker():
        if kind == "gpu":
            _check_gpu_ids(ids)
        if nranks > 1:
            # never single-process DataParallel: one process per device, started by Paddle's launcher
            from ppmulti.launch.command import main as launch_main

            return launch_main(relaunch_argv(list(sys.argv[1:] if argv is None else argv), kind, ids, nranks))
        if kind == "gpu":
            from ppmulti.env import set_visible_gpu

            set_visible_gpu(ids[0])
    metrics = train(options)
    if dist.is_main():
        print(json.dumps({k: metrics[k] for k in ("mAP50", "mAP50_95", "run_dir") if k in metrics}))
    return 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Parse, refusing leftovers by name (a YOLOv5 flag ppmulti lacks is never silently ignored)."""
    from ppmulti.yolo_flags import reject_unknown

    args, extra = build_parser().parse_known_args(argv)
    reject_unknown(extra)
    return args


def main(argv: list[str] | None = None) -> int:
    return exit_on_user_error(lambda a: run(parse(a), a), argv)


if __name__ == "__main__":
    sys.exit(main())
