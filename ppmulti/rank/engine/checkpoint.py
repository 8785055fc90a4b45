"""Checkpoints: atomic last/best weights for inference plus a full training state for resume."""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import threading
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ppmulti.common.atomic import atomic_save, atomic_write_text
from ppmulti.common.errors import UserError
from ppmulti.common.rundir import STATE, WEIGHTS  # noqa: F401  (file kinds, shared with run management)


@dataclass
class TrainState:
    """The loop's own counters (a checkpoint's ``train``); the hooks keep theirs under ``hooks``."""

    epoch: int            # epochs completed
    global_step: int
    world_size: int
    global_batch: int
    step_in_epoch: int = 0   # >0 only in a checkpoint saved on an interrupt: steps of ``epoch`` already done
    accumulate: int = 1      # batches per optimizer step (older checkpoints: 1); global_batch x this = effective
    # an interrupted epoch's running loss sums over its ``step_in_epoch`` steps (this rank's), so the resumed epoch's
    # results.csv row averages all of its steps
    loss_sums: dict = field(default_factory=dict)

    @property
    def effective_batch(self) -> int:
        return self.global_batch * self.accumulate

    @classmethod
    def from_dict(cls, train: dict[str, Any]) -> "TrainState":
        """Read a checkpoint's ``train``; older files also hold the hooks' fields there (see ``hook_states``)."""
        return cls(**{f.name: train[f.name] for f in fields(cls) if f.name in train})


def hook_states(payload: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """Each hook's state in a checkpoint, by hook name. Checkpoints written before the hooks kept their own
    state hold EMA at the top level and the best mAP / fitness in ``train``: read those as the hooks' own."""
    if "hooks" in payload:
        return payload["hooks"]
    train = payload.get("train") or {}
    return {"ema": {"weights": payload["ema"], "step": payload.get("ema_step", 0)} if payload.get("ema") else None,
            "early_stop": {"best_fitness": train.get("best_fitness", -1.0), "best_epoch": train.get("best_epoch", 0)},
            "checkpoint": {"best_map": train.get("best_map", -1.0)}}


def rng_state() -> dict[str, Any]:
    import numpy as np
    import paddle

    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "paddle": paddle.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import paddle

    if not state:
        return
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    try:
        paddle.set_rng_state(state["paddle"])
    except Exception:  # a CPU generator state on a GPU run or the reverse: keep going, seeded
        pass


def save(stem: str | os.PathLike, model, inference_weights: dict, optimizer, lr_scheduler, state: TrainState,
         hooks: dict[str, dict[str, Any]]) -> None:
    """Write ``stem.pdparams`` (weights to use), ``stem.pdstate`` (resume: the loop's state and each hook's, by
    hook name) and ``stem.json`` (its progress, for the launching process: ``Progress``) atomically."""
    snapshot(stem, model, inference_weights, optimizer, lr_scheduler, state, hooks).write()


@dataclass
class Snapshot:
    """A checkpoint copied to host memory: what ``save`` writes, taken between two steps so that its files can be
    pickled, written and fsynced while training goes on (``BackgroundWriter``)."""

    stem: str
    weights: dict      # the .pdparams content, in paddle.save's layout (``weights_layout``)
    payload: Any       # the .pdstate content, tensors as ``HostTensor``
    progress: Progress

    def write(self) -> None:
        atomic_save(self.stem + WEIGHTS, lambda tmp: _pickle(self.weights, tmp))
        atomic_save(self.stem + STATE, lambda tmp: _pickle(self.payload, tmp))
        write_progress(self.stem, self.progress)


def snapshot(stem: str | os.PathLike, model, inference_weights: dict, optimizer, lr_scheduler, state: TrainState,
             hooks: dict[str, dict[str, Any]]) -> Snapshot:
    """The checkpoint ``save`` writes, copied now: the model, optimizer and hooks may change right after."""
    payload = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "lr": lr_scheduler.state_dict() if hasattr(lr_scheduler, "state_dict") else None,
        "train": vars(state),
        "rng": rng_state(),
        "hooks": hooks,
    }
    planned = (hooks.get("resume") or {}).get("epochs")
    return Snapshot(str(stem), weights_layout(inference_weights), host_copy(payload),
                    Progress(int(state.epoch), int(state.step_in_epoch or 0) > 0,
                             None if planned is None else int(planned)))


NAME_TABLE = "StructuredToParameterName@@"   # paddle.save's key for a state dict's parameter names


