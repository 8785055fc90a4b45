"""A reader without workers (worker_num: 0) whose transform raises: the error reaches the trainer (or the
evaluation), with one line naming the image, instead of the rank waiting forever on Paddle's single-process queue."""

from __future__ import annotations

import logging
import threading

import numpy as np
import paddle
import pytest

from ppmulti.rank.data.feed import Feed, ThreadBatches


class _Images(paddle.io.Dataset):
    """ppdet's records and sample transforms as a ppdet dataset applies them (Decode, then Resize)."""

    def __init__(self, files):
        from ppdet.data.reader import Compose

        self.roidbs = [{"im_file": str(f), "im_id": np.array([i])} for i, f in enumerate(files)]
        self.transform = Compose([{"Decode": {}}, {"Resize": {"target_size": [32, 32], "keep_ratio": False}}])

    def __len__(self):
        return len(self.roidbs)

    def __getitem__(self, i):
        return self.transform(dict(self.roidbs[i]))


class _Batches:
    """A batch sampler of pairs; ``fresh`` makes the feed draw a new iterator each epoch (--image-weights')."""

    def __init__(self, n, fresh):
        self.n, self.drawn_at_epoch_start = n, fresh

    def __iter__(self):
        yield from ([i, i + 1] for i in range(0, self.n, 2))

    def __len__(self):
        return self.n // 2


class _Reader:
    """ppdet's BaseDataLoader as the feed sees it, built with worker_num 0."""

    def __init__(self, dataset, sampler):
        from ppdet.data.reader import BatchCompose

        self._batch_sampler = sampler
        self.dataloader = paddle.io.DataLoader(dataset, batch_sampler=sampler, num_workers=0,
                                               collate_fn=BatchCompose([], 80, True), return_list=False)
        self.loader = iter(())


def _images(tmp_path, n, bad=None):
    import cv2

    files = []
    for i in range(n):
        path = tmp_path / f"{i:03d}.jpg"
        cv2.imwrite(str(path), np.full((40, 48, 3), 20 * i, np.uint8))
        if i == bad:
            path.write_bytes(path.read_bytes()[:200])   # a truncated JPEG: Decode fails on it
        files.append(path)
    return files


@pytest.mark.timeout(120, method="thread")   # the hang it guards against is in C++: no signal ends it
@pytest.mark.parametrize("fresh", [False, True], ids=["run-long", "per-epoch"])
def test_a_failing_transform_without_workers_reaches_the_trainer(tmp_path, fresh, caplog):
    before = set(threading.enumerate())
    files = _images(tmp_path, 6, bad=3)
    feed = Feed(_Reader(_Images(files), _Batches(6, fresh)))
    seen = []
    with caplog.at_level(logging.ERROR, logger="ppmulti"), pytest.raises(Exception) as err:
        for step, batch in feed.epoch(0, 0, 1):
            seen.append(step)
    feed.close()
    assert seen == [0] and "Blocking queue" not in str(err.value)   # the transform's own error, at batch 1
    lines = [r.getMessage() for r in caplog.records if r.name == "ppmulti"]
    assert len(lines) == 1 and lines[0].startswith(f"loading image {files[3]} failed: ")
    assert not [t for t in threading.enumerate() if t.name == "ppmulti-batches" and t not in before]


def test_without_workers_the_batches_are_the_dataloaders(tmp_path):
    before = set(threading.enumerate())
    dataset = _Images(_images(tmp_path, 4))
    reader = _Reader(dataset, _Batches(4, False))
    theirs = list(iter(reader.dataloader))
    ours = ThreadBatches(dataset, _Batches(4, False), reader.dataloader.collate_fn)
    mine = list(ours)
    assert len(mine) == len(theirs) == 2
    for a, b in zip(mine, theirs):
        assert sorted(a) == sorted(b)
        for key in a:
            assert isinstance(a[key], paddle.Tensor) and a[key].dtype == b[key].dtype
            np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())
    early = ThreadBatches(dataset, _Batches(4, False), reader.dataloader.collate_fn)
    next(early)
    early.close()   # stopped after one batch: its thread ends
    assert not [t for t in threading.enumerate() if t.name == "ppmulti-batches" and t not in before]


@pytest.mark.timeout(120, method="thread")
def test_an_evaluations_pass_without_workers_raises_too(tmp_path):
    from ppmulti.rank.data.feed import Passes

    before = set(threading.enumerate())
    passes = Passes(_Reader(_Images(_images(tmp_path, 4, bad=2)), _Batches(4, False)))
    with pytest.raises(Exception, match="'bytes' object has no attribute 'shape'"):
        for _ in passes.next():
            pass
    passes.close()
    assert not [t for t in threading.enumerate() if t.name == "ppmulti-batches" and t not in before]
