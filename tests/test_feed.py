"""data.feed: one loader iterator for a run's epochs -- workers start once, every epoch is drawn by its own epoch
(in the sampler and in the workers' dataset), a resumed epoch starts at its step, and nothing outlives close()."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import paddle
import pytest

from ppmulti.rank.data.feed import EpochTaggedSampler, Feed

N = 8   # samples; batches of 2


class _Data(paddle.io.Dataset):
    """Each sample says which index it is, which process made it and which epoch that process's copy was at."""

    def __init__(self):
        self._epoch = -1

    def set_epoch(self, epoch):
        self._epoch = epoch

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"index": np.array([i], "int64"), "pid": np.array([os.getpid()], "int64"),
                "epoch": np.array([self._epoch], "int64")}


class _Shuffle:
    """A batch sampler whose order is a function of its epoch alone, as DistributedBatchSampler's shuffle."""

    def __init__(self):
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        order = np.random.RandomState(self.epoch).permutation(N).tolist()
        yield from (order[i:i + 2] for i in range(0, N, 2))

    def __len__(self):
        return N // 2


class _Reader:
    """ppdet's BaseDataLoader as the feed sees it: its sampler, its DataLoader and the iterator made ahead."""

    def __init__(self, sampler, workers):
        self._batch_sampler = sampler
        self.dataloader = paddle.io.DataLoader(_Data(), batch_sampler=sampler, num_workers=workers)
        self.loader = iter(self.dataloader)

    def __len__(self):
        return len(self._batch_sampler)


def _epoch(feed, epoch, skip=0, end=3):
    return [(step, [int(v) for v in batch["index"].numpy().ravel()], int(batch["pid"].numpy()[0, 0]),
             int(batch["epoch"].numpy()[0, 0])) for step, batch in feed.epoch(epoch, skip, end)]


def _order(epoch):
    s = _Shuffle()
    s.set_epoch(epoch)
    return list(s)


def _children() -> set[int]:
    me = os.getpid()
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):   # a process that ended during the scan
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                    out.add(int(pid))
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_each_epoch_is_drawn_by_its_epoch_in_sampler_and_workers(workers):
    before = _children()
    feed = Feed(_Reader(_Shuffle(), workers))
    assert feed.run_long()
    seen = [_epoch(feed, e) for e in range(3)]
    forked = _children() - before
    feed.close()
    for e, rows in enumerate(seen):
        assert [r[0] for r in rows] == [0, 1, 2, 3]
        assert [r[1] for r in rows] == _order(e)          # the sampler's shuffle of epoch e
        assert {r[3] for r in rows} == {e}                 # the worker's dataset was at epoch e
    pids = {r[2] for rows in seen for r in rows}
    if workers:
        # the same worker processes served every epoch, and none is left after close()
        assert os.getpid() not in pids and len(pids) <= workers
        assert _children() - before == set()
        # the batches they had made ahead for an epoch never drawn are not left in /dev/shm
        assert [n for n in os.listdir("/dev/shm") if n.split("_")[:2] in (["paddle", str(p)] for p in forked)] == []
    else:
        assert pids == {os.getpid()}


def test_a_fresh_iterator_per_epoch_forks_new_workers_the_feed_does_not():
    """What the feed saves: a ppdet reader iterated per epoch (the old way) gets new worker processes every
    epoch; the feed's come from one set."""
    reader = _Reader(_Shuffle(), 1)
    per_epoch = set()
    for _ in range(2):
        per_epoch |= {int(b["pid"].numpy()[0, 0]) for b in reader.dataloader}
    assert len(per_epoch) == 2
    feed = Feed(_Reader(_Shuffle(), 1))
    assert len({r[2] for e in range(3) for r in _epoch(feed, e)}) == 1
    feed.close()


class _InOrder:
    """An evaluation's batch sampler: the same order every pass, no set_epoch."""

    def __iter__(self):
        yield from ([i, i + 1] for i in range(0, N, 2))

    def __len__(self):
        return N // 2


@pytest.mark.parametrize("workers", [0, 2])
def test_evaluations_are_whole_passes_from_workers_forked_once(workers):
    """data.feed.Passes (the evaluator's): each pass is the whole set in order, every pass from the same worker
    processes, none left after close() and none of the batches they made ahead for a fourth pass in /dev/shm."""
    from ppmulti.rank.data.feed import Passes

    before = _children()
    passes = Passes(_Reader(_InOrder(), workers))
    seen = [[([int(v) for v in b["index"].numpy().ravel()], int(b["pid"].numpy()[0, 0])) for b in passes.next()]
            for _ in range(3)]
    forked = _children() - before
    passes.close()
    assert [[r[0] for r in rows] for rows in seen] == [list(_InOrder())] * 3
    pids = {r[1] for rows in seen for r in rows}
    if workers:
        assert os.getpid() not in pids and len(pids) <= workers and len(forked) == workers
    else:
        assert pids == {os.getpid()} and forked == set()
    assert _children() - before == set()
    assert [n for n in os.listdir("/dev/shm") if n.split("_")[:2] in (["paddle", str(p)] for p in forked)] == []


def test_a_resumed_epoch_starts_at_its_step_and_goes_on_to_the_next():
    feed = Feed(_Reader(_Shuffle(), 1))
    rows = _epoch(feed, 1, skip=3)
    assert [r[0] for r in rows] == [3] and rows[0][1] == _order(1)[3] and rows[0][3] == 1
    nxt = _epoch(feed, 2)
    assert [r[1] for r in nxt] == _order(2) and {r[3] for r in nxt} == {2}
    feed.close()


def test_a_stop_mid_epoch_then_another_request_starts_over():
    feed = Feed(_Reader(_Shuffle(), 1))
    it = feed.epoch(0, 0, 3)
    next(it), next(it)   # a hook stopped the epoch after two steps
    it.close()
    rows = _epoch(feed, 0, skip=2)   # the resume of that epoch: its steps 2 and 3, not the stale iterator's
    assert [r[1] for r in rows] == _order(0)[2:]
    feed.close()


def test_samplers_drawn_at_epoch_start_get_a_fresh_iterator_each_epoch():
    """--image-weights' draw reads the last evaluation, set between epochs: it must not be drawn ahead."""

    class Drawn(_Shuffle):
        drawn_at_epoch_start = True
        weights_seen = []

        def __iter__(self):
            self.weights_seen.append(self.epoch)
            return super().__iter__()

    sampler = Drawn()
    feed = Feed(_Reader(sampler, 1))
    assert not feed.run_long()
    first = _epoch(feed, 0)
    # nothing of epoch 1 was drawn while epoch 0 ran (the reader's made-ahead iterator drew with epoch 0)
    assert 1 not in sampler.weights_seen
    assert [r[1] for r in first] == _order(0) and [r[1] for r in _epoch(feed, 1)] == _order(1)
    feed.close()


def test_plain_iterables_are_iterated_per_epoch():
    feed = Feed([{"x": 1}, {"x": 2}])
    assert not feed.run_long()
    assert [s for s, _ in feed.epoch(0)] == [0, 1] and [s for s, _ in feed.epoch(1, skip=1)] == [1]


def test_the_tagged_sampler_refuses_a_sampler_whose_len_disagrees():
    class Short(_Shuffle):
        def __len__(self):
            return 5

    with pytest.raises(RuntimeError, match="gave 4 batches in epoch 0, its len"):
        list(EpochTaggedSampler(Short(), 0, 1))
    assert len(EpochTaggedSampler(_Shuffle(), 2, 5, skip=1)) == 3 * 4 - 1
