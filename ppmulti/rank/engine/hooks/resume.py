"""Resume: find the checkpoint to continue (``--resume``, or a launch restart's marker) and restore from it."""

from __future__ import annotations

import logging
from pathlib import Path

from ppmulti.common.rundir import RUN_DIR_MARKER
from ppmulti.rank.engine import checkpoint as ckpt
from ppmulti.rank.engine.hooks.base import Hook
from ppmulti.rank.engine.lr import Trained

log = logging.getLogger("ppmulti")


class ResumeHook(Hook):
    """Built with the trainer, because the checkpoint decides the run directory and the global batch: a launch
    restarted by ``--max_restarts`` carries on the run its first start recorded in the launch directory
    (RUN_DIR_MARKER), else ``--resume`` names it. ``before_train`` then restores the model, optimizer, lr
    schedule, loop counters, random state and every hook's own state. Keeps no state of its own."""

    priority = 20   # after the EMA exists (its state is restored here), before the hooks that read the epoch

    def __init__(self, opts) -> None:
        self.restart_note = continue_after_restart(opts)   # may point opts.resume / opts.output at that run
        self.path = ckpt.resolve_resume(opts.resume) if opts.resume else None
        self.payload = ckpt.load_state(self.path) if self.path else None

    @property
    def trained(self) -> Trained | None:
        """The batch plan the resumed run was trained with (None: not resuming); the builder keeps its
        effective batch (engine.lr.plan_batch)."""
        if self.payload is None:
            return None
        train = self.payload["train"]
        return Trained(int(train["global_batch"]), int(train["world_size"]), int(train.get("accumulate", 1)))

    @property
    def run_dir(self) -> Path | None:
        return None if self.path is None else self.path.parent.parent

    def before_train(self, trainer) -> None:
        if self.payload is None:
            return
        path, payload = self.path, self.payload
        ckpt.check_shapes(trainer.model, payload["model"], str(path))
        trainer.model.set_state_dict(payload["model"])
        trainer.optimizer.set_state_dict(payload["optimizer"])
        if payload.get("lr") is not None and hasattr(trainer.lr, "set_state_dict"):
            trainer.lr.set_state_dict(payload["lr"])
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


def continue_after_restart(opts) -> str | None:
    """In a launch restarted by ``--max_restarts``, carry on the run the first start began: resume from
    its last checkpoint (or start it again in the same directory if none was written yet)."""
    from ppmulti.common.envvars import launch_record

    record = launch_record()
    marker = Path(record.directory or "", RUN_DIR_MARKER)
    if record.directory is None or record.restart == 0 or not marker.is_file():
        return None
    run_dir = Path(marker.read_text().strip())
    if (run_dir / "weights" / ("last" + ckpt.STATE)).is_file():
        opts.resume = str(run_dir)
        return f"launch restart {record.restart}: resuming {run_dir} from its last checkpoint"
    opts.output, opts.exist_ok, opts.resume = str(run_dir), True, None
    return f"launch restart {record.restart}: no checkpoint in {run_dir} yet, starting it again"


def record_run_dir(run_dir: Path) -> None:
    """The first start of a launch notes its run directory, so a restart continues the same run. Every node
    keeps its own launch directory, so local rank 0 of each node notes it (all ranks know it by then): a rank
    on another node then resumes from the same checkpoint as rank 0 instead of starting at epoch 0."""
    from ppmulti.common.atomic import atomic_write_text
    from ppmulti.common.envvars import launch_record, worker_info

    record = launch_record()
    if record.directory and record.restart == 0 and worker_info().local_rank == 0:
        atomic_write_text(Path(record.directory, RUN_DIR_MARKER), str(run_dir.resolve()) + "\n")
