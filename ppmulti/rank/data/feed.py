"""A run's batches from one loader iterator, so loader workers start once per run, not per epoch (``Feed``: the
training epochs; ``Passes``: the evaluations).

Paddle's DataLoader forks its workers every time it is iterated, and ppmulti iterates a fresh one each epoch
(so every rank shuffles by the same epoch, see ``compat.epoch_batches``). That costs every epoch a fork of the
training process, the copy-on-write of its memory while the children live, and workers that start cold; on a
2-core machine about 0.7 s of a 9 s YOLOv5n epoch. Paddle's own ``persistent_workers`` keeps the workers but
polls them back into a new epoch in 0.5 s sleeps. YOLOv5's InfiniteDataLoader keeps one iterator for the run;
so does this, for the batch samplers whose order depends on nothing but the epoch (ppdet's and Paddle's
DistributedBatchSampler, --rect's): one iterator over a sampler that runs the epochs in turn, each after its
``set_epoch``, with every index tagged by its epoch so the workers' copy of the dataset gets ``set_epoch`` too
(ppdet's datasets switch mixup or mosaic off by epoch). The workers then prefetch the next epoch's first
batches while the last ones train and while the epoch is evaluated.

A sampler that reads training results at each epoch's start (--image-weights: the last evaluation's per-class
mAP) declares ``drawn_at_epoch_start = True`` and keeps a fresh iterator per epoch, as does any loader that is
not a ppdet reader (a list, a test's iterable).

Without workers (``worker_num: 0``), Paddle's single-process iterator makes the batches in a thread of its own,
and when the dataset or a transform raises there, the trainer waits on its queue forever (Paddle 2.6 and 3.x
alike). So a reader without workers is iterated by ``ThreadBatches`` instead: the same batches (the reader's
dataset, batch sampler and collate function), made one or two ahead in a thread, whose error is raised in the
trainer, after one line naming the image.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
from typing import Any, Iterator, Mapping

from ppmulti.rank import compat

log = logging.getLogger("ppmulti")


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_shielded = False
_mask_before_fork: set | None = None


def shield_workers() -> None:
    """Processes this rank forks from now on (Paddle's loader workers) leave its process group, so that a Ctrl-C
    (the terminal signals the foreground group) or a SIGTERM to the rank's group (Paddle's launcher stops each rank
    with ``killpg``) reaches only the rank: its stop-on-signal hook decides, stops every rank at the same step and
    saves. In the rank's group a worker died of the signal first and Paddle's SIGCHLD handler killed the rank
    ("DataLoader process ... is killed by signal: Terminated") before anything was saved. A signal sent to the
    worker itself still acts as before: the rank's ``terminate()`` at exit, SIGKILL, ppmulti's sweep of a launch's
    processes; and Paddle's workers exit when the rank is gone (their parent watchdog).

    SIGINT and SIGTERM are blocked in the forking thread from just before the fork until the child has its own group
    (a signal to the group in between waits, in the rank and in the child; the child drops it, the rank handles it);
    the parent's mask comes back right after. Only ``os.fork`` (which multiprocessing uses) runs these hooks;
    ``subprocess`` does not. Idempotent: the hooks are registered once per process."""
    global _shielded
    if _shielded or not hasattr(os, "register_at_fork") or not hasattr(signal, "pthread_sigmask"):
        return
    _shielded = True
    os.register_at_fork(before=_block_stop_signals, after_in_parent=_unblock_stop_signals,
                        after_in_child=_leave_the_group)


def _block_stop_signals() -> None:
    global _mask_before_fork
    _mask_before_fork = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def _unblock_stop_signals() -> None:
    global _mask_before_fork
    if _mask_before_fork is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, _mask_before_fork)
        _mask_before_fork = None


def _leave_the_group() -> None:
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    pending = signal.sigpending() & STOP_SIGNALS   # sent to the rank's group between the fork and setpgid
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in pending}   # discarded as it is unblocked
    _unblock_stop_signals()
    for sig, handler in previous.items():
        signal.signal(sig, handler)


class EpochTaggedSampler:
    """Batches of ``sampler`` for epochs ``first`` .. ``end - 1`` in turn (``set_epoch`` before each), the
    first epoch from its batch ``skip``; each index comes as ``(epoch, index)``."""

    def __init__(self, sampler: Any, first: int, end: int, skip: int = 0):
        self.sampler, self.first, self.end, self.skip = sampler, int(first), int(end), int(skip)

    def __iter__(self) -> Iterator[list]:
        for epoch in range(self.first, self.end):
            if hasattr(self.sampler, "set_epoch"):
                self.sampler.set_epoch(epoch)
            n = 0
            for n, batch in enumerate(self.sampler, 1):
                if epoch == self.first and n <= self.skip:
                    continue
                yield [(epoch, int(i)) for i in batch]
            if n != len(self.sampler):   # the consumer takes len() batches per epoch: a mismatch would shift epochs
                raise RuntimeError(f"batch sampler {type(self.sampler).__name__} gave {n} batches in epoch {epoch}, "
                                   f"its len() says {len(self.sampler)}")

    def __len__(self) -> int:
        return max(0, (self.end - self.first) * len(self.sampler) - self.skip)


class EpochTaggedDataset:
    """``dataset[(epoch, i)]`` is ``dataset[i]`` after ``dataset.set_epoch(epoch)`` (when the epoch changes):
    what a loader worker's copy of the dataset needs to follow the run's epochs.

    With ``seed`` (the run's ``--seed``), Python's and numpy's global generators are seeded from (seed, epoch, i)
    before each sample is made, so a sample's augmentation (mosaic's other images, flips, HSV, the batch transforms
    that follow it) depends on nothing but the run's seed and where the sample falls: not on which loader worker or
    thread made it, how far ahead the loader ran, or whether the run was stopped and resumed in between (a resumed
    run makes the batches an uninterrupted one makes). Ranks draw different indices, so they still differ."""

    def __init__(self, dataset: Any, seed: int | None = None):
        self.dataset = dataset
        self.seed = seed
        self._epoch: int | None = None

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        if epoch != self._epoch:
            if hasattr(self.dataset, "set_epoch"):
                self.dataset.set_epoch(epoch)
            self._epoch = epoch
        if self.seed is not None:
            seed_sample(self.seed, epoch, index)
        return self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)


def seed_sample(seed: int, epoch: int, index: int) -> None:
    """Seed ``random`` and ``numpy.random`` for sample ``index`` of ``epoch`` in a run seeded ``seed``."""
    import random

    import numpy as np

    random.seed(f"sample:{seed}:{epoch}:{index}")   # a str seed is hashed by SHA-512: the same in every process
    np.random.seed(random.getrandbits(32))


class ThreadBatches:
    """Batches of ``dataset`` in ``batch_sampler``'s order through ``collate_fn`` (Paddle's default collate when
    None), made ``ahead`` at most in one thread, handed over as Paddle tensors (as a DataLoader without workers
    hands them): what ``Feed`` iterates for a reader without workers. An exception in the thread is raised by
    ``next()``; ``close()`` (or dropping the iterator) stops the thread."""

    def __init__(self, dataset: Any, batch_sampler: Any, collate_fn: Any, ahead: int = 2):
        if collate_fn is None:
            from paddle.io.dataloader.collate import default_collate_fn as collate_fn
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, int(ahead)))
        self._stop = threading.Event()
        self._done = False
        # the thread holds the queue and the event, not this object, so that dropping the iterator stops it
        self._thread = threading.Thread(target=_make_batches,
                                        args=(self._queue, self._stop, dataset, batch_sampler, collate_fn),
                                        name="ppmulti-batches", daemon=True)
        self._thread.start()

    def __iter__(self) -> "ThreadBatches":
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        kind, value = self._queue.get()
        if kind == "batch":
            return _to_tensors(value)
        self._done = True
        self.close()
        if kind == "error":
            raise value
        raise StopIteration

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.1)   # frees a put that waits
            except queue.Empty:
                pass

    def __del__(self) -> None:
        self._stop.set()


def _make_batches(out: queue.Queue, stop: threading.Event, dataset: Any, batch_sampler: Any,
                  collate_fn: Any) -> None:
    """ThreadBatches' thread: ("batch", b) for each batch, then ("end", None), or ("error", exc) where one raised."""

    def put(item: tuple) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    try:
        for indices in batch_sampler:
            samples = []
            for key in indices:
                try:
                    samples.append(dataset[key])
                except Exception as exc:
                    text = str(exc).strip()
                    log.error("loading %s failed: %s%s", _sample_name(dataset, key), type(exc).__name__,
                              f": {text.splitlines()[0]}" if text else "")
                    raise
            if not put(("batch", collate_fn(samples))):
                return
        put(("end", None))
    except BaseException as exc:   # noqa: BLE001 -- handed to the trainer's thread, raised there
        put(("error", exc))