def weights_layout(weights: dict) -> dict:
    """What paddle.save pickles for a state dict (Paddle 2.6 and 3.x): each tensor as a host array under its key,
    and the keys' parameter names under ``NAME_TABLE``; pickled at protocol 4 it is paddle.save's file, byte for
    byte (tests/test_hooks.py)."""
    import paddle

    out = {k: v.numpy() if isinstance(v, paddle.Tensor) else v for k, v in weights.items()}
    out[NAME_TABLE] = {k: v.name for k, v in weights.items() if isinstance(v, paddle.Tensor)}
    return out


class HostTensor:
    """A tensor's name and values in host memory. It pickles as paddle.save pickles a tensor nested in a state:
    a ``(name, array)`` tuple, which paddle.load turns back into a tensor."""

    __slots__ = ("name", "array")

    def __init__(self, name: str, array) -> None:
        self.name, self.array = name, array

    def __reduce__(self):
        return tuple, ((self.name, self.array),)


def host_copy(obj: Any, memo: dict[int, Any] | None = None) -> Any:
    """``obj`` with each tensor copied to host memory once (``Tensor.numpy()`` copies; a tensor met twice is one
    ``HostTensor``) and its containers rebuilt, so that nothing in the copy changes with the live state."""
    import numpy as np
    import paddle

    memo = {} if memo is None else memo
    if isinstance(obj, paddle.Tensor):
        if id(obj) not in memo:
            memo[id(obj)] = HostTensor(obj.name, obj.numpy())
        return memo[id(obj)]
    if isinstance(obj, dict):
        out = copy.copy(obj)   # its own type (an OrderedDict stays one), then its values copied
        for k, v in obj.items():
            out[k] = host_copy(v, memo)
        return out
    if type(obj) in (list, tuple):   # a named tuple or another sequence type: deep-copied below
        return type(obj)(host_copy(v, memo) for v in obj)
    if isinstance(obj, np.ndarray):
        return obj.copy()
    return copy.deepcopy(obj)


def save_nested(obj: Any, path: str) -> None:
    """``paddle.save(obj, path)`` for a nested state (dicts of state dicts), in the same file: each tensor,
    wherever it is, pickled as paddle.save pickles it (``HostTensor``), with one copy (``Tensor.numpy()``) where
    paddle.save makes two (``Tensor.cpu()``, then ``np.array``). Measured: bench/results/checkpoint.json."""
    _pickle(host_copy(obj), path)


def _pickle(obj: Any, path: str) -> None:
    import pickle

    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=4)   # paddle.save's protocol


