"""Resume: restore a run from the checkpoint engine.resume_plan decided on (``--resume``, a launch restart's
marker; ppmulti's own or a PaddleDetection checkpoint given with ``-r``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ppmulti.common.errors import UserError
from ppmulti.common.rundir import RUN_DIR_MARKER
from ppmulti.rank.engine import checkpoint as ckpt
from ppmulti.rank.engine.hooks.base import Hook
from ppmulti.rank.engine.resume_plan import PPDET_EMA, PPDET_OPTIMIZER, PpdetCheckpoint, decide, look

log = logging.getLogger("ppmulti")

NAME_TABLE = "StructuredToParameterName@@"   # paddle.save's record of each weight's parameter name


class ResumeHook(Hook):
    """Built with the trainer, because the checkpoint decides the run directory and the global batch: what is
    resumed is decided once (engine.resume_plan: a launch restarted by ``--max_restarts`` carries on the run its
    first start recorded in the launch directory, else ``--resume`` names it) and kept as ``plan``.
    ``before_train`` then restores the model, optimizer, lr schedule (planned again for an extended run), loop
    counters, random state and every hook's own state. Its state in a checkpoint: the epochs the run is planned
    for, so that a later ``--resume`` with more knows it extends the run (even a restart of the extending start).

    ``epochs``: the epochs this start trains to (the builder's; None for a Trainer from parts: its ``epoch``)."""

    priority = 20   # after the EMA exists (its state is restored here), before the hooks that read the epoch
    name = "resume"

    def __init__(self, opts, epochs: int | None = None) -> None:
        from ppmulti.common.envvars import launch_record

        self.payload = None
        self.epochs = epochs
        record = launch_record()
        self.plan = decide(look(opts.resume, record.restart, record.directory, self._load), epochs)
        self.path = None if self.plan.checkpoint is None else Path(
            self.plan.checkpoint + ckpt.WEIGHTS if self.plan.ppdet else self.plan.checkpoint)
        self.ppdet = PpdetCheckpoint(self.plan.checkpoint) if self.plan.ppdet else None

    def _load(self, path: str) -> dict:
        self.payload = ckpt.load_state(path)   # loaded once: its counters decide, before_train restores the rest
        return self.payload

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.epochs is None else {"epochs": self.epochs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Read by the decision already (engine.resume_plan.look); this start's epochs are kept."""

    @property
    def run_dir(self) -> Path | None:
        return None if self.plan.run_dir is None else Path(self.plan.run_dir)

    def before_train(self, trainer) -> None:
        self.epochs = int(trainer.cfg["epoch"])
        if self.ppdet is not None:
            restore_ppdet(trainer, self.ppdet)
            self.ppdet = None
            return
        if self.payload is None:
            return
        path, payload = self.path, self.payload
        ckpt.check_shapes(trainer.model, payload["model"], str(path))
        trainer.model.set_state_dict(payload["model"])
        trainer.optimizer.set_state_dict(payload["optimizer"])
        if payload.get("lr") is not None and hasattr(trainer.lr, "set_state_dict"):
            trainer.lr.set_state_dict(payload["lr"])
            if self.plan.extends and hasattr(trainer.lr, "step"):
                # the restored step on the schedule built for the new length: the next step's lr is that
                # schedule's, not the value the old one ended with
                trainer.lr.step(trainer.lr.last_epoch)
        states = ckpt.hook_states(payload)
        for hook in trainer.hooks:
            if hook.name and states.get(hook.name) is not None:
                hook.load_state_dict(states[hook.name])
        train = payload["train"]
        trainer.state = ckpt.TrainState.from_dict(train)
        ckpt.set_rng_state(payload.get("rng"))
        world, batch = trainer.world, trainer.batch
        trained = int(train["global_batch"]) * int(train.get("accumulate", 1))
        if train["world_size"] != world and trained == batch.effective_batch:
            log.warning("resuming a run of %d ranks on %d ranks: the effective batch stays %d (global batch %d, "
                        "%d per rank, x accumulate %d)", train["world_size"], world, batch.effective_batch,
                        batch.global_batch, batch.per_rank, batch.accumulate)
        elif train["world_size"] != world:
            log.warning("resuming a run of %d ranks on %d ranks", train["world_size"], world)
        if trained != batch.effective_batch:
            log.warning("resuming with effective batch %d instead of %d: lr rescaled to %s",
                        batch.effective_batch, trained,
                        "?" if trainer.lr_plan is None else f"{trainer.lr_plan.lr:.6g}")
        trainer.state.world_size, trainer.state.global_batch = world, batch.global_batch
        trainer.state.accumulate = batch.accumulate
        log.info("resumed from %s at epoch %d (step %d)", path, trainer.state.epoch, trainer.state.global_step)
        self.payload = None   # the weights now live in the model; free the copy


def record_run_dir(run_dir: Path) -> None:
    """The first start of a launch notes its run directory, so a restart continues the same run. Every node
    keeps its own launch directory, so local rank 0 of each node notes it (all ranks know it by then): a rank
    on another node then resumes from the same checkpoint as rank 0 instead of starting at epoch 0."""
    from ppmulti.common.atomic import atomic_write_text
    from ppmulti.common.envvars import launch_record, worker_info

    record = launch_record()
    if record.directory and record.restart == 0 and worker_info().local_rank == 0:
        atomic_write_text(Path(record.directory, RUN_DIR_MARKER), str(run_dir.resolve()) + "\n")


def restore_ppdet(trainer, found: PpdetCheckpoint) -> None:
    """Continue a PaddleDetection checkpoint as its ``resume_weights`` does: the model's weights (from .pdema
    when it exists, the .pdparams then seed the EMA), the optimizer's state (its keys renamed onto this
    process's parameter names through the name table paddle.save keeps), the epoch from the .pdopt's
    ``last_epoch`` (else the name) and the lr schedule at that epoch's step."""
    import paddle

    stem = found.stem
    params = paddle.load(stem + ckpt.WEIGHTS, keep_name_table=True)
    ema_file = Path(stem + PPDET_EMA)
    weights = paddle.load(str(ema_file), keep_name_table=True) if ema_file.is_file() else params
    # the .pdparams' table: with EMA PaddleDetection saves the model's own state_dict holding the EMA values (the
    # parameters' names), the .pdema a deep copy of it
    names = dict(params.pop(NAME_TABLE, None) or weights.pop(NAME_TABLE, None) or {})
    weights.pop(NAME_TABLE, None)
    ckpt.check_shapes(trainer.model, weights, stem + (PPDET_EMA if ema_file.is_file() else ckpt.WEIGHTS))
    own = trainer.model.state_dict()
    missing = [k for k in own if k not in weights]
    if missing:
        raise UserError(f"-r {stem}: {len(missing)} of the model's weights are not in the checkpoint (e.g. "
                        f"{missing[0]}); it was written for another config")
    trainer.model.set_state_dict(weights)
    opt_state = paddle.load(stem + PPDET_OPTIMIZER)
    last_epoch = opt_state.pop("last_epoch", None)
    epoch = int(last_epoch) if last_epoch is not None else found.name_epoch
    if epoch is None:
        raise UserError(f"-r {stem}: {Path(stem).name}{PPDET_OPTIMIZER} holds no last_epoch and the name gives "
                        f"none; resume from a numbered checkpoint (output/CONFIG/N)")
    renamed = rename_optimizer_state(opt_state, {k: own[k].name for k in own if k in names}, names)
    ppdet_steps = (opt_state.get("LR_Scheduler") or {}).get("last_epoch")
    trainer.optimizer.set_state_dict(renamed)
    from ppmulti.rank.engine.lr import optimizer_steps

    per_epoch = (trainer.steps_per_epoch if getattr(trainer, "lr_per_batch", False)
                 else optimizer_steps(trainer.steps_per_epoch, trainer.batch.accumulate))
    steps = epoch * per_epoch
    if trainer.lr is not None and hasattr(trainer.lr, "step"):
        trainer.lr.step(steps)   # the closed form at this step: this run's steps per epoch, whatever PaddleDetection's
    if trainer.ema is not None:
        trainer.ema.resume(params if ema_file.is_file() else weights,
                           int(ppdet_steps) if ppdet_steps is not None else steps)
    state = trainer.state
    state.epoch, state.global_step, state.step_in_epoch = epoch, epoch * trainer.steps_per_epoch, 0
    if epoch >= int(trainer.cfg["epoch"]):
        log.warning("-r %s: the checkpoint has %d of the run's %d epochs done, so nothing is left to train; give "
                    "more with --epochs N (or -o epoch=N)", stem, epoch, int(trainer.cfg["epoch"]))
    moments = sum(1 for v in renamed.values() if hasattr(v, "shape"))
    ema_note = " (EMA from .pdparams)" if ema_file.is_file() and trainer.ema is not None else ""
    log.info("resumed PaddleDetection checkpoint %s at epoch %d: weights%s, optimizer state (%d tensors), lr at "
             "step %d%s", stem, epoch, ema_note, moments, steps, "" if ppdet_steps in (None, steps) else
             f" (PaddleDetection's schedule was at step {ppdet_steps}: another batch or world size)")


def rename_optimizer_state(state: dict, new_names: dict[str, str], old_names: dict[str, str]) -> dict:
    """An optimizer state_dict keyed by another process's parameter names (``conv2d_3.w_0_moment1_0``), keyed
    by this one's: ``old_names`` and ``new_names`` map the model's weight keys to each process's parameter
    names. Paddle names parameters in creation order, so the two differ whenever anything else was built first."""
    mapping = {old_names[k]: new_names[k] for k in new_names if k in old_names}
    prefixes = sorted(mapping, key=len, reverse=True)

    def rename(key: str) -> str:
        for old in prefixes:
            if key.startswith(old + "_"):
                return mapping[old] + key[len(old):]
        return key

    out = {}
    for key, value in state.items():
        if key == "master_weights" and isinstance(value, dict):
            out[key] = {mapping.get(k, k): v for k, v in value.items()}
        elif key == "LR_Scheduler":
            out[key] = value
        else:
            out[rename(key)] = value
    return out