def _sample_name(dataset: Any, key: Any) -> str:
    """The image behind ``dataset[key]`` (a ppdet record's im_file) for the error line, else the sample's index."""
    if isinstance(key, tuple) and isinstance(dataset, EpochTaggedDataset):
        dataset, key = dataset.dataset, key[1]
    try:
        record = dataset.roidbs[int(key)]
        return f"image {record['im_file']}"
    except Exception:   # noqa: BLE001 -- a dataset without ppdet's records
        return f"sample {key}"


def _to_tensors(batch: Any) -> Any:
    """numpy arrays in a (nested) batch as Paddle tensors, other values as they are (Paddle's DataLoader's rule)."""
    import numpy as np
    import paddle

    if isinstance(batch, np.ndarray):
        return paddle.to_tensor(batch)
    if isinstance(batch, Mapping):
        return {k: _to_tensors(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [_to_tensors(v) for v in batch]
    return batch


def batches_of(dataloader: Any) -> Any:
    """An iterator over a paddle.io.DataLoader: its own with workers, ``ThreadBatches`` without."""
    if getattr(dataloader, "num_workers", 1) == 0:
        return ThreadBatches(dataloader.dataset, dataloader.batch_sampler, dataloader.collate_fn)
    return iter(dataloader)


class Feed:
    """A trainer's batches, epoch by epoch: ``for step, batch in feed.epoch(e, skip, end)`` yields epoch
    ``e``'s steps from ``skip`` on. One loader iterator serves consecutive epochs up to ``end`` (the run's
    epoch count; see the module's docstring); asked for anything else (another epoch, a resumed step), it
    starts a new one. ``close()`` stops its workers; a run calls it however it ends."""

    def __init__(self, loader: Any, seed: int | None = None):
        shield_workers()   # the loader workers forked for this run leave the rank's group: signals are its own
        self.loader = loader
        self.seed = seed   # each sample's augmentation seeded by (seed, epoch, index): see EpochTaggedDataset
        self._batches = None          # the run-long iterator, once made
        self._next: tuple[int, int] | None = None   # the (epoch, skip) it stands at, between epochs

    def _sampler(self) -> Any:
        return compat.batch_sampler(self.loader)

    def run_long(self) -> bool:
        """Whether this loader gets one iterator for the run (else a fresh one per epoch)."""
        sampler = self._sampler()
        return (sampler is not None and getattr(self.loader, "dataloader", None) is not None
                and not getattr(sampler, "drawn_at_epoch_start", False))

    def epoch(self, epoch: int, skip: int = 0, end: int | None = None) -> Iterator[tuple[int, Any]]:
        if not self.run_long():
            yield from self._fresh(epoch, skip)
            return
        if self._batches is None or self._next != (epoch, skip):
            self.close()
            tagged = EpochTaggedSampler(self._sampler(), epoch, max(end or 0, epoch + 1), skip)
            self._batches = batches_of(compat.loader_like(self.loader,
                                                          EpochTaggedDataset(self.loader.dataloader.dataset, self.seed),
                                                          tagged))
        self._next = None   # mid-epoch: a stop here leaves the iterator unusable for a later request
        for step in range(skip, len(self._sampler())):
            yield step, next(self._batches)
        self._next = (epoch + 1, 0)

    def _fresh(self, epoch: int, skip: int) -> Iterator[tuple[int, Any]]:
        sampler = self._sampler()
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)   # a new shuffle every epoch, identical across ranks
        made = getattr(self.loader, "dataloader", None)
        if made is not None and getattr(made, "num_workers", 1) == 0:
            batches = batches_of(compat.loader_like(self.loader, made.dataset, sampler))
        else:
            batches = compat.epoch_batches(self.loader)   # drawn after set_epoch
        try:
            for step, data in enumerate(batches):
                if step >= skip:
                    yield step, data
        finally:
            if isinstance(batches, ThreadBatches):
                batches.close()

    def close(self) -> None:
        """Stop the run-long iterator's workers (and its prefetching thread)."""
        batches, self._batches, self._next = self._batches, None, None
        if isinstance(batches, ThreadBatches):
            batches.close()
        elif batches is not None:
            compat.close_batches(batches)


class Passes:
    """Whole passes over a reader, one after another (a run's evaluations), all from one ``Feed`` iterator: its
    workers are forked once, at the first pass, and make the next pass's first batches ahead. Iterated afresh each
    time, ppdet's reader makes its next iterator as soon as one ends, so every evaluation forked workers that then
    lived through the next training epoch, while each page the trainer wrote was copied once more (copy-on-write):
    on a 2-core machine 0.5 s of an 8 s YOLO26n epoch in system time. Without workers the batches come from the
    Feed's thread, whose errors reach the caller (Paddle's own thread would hang)."""

    AHEAD = 1 << 20   # passes one iterator is made for; a run that asks for more starts another

    def __init__(self, reader: Any):
        self.feed = Feed(reader)
        self.begun = 0   # passes asked for so far

    def next(self) -> Iterator[Any]:
        """The next pass's batches (to the Feed, pass k is epoch k)."""
        number, self.begun = self.begun, self.begun + 1
        return (batch for _, batch in self.feed.epoch(number, 0, number + self.AHEAD))

    def close(self) -> None:
        """Stop the workers and drop the batches made ahead."""
        self.feed.close()
