"""Why 2 ranks learn less per epoch than 1 process: the real trainer's trajectories, 1 process against 2 ranks.

    python bench/rank_gap.py --data DIR/data.yaml [--img 128] [--epochs 10] [--cases p1,r2_sync,...]
        [--weights W]        start every case from W (a trained model) instead of from scratch
        [--seeds 0,1,2]      each case once per seed: mean train loss, val loss and mAP50 instead of trajectories

Each case is tools/train.py's YOLOv5 command line (``--cfg yolov5n.yaml --weights '' --hyp H --batch 16 --device cpu
--seed 0 --noval --noplots``), parsed and built by the same code as tools/train.py, with a recorder added: every
step's images, losses, lr, momentum, bias lr, optimizer step and gradient norm on every rank, the first optimizer
step's gradient, the final weights and EMA. ``H`` is hyp.scratch-low.yaml with every augmentation at 0 ("noaug") or
unchanged ("aug", with ``--mosaic-buffer 64``: each mosaic's extra tiles from its loader's last 64 images).
Cases (all at global batch 16, 1 or 2 CPU ranks):

    p1           1 process, noaug                       the reference
    p1_again     the same again                         run-to-run noise of the reference (0 = deterministic)
    p1_split     1 process computing the loss as 2 ranks do (the mean of each half's YOLOv5Loss)
    r2_sync      2 ranks, --sync-bn, noaug              the deterministic comparison
    r2_bn        2 ranks, per-rank BatchNorm, noaug     suspect: BatchNorm statistics per rank
    p1_aug       1 process, augmentation on             reference with augmentation
    p1_aug_s1    1 process, aug, other augmentation draws (same initial weights)   the draws' own spread
    r2_sync_aug  2 ranks, --sync-bn, aug                suspect: per-rank augmentation seeds
    r2_bn_aug    2 ranks, per-rank BatchNorm, aug       a 2-rank run without --sync-bn
    p1_nomosaic, r2_sync_nomosaic    aug without the mosaic (hyp mosaic 0)
    p1_split_aug 1 process, aug, computing the loss as 2 ranks do   YOLOv5's DDP loss arithmetic with the mosaic
    p1_uniform, r2_sync_uniform      aug with --mosaic-buffer 0 (the default): the mosaic's 3 extra tiles drawn
                 from the whole set (YOLOv5's draw) instead of from each loader's last 64 images

Writes bench/results/rank_gap.json (or --json; one entry per kind of measurement) and prints one line per
comparison. ``--worker OUT`` is the per-rank mode the cases run in (started directly, or under
``ppmulti launch --nproc_per_node 2``). Weights and losses do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AUG_KEYS = ("hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear", "perspective", "flipud", "fliplr",
            "mosaic", "mixup", "copy_paste")


# ---------------------------------------------------------------- worker (one rank)
def split_loss(parts: int) -> None:
    """One process computes YOLOv5Loss as ``parts`` ranks do: the mean of each part's loss (each part's box and
    class terms a mean over its own matches), what the gradient all-reduce averages."""
    from ppmulti.rank.models.yolov5_loss import YOLOv5Loss

    whole = YOLOv5Loss.forward

    def forward(self, head_outs, targets, anchors, strides):
        batch = int(head_outs[0].shape[0])
        size = batch // parts
        outs = []
        for i in range(parts):
            cut = slice(i * size, (i + 1) * size)
            part = {k: v[cut] if hasattr(v, "shape") and len(v.shape) and int(v.shape[0]) == batch else v
                    for k, v in targets.items()}
            outs.append(whole(self, [o[cut] for o in head_outs], part, anchors, strides))
        return {k: sum(o[k] for o in outs) / parts for k in outs[0]}

    YOLOv5Loss.forward = forward


def worker(out: Path, train_argv: list[str], aug_seed_offset: int, parts: int = 1) -> int:
    import numpy as np

    from ppmulti.common.train_flags import parse
    from ppmulti.rank import compat, dist, entry
    from ppmulti.rank.engine import builder
    from ppmulti.rank.engine.hooks.base import Hook
    from ppmulti.rank.engine.trainer import Trainer

    if aug_seed_offset:   # other augmentation draws, the same initial weights (seeded apart, by opts.seed)
        original = builder._Build._seed
        builder._Build._seed = lambda self, seed: original(self, seed + aug_seed_offset)

    if parts > 1:
        split_loss(parts)
    steps: list[dict] = []
    saved: dict = {}

    class Recording(Trainer):
        def run_step(self, data, epoch, step_optimizer=True):
            ids = np.asarray(data["im_id"]).reshape(-1).tolist() if "im_id" in data else []
            if "pad_gt_mask" in data:   # what the augmentation made of them: boxes per image, their mean area
                valid = np.asarray(data["pad_gt_mask"]).reshape(len(ids) or 1, -1) > 0
                boxes = np.asarray(data["gt_bbox"]).reshape(valid.shape[0], -1, 4)[valid]
                data_stats = {"boxes_per_image": float(valid.sum() / valid.shape[0]),
                              "box_area": float(np.mean((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])))
                              if len(boxes) else 0.0,
                              "pixel_mean": float(np.asarray(data["image"], dtype=np.float32).mean())}
            else:
                data_stats = {}
            steps.append({"epoch": epoch, "global_step": self.state.global_step, "im_id": ids,
                          "lr_before": float(self.optimizer.get_lr()),
                          "momentum": compat.optimizer_momentum(self.optimizer), "stepped": bool(step_optimizer),
                          **data_stats})
            outputs, lr = super().run_step(data, epoch, step_optimizer)
            rec = steps[-1]
            rec.update({k: float(np.asarray(v).reshape(-1)[0]) for k, v in outputs.items() if k.startswith("loss")})
            rec["lr"] = float(lr)
            return outputs, lr

    class GradProbe(Hook):
        priority = 1

        def before_train(self, trainer):
            names = [n for n, p in trainer.model.named_parameters() if not p.stop_gradient]
            params = [p for _, p in trainer.model.named_parameters() if not p.stop_gradient]
            bias = [p for n, p in trainer.model.named_parameters() if n.endswith("bias")]
            optim_step = trainer.optim.step   # engine.optim_step.OptimStep: clips, steps, zeroes
            import random

            # the augmentation streams this rank starts with (python's and numpy's; loader workers seed from numpy's)
            saved["rng"] = [int(np.random.get_state()[1][:4].sum()), int(sum(random.getstate()[1][:4]))]
            saved["init"] = {k: np.asarray(v.numpy()) for k, v in trainer.model.state_dict().items()}

            def step():
                grads = [np.zeros(p.shape, np.float32) if p.grad is None else np.asarray(p.grad.numpy())
                         for p in params]
                flat = np.concatenate([g.reshape(-1) for g in grads])
                steps[-1]["grad_norm"] = float(np.linalg.norm(flat))
                steps[-1]["bias_lr_factor"] = float(bias[0].optimize_attr.get("learning_rate", 1.0)) if bias else None
                if "grad0" not in saved:
                    saved["grad0"] = flat
                    saved["grad_names"] = names
                return optim_step()

            trainer.optim.step = step

    args = parse(train_argv)
    args.opt = list(args.opt or []) + [["use_gpu=false"]]
    options = entry.resolve(args)
    trainer = builder.build_trainer(options, trainer_class=Recording)
    trainer._add(GradProbe())
    trainer.train()
    rank = dist.rank()
    pnames = {n for n, _ in trainer.model.named_parameters()}
    weights = {k: np.asarray(v.numpy()) for k, v in trainer.model.state_dict().items()}
    arrays = {f"w:{k}": v for k, v in weights.items()}
    if trainer.ema is not None:
        arrays.update({f"ema:{k}": np.asarray(v.numpy()) for k, v in trainer.ema.state_dict.items()})
    arrays["grad0"] = saved.get("grad0", np.zeros(0))
    arrays.update({f"init:{k}": v for k, v in saved["init"].items()})
    np.savez(out / f"rank{rank}.npz", **arrays)
    reg = (trainer.cfg["OptimizerBuilder"].get("regularizer") or {}).get("factor")
    meta = {"rank": rank, "world": trainer.world, "steps": steps, "params": sorted(pnames),
            "batch": trainer.batch.describe(), "accumulate": trainer.batch.accumulate,
            "warmup_batches": trainer.accumulation.ramp, "steps_per_epoch": trainer.steps_per_epoch,
            "lr_plan": trainer.lr_plan.describe() if trainer.lr_plan else None, "weight_decay": reg,
            "ema_step": getattr(trainer.ema, "step", None), "optimizer_steps": trainer.optimizer_steps,
            "grad_names": saved.get("grad_names", []), "rng_at_start": saved.get("rng"),
            "grad_sizes": [int(np.prod(p.shape)) for n, p in trainer.model.named_parameters() if not p.stop_gradient],
            "metrics": {k: trainer.final_metrics.get(k) for k in ("mAP50", "mAP50_95", "val_losses")}}
    (out / f"rank{rank}.json").write_text(json.dumps(meta))
    return 0


# ---------------------------------------------------------------- cases
def write_hyp(path: Path, aug: bool) -> Path:
    import yaml

    hyp = yaml.safe_load((REPO / "configs" / "hyps" / "hyp.scratch-low.yaml").read_text())
    if not aug:
        hyp.update({k: 0.0 for k in AUG_KEYS})
    elif aug == "nomosaic":   # the rest of the augmentation (letterbox + affine, HSV, flips) as it is
        hyp["mosaic"] = 0.0
    # aug == "uniform": the hyps as they are
    path.write_text(yaml.safe_dump(hyp))
    return path


def train_argv(args, hyp: Path, out: Path, sync: bool) -> list[str]:
    argv = ["--data", args.data, "--cfg", "yolov5n.yaml", "--weights", args.weights, "--hyp", str(hyp),
            "--img", str(args.img), "--epochs", str(args.epochs), "--batch", "16", "--device", "cpu",
            "--workers", str(args.workers), "--seed", str(args.seed), "--noval", "--noplots",
            "--output", str(out / "run"), "--exist-ok"]
    return argv + (["--sync-bn"] if sync else [])


CASES = {   # name: (ranks, sync-bn, aug, augmentation seed offset[, loss parts])
    "p1": (1, False, False, 0), "p1_again": (1, False, False, 0), "p1_split": (1, False, False, 0, 2),
    "r2_sync": (2, True, False, 0),
    "r2_bn": (2, False, False, 0), "p1_aug": (1, False, True, 0), "p1_aug_s1": (1, False, True, 1),
    "r2_sync_aug": (2, True, True, 0), "r2_bn_aug": (2, False, True, 0),
    "p1_nomosaic": (1, False, "nomosaic", 0), "r2_sync_nomosaic": (2, True, "nomosaic", 0),
    "p1_split_aug": (1, False, True, 0, 2),
    "p1_uniform": (1, False, "uniform", 0), "r2_sync_uniform": (2, True, "uniform", 0),
}


def run_case(args, name: str, work: Path) -> Path:
    ranks, sync, aug, offset, *parts = CASES[name]
    out = work / name
    if args.reuse and (out / "rank0.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    hyp = write_hyp(work / f"hyp_{aug if isinstance(aug, str) else 'aug' if aug else 'noaug'}.yaml", aug)
    me = [str(Path(__file__).resolve()), "--worker", str(out), "--aug-seed-offset", str(offset),
          "--split-loss", str(parts[0] if parts else 1), "--"]
    rest = train_argv(args, hyp, out, sync)
    if aug is True:   # the mosaic's extra tiles from each loader's last 64 images, as these cases were measured
        rest += ["--mosaic-buffer", "64"]
    elif aug == "uniform":   # from the whole set (the default, spelled out)
        rest += ["--mosaic-buffer", "0"]
    if ranks == 1:
        cmd = [sys.executable, *me, *rest]
    else:
        cmd = [sys.executable, "-m", "ppmulti.cli", "launch", "--nproc_per_node", str(ranks), "--device", "cpu",
               *me, *rest]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDLE_")}
    t0 = time.time()
    done = subprocess.run(cmd, cwd=str(work), env=env, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit(f"case {name} failed ({done.returncode})")
    print(f"  {name}: {time.time() - t0:.0f} s", file=sys.stderr)
    return out


def load(out: Path):
    import numpy as np

    ranks = sorted(out.glob("rank*.json"))
    metas = [json.loads(p.read_text()) for p in ranks]
    arrays = [dict(np.load(out / f"rank{m['rank']}.npz")) for m in metas]
    return metas, arrays


def compare(ref_dir: Path, other_dir: Path) -> dict:
    """The other run against the reference: same images per step, loss/lr/momentum per step, first-step
    gradient, final weights and EMA (relative to how far the reference's weights moved), BN statistics."""
    import numpy as np

    (ref_meta,), (ref_arr,) = load(ref_dir)
    metas, arrays = load(other_dir)
    n = len(ref_meta["steps"])
    steps = [m["steps"] for m in metas]
    same_images = all(sorted(ref_meta["steps"][i]["im_id"]) == sorted(sum((s[i]["im_id"] for s in steps), []))
                      for i in range(n))
    loss_ref = np.array([s["loss"] for s in ref_meta["steps"]])
    loss_other = np.mean([[s["loss"] for s in st] for st in steps], axis=0)
    lr_diff = max(abs(a["lr"] - b["lr"]) for a, b in zip(ref_meta["steps"], steps[0]))
    mom_diff = max(abs((a["momentum"] or 0) - (b["momentum"] or 0)) for a, b in zip(ref_meta["steps"], steps[0]))
    stepped_same = [a["stepped"] for a in ref_meta["steps"]] == [b["stepped"] for b in steps[0]]
    params = ref_meta["params"]

    def vec(arr, prefix, names):
        return np.concatenate([arr[f"{prefix}:{k}"].reshape(-1).astype(np.float64) for k in names])

    bn_stats = sorted(k[2:] for k in ref_arr if k.startswith("w:") and k[2:] not in params)
    w_ref, w_oth = vec(ref_arr, "w", params), vec(arrays[0], "w", params)
    out = {"same_images_per_step": same_images, "steps": n, "stepped_same": stepped_same,
           "max_lr_diff": lr_diff, "max_momentum_diff": mom_diff,
           "loss_first_rel_diff": float(abs(loss_other[0] - loss_ref[0]) / abs(loss_ref[0])),
           "loss_max_rel_diff": float(np.max(np.abs(loss_other - loss_ref) / np.abs(loss_ref))),
           "first_batch_loss_apart_1e-3": next((i for i in range(n) if abs(loss_other[i] - loss_ref[i])
                                                > 1e-3 * abs(loss_ref[i])), None),
           "loss_last_epoch_ref": float(loss_ref[-ref_meta["steps_per_epoch"]:].mean()),
           "loss_last_epoch": float(loss_other[-ref_meta["steps_per_epoch"]:].mean()),
           "grad0_rel_diff": float(np.linalg.norm(arrays[0]["grad0"] - ref_arr["grad0"])
                                   / np.linalg.norm(ref_arr["grad0"])),
           "weights_rel_diff": float(np.linalg.norm(w_oth - w_ref) / np.linalg.norm(w_ref)),
           "ema_step": [m["ema_step"] for m in metas], "ema_step_ref": ref_meta["ema_step"],
           "warmup_batches": [ref_meta["warmup_batches"], metas[0]["warmup_batches"]],
           "weight_decay": [ref_meta["weight_decay"], metas[0]["weight_decay"]],
           "accumulate": [ref_meta["accumulate"], metas[0]["accumulate"]],
           "mAP50": [ref_meta["metrics"].get("mAP50"), metas[0]["metrics"].get("mAP50")]}
    moved = np.linalg.norm(w_ref - vec(ref_arr, "init", params))
    out["weights_diff_over_moved"] = float(np.linalg.norm(w_oth - w_ref) / moved)
    if any(k.startswith("ema:") for k in ref_arr):
        e_ref, e_oth = vec(ref_arr, "ema", params), vec(arrays[0], "ema", params)
        out["ema_rel_diff"] = float(np.linalg.norm(e_oth - e_ref) / np.linalg.norm(e_ref))
    if bn_stats:
        b_ref, b_oth = vec(ref_arr, "w", bn_stats), vec(arrays[0], "w", bn_stats)
        out["bn_stats_rel_diff"] = float(np.linalg.norm(b_oth - b_ref) / np.linalg.norm(b_ref))
    if len(arrays) > 1:
        out["rank1_vs_rank0_weights"] = float(np.linalg.norm(vec(arrays[1], "w", params) - w_oth)
                                              / np.linalg.norm(w_oth))
    return out


def losses(out: Path) -> dict:
    """A run's train loss over its last epoch (the mean of its ranks') and its final validation loss."""
    import numpy as np

    metas, _ = load(out)
    per_epoch = metas[0]["steps_per_epoch"]
    train = float(np.mean([[s["loss"] for s in m["steps"][-per_epoch:]] for m in metas]))
    val = metas[0]["metrics"].get("val_losses") or {}
    return {"train_loss_last_epoch": train, "val_loss": float(sum(val.values())) if val else None,
            "mAP50": metas[0]["metrics"].get("mAP50")}


def by_seed(args, names: list[str]) -> int:
    import statistics

    rows: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp).resolve()
        for seed in [int(x) for x in args.seeds.split(",")]:
            args.seed = seed
            for name in names:
                rows[name].append({"seed": seed, **losses(run_case(args, name, work / f"seed{seed}"))})
    summary = {}
    for name, runs in rows.items():
        train = [r["train_loss_last_epoch"] for r in runs]
        val = [r["val_loss"] for r in runs if r["val_loss"] is not None]
        maps = [r["mAP50"] for r in runs if r["mAP50"] is not None]
        summary[name] = {"runs": runs, "train_loss_mean": statistics.mean(train), "mAP50_mean": statistics.mean(maps),
                         "train_loss_sd": statistics.stdev(train) if len(train) > 1 else 0.0,
                         "val_loss_mean": statistics.mean(val) if val else None,
                         "val_loss_sd": statistics.stdev(val) if len(val) > 1 else 0.0}
        print(f"{name}: train loss {summary[name]['train_loss_mean']:.4f} +- {summary[name]['train_loss_sd']:.4f}, "
              f"val loss {summary[name]['val_loss_mean']:.5f} +- {summary[name]['val_loss_sd']:.5f}, "
              f"mAP50 {summary[name]['mAP50_mean']:.4f} ({', '.join(f'{m:.3f}' for m in maps)})")
    _write(args, f"by_seed {','.join(names)}", summary)
    return 0