class BackgroundWriter:
    """Writes one checkpoint at a time in a thread of its own while training goes on (``Snapshot.write`` and
    what follows it: ``best``, ``epochN``). ``submit`` first waits for the write before it; ``wait`` joins the
    write in progress and raises what it raised. The trainer waits before any other save, at its end, and before
    each hook that may read the files (``Hook.reads_weights``)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, job) -> None:
        self.wait()

        def run() -> None:
            try:
                job()
            except BaseException as e:   # raised in the training thread by the next wait
                self._error = e

        # not a daemon: an interpreter that exits still finishes the file (atomic either way)
        self._thread = threading.Thread(target=run, name="ppmulti-checkpoint")
        self._thread.start()

    def wait(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error


PROGRESS = ".json"   # beside a .pdstate: its epochs done and planned, readable without Paddle (``Progress``)


@dataclass(frozen=True)
class Progress:
    """What a .pdstate holds of a run's progress, read from its small JSON sidecar by the launching process
    (which imports no Paddle), so that ``--resume RUN --epochs N`` with fewer than done is refused before any
    rank starts."""

    epochs_done: int
    mid_epoch: bool               # saved on a stop, with steps of the next epoch done
    epochs_planned: int | None    # None: unknown (a Trainer from parts)


def write_progress(stem: str | os.PathLike, progress: Progress) -> None:
    """``stem.json`` for the ``stem.pdstate`` just written. It names that file by size and mtime: the sidecar is
    written after the state, so a crash between the two leaves a sidecar naming an older state file, which
    ``read_progress`` ignores (the rank, which loads the state, then decides), never one that says too much."""
    held = os.stat(str(stem) + STATE)
    atomic_write_text(str(stem) + PROGRESS, json.dumps(
        {"epochs_done": progress.epochs_done, "mid_epoch": progress.mid_epoch,
         "epochs_planned": progress.epochs_planned,
         "state_bytes": held.st_size, "state_mtime_ns": held.st_mtime_ns}) + "\n")


def read_progress(state_file: str | os.PathLike) -> Progress | None:
    """The progress of ``state_file`` (a .pdstate) from its sidecar; None when there is none (a run written before
    sidecars, a PaddleDetection checkpoint), it cannot be read, or it describes another version of the file."""
    state_file = str(state_file)
    stem = state_file[: -len(STATE)] if state_file.endswith(STATE) else state_file
    try:
        held = os.stat(stem + STATE)
        record = json.loads(Path(stem + PROGRESS).read_text())
        if (record["state_bytes"], record["state_mtime_ns"]) != (held.st_size, held.st_mtime_ns):
            return None
        planned = record.get("epochs_planned")
        return Progress(int(record["epochs_done"]), bool(record["mid_epoch"]),
                        None if planned is None else int(planned))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def copy_checkpoint(src_stem: str | os.PathLike, dst_stem: str | os.PathLike, state: bool = True) -> None:
    """Publish a copy of a checkpoint under another name (``last`` -> ``best``), atomically; ``state=False``
    copies only the weights. The copy is a hard link where the file system allows one (no bytes written: a new
    best every epoch cost a 60 MB copy and its fsync); checkpoints are only ever replaced by a rename, never
    written in place, so the next ``last`` is a new file and the linked ``best`` keeps its bytes."""
    for suffix in (WEIGHTS, STATE) if state else (WEIGHTS,):
        src = str(src_stem) + suffix
        if os.path.exists(src):
            atomic_save(str(dst_stem) + suffix, lambda tmp, s=src: _link_or_copy(s, tmp))
    progress = read_progress(str(src_stem) + STATE) if state else None
    if progress is not None:   # the copy is another file: its sidecar names it
        write_progress(dst_stem, progress)


def _link_or_copy(src: str, tmp: str) -> None:
    """``tmp`` (atomic_path's empty temp file) becomes a hard link to ``src``, or a copy where links fail."""
    try:
        os.unlink(tmp)
        os.link(src, tmp)
    except OSError:   # no hard links here (some network and FUSE file systems): the bytes, then
        shutil.copyfile(src, tmp)


def resolve_resume(path: str | os.PathLike) -> Path:
    """Accept a run directory, a ``weights/`` dir, a stem or a .pdstate/.pdparams file."""
    p = Path(path)
    candidates = []
    if p.is_dir():
        candidates = [p / "weights" / ("last" + STATE), p / ("last" + STATE)]
    else:
        stem = str(p)
        for suffix in (WEIGHTS, STATE):
            if stem.endswith(suffix):
                stem = stem[: -len(suffix)]
        candidates = [Path(stem + STATE)]
    for c in candidates:
        if c.is_file():
            return c
    raise UserError(f"--resume {path}: no training state found (looked for {', '.join(map(str, candidates))})")


def load_state(path: str | os.PathLike) -> dict:
    import paddle

    try:
        return paddle.load(str(path))
    except Exception as exc:
        raise UserError(f"checkpoint {path} cannot be read ({type(exc).__name__}); it may be truncated") from None


def check_shapes(model, weights: dict, source: str) -> tuple[list[str], list[str]]:
    """Refuse shape mismatches by name; return (missing, unexpected) keys."""
    own = model.state_dict()
    for key, value in weights.items():
        if key in own and list(own[key].shape) != list(value.shape):
            raise UserError(f"{source}: parameter {key} has shape {list(value.shape)} but the model "
                            f"expects {list(own[key].shape)} — the checkpoint is from another model or num_classes")
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    return missing, unexpected


def load_weights(model, path: str | os.PathLike) -> tuple[list[str], list[str]]:
    """Load inference weights (a .pdparams, a stem or a YOLOv5 .pt) into ``model``, checking shapes."""
    p = str(path)
    if p.endswith((".pt", ".pth")):   # a YOLOv5 .pt: converted once, cached beside it
        from ppmulti.rank.models.convert import pdparams_for

        p = pdparams_for(p, prefer="ema")[0]   # a checkpoint's ema, as YOLOv5's val/detect load it
    if not p.endswith(WEIGHTS):
        p += WEIGHTS
    if not os.path.isfile(p):
        raise UserError(f"weights file not found: {p}")
    weights = load_state(p)
    missing, unexpected = check_shapes(model, weights, p)
    # the model's keys once: state_dict() walks every sublayer, and per key it cost 47 s of loading HGNetv2-X's
    # 1,070 weights on Paddle 2.6.2
    extra = set(unexpected)
    model.set_state_dict({k: v for k, v in weights.items() if k not in extra})
    return missing, unexpected
