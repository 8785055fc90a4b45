"""The training batches of a whole run from one loader iterator, so loader workers start once per run, not per epoch.

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
"""

from __future__ import annotations

from typing import Any, Iterator

from ppmulti.rank import compat


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
    what a loader worker's copy of the dataset needs to follow the run's epochs."""

    def __init__(self, dataset: Any):
        self.dataset = dataset
        self._epoch: int | None = None

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        if epoch != self._epoch:
            if hasattr(self.dataset, "set_epoch"):
                self.dataset.set_epoch(epoch)
            self._epoch = epoch
        return self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)


class Feed:
    """A trainer's batches, epoch by epoch: ``for step, batch in feed.epoch(e, skip, end)`` yields epoch
    ``e``'s steps from ``skip`` on. One loader iterator serves consecutive epochs up to ``end`` (the run's
    epoch count; see the module's docstring); asked for anything else (another epoch, a resumed step), it
    starts a new one. ``close()`` stops its workers; a run calls it however it ends."""

    def __init__(self, loader: Any):
        self.loader = loader
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
            self._batches = iter(compat.loader_like(self.loader, EpochTaggedDataset(self.loader.dataloader.dataset),
                                                          tagged))
        self._next = None   # mid-epoch: a stop here leaves the iterator unusable for a later request
        for step in range(skip, len(self._sampler())):
            yield step, next(self._batches)
        self._next = (epoch + 1, 0)

    def _fresh(self, epoch: int, skip: int) -> Iterator[tuple[int, Any]]:
        sampler = self._sampler()
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)   # a new shuffle every epoch, identical across ranks
        for step, data in enumerate(compat.epoch_batches(self.loader)):   # drawn after set_epoch
            if step >= skip:
                yield step, data

    def close(self) -> None:
        """Stop the run-long iterator's workers (and its prefetching thread)."""
        batches, self._batches, self._next = self._batches, None, None
        if batches is not None:
            compat.close_batches(batches)