def _write(args, kind: str, results: dict) -> None:
    """Keep this kind of measurement ("trajectories", "trajectories_from_weights", "by_seed CASES") in the JSON
    file beside the others."""
    from ppmulti.common.atomic import atomic_write_text

    record = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": " ".join(["python", "bench/rank_gap.py", *sys.argv[1:]]),
              "load_average_1min": round(os.getloadavg()[0], 2), "results": results}
    path = Path(args.json)
    old = json.loads(path.read_text()) if path.is_file() else {}
    old[kind] = record
    atomic_write_text(path, json.dumps(old, indent=1) + "\n")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        p = argparse.ArgumentParser()
        p.add_argument("--worker", type=Path)
        p.add_argument("--aug-seed-offset", type=int, default=0)
        p.add_argument("--split-loss", type=int, default=1)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        a = p.parse_args()
        rest = a.rest[1:] if a.rest[:1] == ["--"] else a.rest
        return worker(a.worker, rest, a.aug_seed_offset, a.split_loss)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="a YOLO data.yaml (ppmulti data demo DIR --format yolo --train 64)")
    p.add_argument("--img", type=int, default=128)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weights", default="", help="start from these weights (default: from scratch)")
    p.add_argument("--seeds", help="e.g. 0,1,2: run --cases once per seed and compare their mean train and val "
                                   "losses (instead of the trajectories of one seed)")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--work", help="keep the runs here (default: a temporary directory)")
    p.add_argument("--reuse", action="store_true", help="with --work: compare the runs found there, run the others")
    p.add_argument("--json", default=str(REPO / "bench" / "results" / "rank_gap.json"))
    args = p.parse_args()
    args.data = str(Path(args.data).resolve())
    names = [c for c in args.cases.split(",") if c]
    if args.seeds:
        return by_seed(args, names)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp).resolve()
        dirs = {name: run_case(args, name, work) for name in names}
        results = {}
        pairs = [(name, "p1_nomosaic" if CASES[name][2] == "nomosaic" else "p1_aug" if CASES[name][2] else "p1")
                 for name in names]
        pairs.append(("r2_sync", "p1_split"))   # 2 ranks against one process computing the ranks' loss
        for name, ref in pairs:
            if name == ref or ref not in dirs or name not in dirs:
                continue
            results[f"{name} vs {ref}"] = compare(dirs[ref], dirs[name])
            print(f"{name} vs {ref}: " + json.dumps(results[f"{name} vs {ref}"]))
    _write(args, "trajectories_from_weights" if args.weights else "trajectories", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
