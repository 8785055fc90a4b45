"""Resume, decided once: what a run continues (a ppmulti run's last checkpoint, a PaddleDetection checkpoint, a
launch restart's run, or nothing), from which file, in which run directory, with which batch plan, for how many
epochs, and whether it extends a run to more epochs than it was planned for (the lr schedule then re-planned).

``decide`` is pure: the facts it reads (``Found``) are gathered by ``look`` (files, the launch's restart marker,
the checkpoint's counters); ``locate`` is the part the launching process needs before any rank starts (which
run a bare ``--resume`` means, whose config.yml and opt.yaml it reads)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ppmulti.common.errors import UserError
from ppmulti.common.rundir import RUN_DIR_MARKER, STATE, WEIGHTS, newest_run, run_of
from ppmulti.rank.engine import checkpoint as ckpt
from ppmulti.rank.engine.lr import Trained

NONE, RUN, PPDET, RESTART = "none", "run", "ppdet", "restart"   # what is resumed


@dataclass(frozen=True)
class Located:
    """``--resume`` as the launching process reads it: ``path`` the checkpoint or run named (a bare --resume:
    the newest run's directory), ``run_dir`` the ppmulti run it belongs to when that run kept its config.yml
    (its config and opt.yaml then stand in for -c and the flags not given again)."""

    path: str | None
    run_dir: Path | None = None
    progress: ckpt.Progress | None = None   # the checkpoint's sidecar (None: none, as older runs have)

    def check_epochs(self, wanted: int | None) -> None:
        """``check_epochs`` before any rank starts, when the sidecar says what was done (else the rank decides)."""
        if self.progress is not None and self.path is not None:
            check_epochs(self.path, self.progress.epochs_done, self.progress.mid_epoch, wanted)


def locate(resume: str | bool | None, asked_output: str | None) -> Located:
    """Which run or checkpoint ``--resume`` names (bare: the newest run under the user's --project/--name, else
    runs/train and output/) and what its checkpoint's sidecar says was done; a PaddleDetection stem without its
    .pdopt is refused here, before any rank starts."""
    if resume is None or resume is False or resume == "":
        return Located(None)
    path = str(newest_run(asked_output)) if resume is True else str(resume)
    if ppdet_checkpoint(path) is not None:
        return Located(path)
    run = run_of(path)
    try:
        progress = ckpt.read_progress(ckpt.resolve_resume(path))
    except UserError:   # no training state there: the rank says so (look), as before
        progress = None
    return Located(path, run if (run / "config.yml").is_file() else None, progress)


@dataclass(frozen=True)
class Found:
    """The facts a resume is decided from (``look`` reads them; a test writes them down)."""

    asked: str | None = None            # --resume's path (a bare --resume already located)
    ppdet_stem: str | None = None       # asked names a PaddleDetection checkpoint: its stem
    state_file: str | None = None       # ppmulti's .pdstate that asked names
    restart: int = 0                    # the launch's restart count (--max_restarts), 0: the first start
    restart_run: str | None = None      # the run the first start of this launch recorded (its marker)
    restart_state: str | None = None    # that run's weights/last.pdstate, when one was written
    train: dict[str, Any] | None = None  # the resumed .pdstate's loop counters (its ``train``)
    planned: int | None = None          # the epochs the resumed run was planned for (None: unknown)


@dataclass(frozen=True)
class ResumePlan:
    """What a run continues, decided once (``decide``); the builder, the batch plan and ResumeHook read it."""

    source: str = NONE                  # NONE, RUN (--resume of a ppmulti run), PPDET (-r PaddleDetection's), RESTART
    checkpoint: str | None = None       # the .pdstate restored, or PaddleDetection's stem; None: fresh weights
    ppdet: bool = False                 # checkpoint is PaddleDetection's stem (restored in before_train)
    run_dir: str | None = None          # the run directory continued; None: a new one
    trained: Trained | None = None      # the batch plan the checkpoint was trained with (lr.plan_batch keeps it)
    epochs_done: int | None = None
    epochs_planned: int | None = None   # what the resumed run was planned for (None: unknown)
    epochs_wanted: int | None = None    # what this start trains to (--epochs, -o epoch=, the config)
    extends: bool = False               # wanted > planned: the lr schedule is re-planned for the new length
    notes: tuple[str, ...] = field(default_factory=tuple)   # logged once the run's log is open (WARNING)

    @property
    def resumes(self) -> bool:
        return self.checkpoint is not None


def decide(found: Found, epochs_wanted: int | None = None) -> ResumePlan:
    """The resume of one start (pure; golden cases in tests/test_resume_plan.py).

    A launch restart (restart > 0 with a marker) wins: it continues the run its first start recorded, from that
    run's last checkpoint, else starts that run again in its directory (from PaddleDetection's checkpoint again when
    the first start began from one). Otherwise ``--resume`` names a PaddleDetection checkpoint (a new run
    directory), a ppmulti run (its directory continued), or nothing. A ppmulti run resumed with fewer epochs than
    it has done is refused; with more than it was planned for it extends: its lr schedule is planned again for the
    new total (ultralytics refuses this: "training to N epochs is finished, nothing to resume")."""
    if found.restart > 0 and found.restart_run is not None:
        if found.restart_state is not None:
            return _ppmulti(found, RESTART, found.restart_state, epochs_wanted,
                            f"launch restart {found.restart}: resuming {found.restart_run} from its last checkpoint")
        keep = found.ppdet_stem
        note = (f"launch restart {found.restart}: no checkpoint in {found.restart_run} yet, starting it again"
                + (f" from {keep}" if keep else ""))
        return ResumePlan(RESTART, checkpoint=keep, ppdet=keep is not None, run_dir=found.restart_run,
                          epochs_wanted=epochs_wanted, notes=(note,))
    if found.ppdet_stem is not None:
        return ResumePlan(PPDET, checkpoint=found.ppdet_stem, ppdet=True, epochs_wanted=epochs_wanted)
    if found.state_file is not None:
        return _ppmulti(found, RUN, found.state_file, epochs_wanted, None)
    return ResumePlan(epochs_wanted=epochs_wanted)


def _ppmulti(found: Found, source: str, state_file: str, wanted: int | None, note: str | None) -> ResumePlan:
    train = found.train or {}
    trained = (Trained(int(train["global_batch"]), int(train["world_size"]), int(train.get("accumulate", 1)))
               if "global_batch" in train else None)
    done = int(train["epoch"]) if "epoch" in train else None
    mid_epoch = int(train.get("step_in_epoch", 0) or 0) > 0
    run_dir = str(Path(state_file).parent.parent)
    planned = found.planned
    notes = [note] if note else []
    check_epochs(found.asked or run_dir, done, mid_epoch, wanted)
    extends = wanted is not None and planned is not None and wanted > planned
    if extends:
        notes.append(f"extending {run_dir} from {planned} to {wanted} epochs ({done} done): the lr schedule is "
                     f"re-planned for {wanted} epochs")
    return ResumePlan(source, checkpoint=state_file, run_dir=run_dir, trained=trained, epochs_done=done,
                      epochs_planned=planned, epochs_wanted=wanted, extends=extends, notes=tuple(notes))


def check_epochs(asked: str, done: int | None, mid_epoch: bool, wanted: int | None) -> None:
    """The one rule for a ppmulti run resumed with fewer epochs than it has done: a UserError line. ``decide``
    applies it in the rank (from the loaded checkpoint); the launching process applies it before any rank starts
    when the checkpoint's sidecar says what was done (``locate``'s ``progress``)."""
    if wanted is not None and done is not None and (wanted < done or (wanted == done and mid_epoch)):
        # mid-epoch, ``done`` epochs are complete and one more is under way: it needs done + 1
        need = done + 1 if mid_epoch else done
        raise UserError(f"--resume {asked}: the run has {done} epoch(s) done"
                        f"{' and the next under way' if mid_epoch else ''}, but this start trains to {wanted} "
                        f"(--epochs / -o epoch=); give {need} or more (more extends the run), or leave it out")


def look(resume: str | None, restart: int = 0, launch_dir: str | None = None,
         read_state=None) -> Found:
    """The facts for ``decide``: which files ``--resume`` and a launch restart's marker name, the resumed
    checkpoint's counters (``read_state(path)``: the .pdstate's payload; default: loaded) and the epochs its run
    was planned for (the checkpoint's own record, else its run's config.yml). A ``--resume`` naming no training
    state is one line (``ckpt.resolve_resume``)."""
    resume = resume if isinstance(resume, str) and resume else None
    restart_run = restart_state = None
    marker = Path(launch_dir or "", RUN_DIR_MARKER)
    if launch_dir is not None and restart > 0 and marker.is_file():
        restart_run = marker.read_text().strip()
        last = Path(restart_run) / "weights" / ("last" + ckpt.STATE)
        restart_state = str(last) if last.is_file() else None
    found = ppdet_checkpoint(resume) if resume else None
    ppdet_stem = found.stem if found is not None else None
    state_file = None
    if restart_state is not None:
        state_file = restart_state
    elif resume and ppdet_stem is None and restart_run is None:
        state_file = str(ckpt.resolve_resume(resume))
    train = planned = None
    if state_file is not None:
        payload = (read_state or ckpt.load_state)(state_file)
        train = dict(payload["train"])
        planned = ((payload.get("hooks") or {}).get("resume") or {}).get("epochs")
        planned = int(planned) if planned is not None else planned_epochs(Path(state_file).parent.parent)
    return Found(asked=resume, ppdet_stem=ppdet_stem,
                 state_file=None if restart_state is not None else state_file, restart=restart,
                 restart_run=restart_run, restart_state=restart_state, train=train, planned=planned)


_EPOCH_LINE = re.compile(r"^epoch:\s*(\d+)\s*$", re.MULTILINE)


def planned_epochs(run_dir: Path) -> int | None:
    """The epochs a run was planned for, as checkpoints older than ResumeHook's state say it: the top-level
    ``epoch`` of the config.yml it wrote when it started (None: no such file, as for a Trainer from parts)."""
    try:
        match = _EPOCH_LINE.search((Path(run_dir) / "config.yml").read_text())
    except OSError:
        return None
    return int(match.group(1)) if match else None


PPDET_OPTIMIZER = ".pdopt"   # PaddleDetection: the optimizer's state_dict plus 'last_epoch' (epochs done)
PPDET_EMA = ".pdema"         # PaddleDetection with use_ema: the trained weights (the .pdparams then hold the EMA)


@dataclass(frozen=True)
class PpdetCheckpoint:
    """A checkpoint PaddleDetection's Checkpointer wrote: ``stem``.pdparams (+ .pdopt, + .pdema with EMA)."""

    stem: str

    @property
    def name_epoch(self) -> int | None:
        """Epochs done, read from the name: ``N`` is saved after epoch index N (N + 1 epochs), None for
        ``model_final`` / ``best_model`` (their .pdopt says)."""
        name = Path(self.stem).name
        return int(name) + 1 if re.fullmatch(r"\d+", name) else None


def ppdet_checkpoint(path: str | bool | None) -> PpdetCheckpoint | None:
    """Which kind of checkpoint ``--resume``/``-r PATH`` names: None for ppmulti's own (a run directory, or a
    stem with a .pdstate), a PpdetCheckpoint for PaddleDetection's (a stem with .pdparams and .pdopt and no
    .pdstate; the path may carry either suffix). A stem with weights only is refused: nothing to continue."""
    if not isinstance(path, str) or not path or Path(path).is_dir():
        return None
    stem = path
    for suffix in (WEIGHTS, STATE, PPDET_OPTIMIZER, PPDET_EMA):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    if Path(stem + STATE).is_file() or not Path(stem + WEIGHTS).is_file():
        return None   # ppmulti's own, or nothing (ckpt.resolve_resume names what it looked for)
    if not Path(stem + PPDET_OPTIMIZER).is_file():
        raise UserError(f"--resume {path}: {stem}{WEIGHTS} has no training state beside it (neither "
                        f"PaddleDetection's {Path(stem).name}{PPDET_OPTIMIZER} nor ppmulti's "
                        f"{Path(stem).name}{STATE}); to start a new run from these weights pass "
                        f"--weights {stem}{WEIGHTS}")
    return PpdetCheckpoint(stem)
