"""Batching rules: YOLOv5's nominal batch and weight decay, --accumulate in the loop (optimizer steps, lr, EMA,
AMP, equivalence with a bigger batch), resume's effective batch, --multi-scale sizes and --image-weights draws."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from ppmulti.common.errors import UserError
from ppmulti.rank.data import sampler as sm
from ppmulti.rank.engine import multiscale
from ppmulti.rank.engine.hooks import EMAHook, Hook
from ppmulti.rank.engine.lr import (BatchPlan, Trained, nominal_accumulate, optimizer_steps, plan_batch, scale_lr,
                                    split_batch, yolov5_weight_decay)
from ppmulti.rank.engine.trainer import Trainer, RunPlan
from toys import ToyModel, toy_batches

# ----------------------------------------------------------------------------- pure rules


@pytest.mark.parametrize("batch,accumulate", [(1, 64), (8, 8), (16, 4), (24, 3), (26, 2), (32, 2), (40, 2),
                                              (48, 1), (64, 1), (96, 1), (128, 1)])
def test_nominal_accumulate_is_yolov5s_rule(batch, accumulate):
    # train.py: accumulate = max(round(nbs / batch_size), 1), nbs = 64 (Python's round: 64/26 = 2.46 -> 2)
    assert nominal_accumulate(batch) == accumulate


@pytest.mark.parametrize("batch", [8, 16, 24, 48, 64, 128])
def test_weight_decay_per_step_is_yolov5s(batch):
    """YOLOv5 keeps lr0 and scales wd by batch x accumulate / 64; here the lr is scaled from the effective
    batch, so lr x coefficient must equal YOLOv5's lr0 x scaled wd at every batch."""
    lr0, wd = 0.01, 0.0005
    acc = nominal_accumulate(batch)
    effective = batch * acc
    yolov5 = lr0 * wd * effective / 64
    for ref_batch in (64, 16):   # the shipped YOLOv5 configs say 64; another ref_batch changes the coefficient
        plan = scale_lr(lr0, ref_batch, effective, dataset_size=6400, warmup_epochs=3)
        assert plan.lr * yolov5_weight_decay(wd, ref_batch) == pytest.approx(yolov5)
    assert yolov5_weight_decay(wd, 64) == wd


PLANS = [
    # world, config per rank, --batch, --accumulate, nominal, trained -> (global, per rank, accumulate)
    (1, 8, None, None, None, None, (8, 8, 1)),
    (2, 8, None, None, None, None, (16, 8, 1)),
    (2, 8, None, 3, None, None, (16, 8, 3)),                # --accumulate for any config
    (1, 16, None, None, 64, None, (16, 16, 4)),             # a YOLOv5 line: nominal batch 64
    (2, 8, 32, None, 64, None, (32, 16, 2)),
    (2, 8, 32, 1, 64, None, (32, 16, 1)),                   # --accumulate 1 turns the nominal rule off
    (4, 8, 128, None, 64, None, (128, 32, 1)),
    (1, 8, None, None, None, Trained(8, 2, 2), (4, 4, 4)),  # 2 ranks x 4 x 2 = 16: same per rank, accumulate 4
    (2, 8, None, None, None, Trained(8, 1, 2), (16, 8, 1)),  # 1 rank x 8 x 2 = 16 on 2 ranks: no accumulation
    (4, 8, None, None, None, Trained(8, 1, 1), (8, 2, 1)),   # 8 on 4 ranks: 2 per rank
    (2, 8, None, None, 64, Trained(16, 2, 4), (16, 8, 4)),  # the trained plan wins over the nominal rule
    (3, 8, None, None, None, Trained(8, 2, 1), None),       # 8 images per step cannot be split over 3 ranks
    (1, 8, 4, None, None, Trained(8, 2, 1), (4, 4, 2)),     # --batch on resume: accumulate keeps 8
    (1, 8, 3, None, None, Trained(8, 2, 1), None),          # ... unless it cannot
    (1, 8, 4, 1, None, Trained(8, 2, 1), (4, 4, 1)),        # --accumulate on resume: the user's new plan
]


@pytest.mark.parametrize("world,per_rank,batch,accumulate,nominal,trained,expected", PLANS)
def test_batch_plan(world, per_rank, batch, accumulate, nominal, trained, expected):
    if expected is None:
        with pytest.raises(UserError) as err:
            plan_batch(world, per_rank, batch, accumulate, nominal, trained)
        assert "effective batch" in str(err.value)
        return
    plan = plan_batch(world, per_rank, batch, accumulate, nominal, trained)
    assert (plan.global_batch, plan.per_rank, plan.accumulate) == expected
    if trained is not None and accumulate is None:
        assert plan.effective_batch == trained.effective_batch


def test_accumulate_must_be_positive():
    with pytest.raises(UserError, match="--accumulate 0"):
        plan_batch(1, 8, accumulate=0)


def test_plan_line_names_effective_batch_and_accumulation():
    text = split_batch(16, 2, 4, "YOLOv5's nominal batch 64").describe()
    assert text == "global batch 16 (8 per rank) x accumulate 4 = effective batch 64 (YOLOv5's nominal batch 64)"
    lr = scale_lr(0.01, 64, 64, dataset_size=640, warmup_steps=40).describe()
    assert lr.startswith("lr 0.01 = base_lr 0.01 x effective batch 64 / ref_batch 64")


@pytest.mark.parametrize("batches,acc,steps", [(10, 1, 10), (10, 2, 5), (10, 3, 4), (10, 4, 3), (3, 8, 1)])
def test_optimizer_steps_per_epoch(batches, acc, steps):
    assert optimizer_steps(batches, acc) == steps


@pytest.mark.parametrize("argv,accumulate,nominal", [
    (["-c", "configs/yolo.yml"], None, None),
    (["--cfg", "yolov5n"], None, 64),                          # a YOLOv5 line: the nominal batch
    (["--data", "x.yaml", "-c", "configs/yolo.yml"], None, 64),
    (["--cfg", "yolov5n", "--accumulate", "2"], 2, 64),        # --accumulate wins (lr.plan_batch)
    (["-c", "configs/yolo.yml", "--accumulate", "3", "--multi-scale", "--image-weights"], 3, None),
])
def test_train_flags_reach_the_options(argv, accumulate, nominal):
    from ppmulti.common import train_flags
    from ppmulti.rank.entry import resolve

    opts = resolve(train_flags.parse(argv))
    assert (opts.accumulate, opts.nominal_batch) == (accumulate, nominal)
    assert opts.multi_scale == opts.image_weights == ("--multi-scale" in argv)


def test_bad_accumulate_is_one_error():
    from ppmulti.common import train_flags
    from ppmulti.rank.entry import resolve

    with pytest.raises(UserError, match="--accumulate 0: give 1"):
        resolve(train_flags.parse(["-c", "configs/yolo.yml", "--accumulate", "0"]))


# ----------------------------------------------------------------------------- the loop


class Steps(Hook):
    """Per step: whether the optimizer stepped, the scheduler's count, the lr used."""

    priority = 5

    def __init__(self):
        self.rows = []

    def after_step(self, trainer, epoch, step, outputs, lr, data_time):
        self.rows.append((epoch, step, trainer.optimizer_stepped, trainer.lr.last_epoch, lr))


def _trainer(batches, accumulate, epochs=1, hooks=(), cfg=None, lr=0.1, schedule=None):
    paddle.seed(0)
    model = ToyModel()
    opt = paddle.optimizer.SGD(learning_rate=schedule if schedule is not None else lr,
                               parameters=model.parameters())
    per_rank = int(batches[0]["x"].shape[0])
    return Trainer(model, batches, opt, lr=schedule, epochs=epochs, hooks=hooks, cfg={"log_iter": 100, **(cfg or {})},
                   opts=RunPlan(config="toy.yml"), world=1, rank=0,
                   batch=BatchPlan(per_rank, per_rank, 1, accumulate))


def test_accumulate_steps_the_optimizer_and_lr_once_per_group():
    """7 batches, accumulate 3: steps after batches 3, 6 and 7 (the short last group) in each epoch; the lr
    schedule counts optimizer steps."""
    rec = Steps()
    schedule = paddle.optimizer.lr.StepDecay(0.1, step_size=1, gamma=0.5)
    trainer = _trainer(toy_batches(7), 3, epochs=2, hooks=[rec], schedule=schedule)
    trainer.train()
    stepped = [r[2] for r in rec.rows]
    assert stepped == [False, False, True, False, False, True, True] * 2
    assert trainer.optimizer_steps == 6 and schedule.last_epoch == 6
    assert [r[4] for r in rec.rows if r[0] == 0] == [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025]
    assert trainer.state.global_step == 14 and trainer.final_metrics["effective_batch"] == 6


def test_batch_8_accumulate_2_equals_batch_16():
    """One optimizer step over two batches of 8 gives the weights of one step over the same 16 samples."""
    big = toy_batches(1, batch=16, seed=3)
    halves = [{k: v[:8] for k, v in big[0].items()}, {k: v[8:] for k, v in big[0].items()}]
    one = _trainer(big, 1)
    one.train()
    two = _trainer(halves, 2)
    two.train()
    assert two.optimizer_steps == 1
    for a, b in zip(one.model.parameters(), two.model.parameters()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    plain = _trainer(halves, 1)   # the control: two steps of 8 end elsewhere
    plain.train()
    assert max(float(np.abs(a.numpy() - b.numpy()).max())
               for a, b in zip(one.model.parameters(), plain.model.parameters())) > 1e-4


def test_ema_updates_once_per_optimizer_step():
    ema = EMAHook()
    trainer = _trainer(toy_batches(6), 2, epochs=2, hooks=[ema], cfg={"use_ema": True, "ema_decay": 0.5})
    trainer.train()
    assert ema.ema.step == trainer.optimizer_steps == 6


class StandInScaler:
    """GradScaler's contract (scale the loss; at ``step`` unscale the summed gradients, then step; ``update``):
    Paddle's own GradScaler is disabled on CPU places, so the step's float16 path is driven by this."""

    def __init__(self, scale: float = 1024.0):
        self.scale_value, self.scaled, self.steps = scale, 0, 0

    def scale(self, loss):
        self.scaled += 1
        return loss * self.scale_value

    def step(self, optimizer):
        for p in optimizer._parameter_list:
            if p.grad is not None:
                p.grad.set_value(p.grad / self.scale_value)
        optimizer.step()
        self.steps += 1

    def update(self):
        pass


def test_grad_scaler_path_accumulates_like_float32():
    """The float16 path (scaled loss every micro-step, unscale + step once per group) ends where float32 does."""
    batches = toy_batches(4, batch=4, seed=5)
    plain = _trainer(batches, 2)
    plain.train()
    scaled = _trainer(batches, 2)
    scaler = scaled.optim.scaler = StandInScaler()   # the step's scaler (engine.optim_step), as AMP's setup makes
    scaled.train()
    assert (scaler.scaled, scaler.steps, scaled.optimizer_steps, scaled.optim.skipped_steps) == (4, 2, 2, 0)
    for a, b in zip(plain.model.parameters(), scaled.model.parameters()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


class StopAt(Hook):
    def __init__(self, step):
        self.step = step

    def after_step(self, trainer, epoch, step, outputs, lr, data_time):
        if step == self.step:
            trainer.stop_training = True


def test_a_stop_inside_an_accumulation_drops_its_batches():
    """Stopped after batch 5 of groups of 3: batches 4-5 never reached the weights, so the checkpoint's
    position is the group boundary (3) and a resume redoes them."""
    trainer = _trainer(toy_batches(9), 3, hooks=[StopAt(4)])
    trainer.train()
    assert trainer.state.step_in_epoch == 3 and trainer.state.global_step == 3 and trainer.optimizer_steps == 1
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0 for p in trainer.model.parameters())


class _IndexData(paddle.io.Dataset):
    """Sample i: x = (i, i, i), so a model can tell which samples it was given."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"x": np.full(3, i, dtype="float32"), "y": np.zeros(1, dtype="float32")}


class _EpochSampler:
    """A batch sampler whose order depends on its epoch, as a shuffle or a weighted draw does: epoch e starts
    at sample e (mod 8)."""

    def __init__(self):
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        order = [(self.epoch + i) % 8 for i in range(8)]
        yield from (order[i:i + 2] for i in range(0, 8, 2))

    def __len__(self):
        return 4


class _Seen(ToyModel):
    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, data):
        self.seen.append(int(data["x"].numpy()[0, 0]))
        return super().forward(data)


class _PpdetLikeReader:
    """ppdet's BaseDataLoader's iteration: an iterator made when built and a new one as each ends."""

    def __init__(self, sampler, workers):
        self._batch_sampler = sampler
        self.dataloader = paddle.io.DataLoader(_IndexData(), batch_sampler=sampler, num_workers=workers)
        self.loader = iter(self.dataloader)

    def __len__(self):
        return 4

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.loader)
        except StopIteration:
            self.loader = iter(self.dataloader)
            raise


@pytest.mark.parametrize("workers", [0, 1])
def test_every_epoch_draws_by_its_own_epoch(workers):
    """Paddle's iterators start drawing indices when made, and ppdet's reader makes the next one before the
    trainer's set_epoch: the loop iterates a fresh one after set_epoch, so epoch e is drawn with epoch e."""
    sampler = _EpochSampler()
    reader = _PpdetLikeReader(sampler, workers)
    paddle.seed(0)
    model = _Seen()
    trainer = Trainer(model, reader, paddle.optimizer.SGD(0.01, parameters=model.parameters()), epochs=3,
                      cfg={"log_iter": 100}, opts=RunPlan(config="toy.yml"), world=1, rank=0)
    trainer.train()
    # each epoch's first samples of its 4 batches: epoch e's order starts at e
    assert model.seen == [0, 2, 4, 6, 1, 3, 5, 7, 2, 4, 6, 0], model.seen


# ----------------------------------------------------------------------------- --multi-scale


def test_multi_scale_sizes_are_yolov5s_range_and_independent_of_the_global_rng():
    sizes = []
    for step in range(300):
        np.random.seed(step)   # what a rank's augmentation seeding does: must not matter
        sizes.append(multiscale.draw_size(640, seed=0, epoch=1, step=step))
    assert all(s % 32 == 0 and 320 <= s <= 960 for s in sizes)
    assert min(sizes) == 320 and max(sizes) == 960 and len(set(sizes)) == 21
    again = [multiscale.draw_size(640, seed=0, epoch=1, step=step) for step in range(300)]
    assert again == sizes
    assert [multiscale.draw_size(640, 1, 1, s) for s in range(300)] != sizes   # the seed matters


def test_resize_batch_scales_images_and_boxes_together():
    image = paddle.rand([2, 3, 128, 96])
    box = paddle.to_tensor([[[10.0, 20.0, 50.0, 100.0]], [[0.0, 0.0, 96.0, 128.0]]])
    data = {"image": image, "gt_bbox": box, "pad_gt_mask": paddle.ones([2, 1, 1]),
            "im_shape": paddle.to_tensor([[128.0, 96.0]] * 2), "scale_factor": paddle.ones([2, 2])}
    h, w = multiscale.resize_batch(data, 192)
    assert (h, w) == (192, 160)   # long side 192; 96 x 1.5 = 144 -> up to a multiple of 32
    assert list(data["image"].shape) == [2, 3, 192, 160]
    np.testing.assert_allclose(data["gt_bbox"].numpy()[1, 0], [0, 0, 160, 192], rtol=1e-6)
    np.testing.assert_allclose(data["gt_bbox"].numpy()[0, 0], [10 * 160 / 96, 30, 50 * 160 / 96, 150], rtol=1e-6)
    np.testing.assert_allclose(data["im_shape"].numpy()[0], [192, 160])
    np.testing.assert_allclose(data["scale_factor"].numpy()[0], [1.5, 160 / 96], rtol=1e-6)
    u8 = {"image": paddle.full([1, 3, 64, 64], 200, dtype="uint8")}
    assert multiscale.resize_batch(u8, 32) == (32, 32) and u8["image"].dtype == paddle.uint8
    assert int(u8["image"].numpy().max()) == 200


# ----------------------------------------------------------------------------- --image-weights


def test_class_and_image_weights_are_yolov5s():
    labels = [np.array([0, 0, 1]), np.array([0]), np.array([2]), np.array([], dtype=np.int64)]
    cw = sm.class_weights(labels, 4)
    # counts 3, 1, 1, 0 (-> 1): weights 1/3, 1, 1, 1, normalised
    np.testing.assert_allclose(cw, np.array([1 / 3, 1, 1, 1]) / (10 / 3))
    iw = sm.image_weights(labels, 4, cw)
    np.testing.assert_allclose(iw, [cw[0] * 2 + cw[1], cw[0], cw[2], 0.0])
    maps = np.array([0.0, 0.0, 1.0, 0.0])   # a class at mAP 1 is no longer favoured
    assert sm.epoch_weights(labels, 4, maps)[2] == 0


def test_two_ranks_take_disjoint_shards_of_one_draw():
    dataset = type("D", (), {"roidbs": [{"gt_class": np.array([[i % 3]])} for i in range(50)]})()
    shards = []
    for rank in range(2):
        s = sm.ImageWeightsBatchSampler(dataset, batch_size=4, num_classes=3, rank=rank, world=2, drop_last=False,
                                        seed=7)
        s.set_epoch(2)
        shards.append([i for batch in s for i in batch])
        assert len(list(s)) == len(s) == 7
    draw = sm.weighted_draw(sm.epoch_weights(s.labels(), 3, None), 7, 2)
    assert shards[0] == [int(i) for i in draw[0::2]] and shards[1] == [int(i) for i in draw[1::2]]
    s.set_epoch(3)
    assert [i for batch in s for i in batch] != shards[1]   # a new draw each epoch


def test_a_rare_class_is_drawn_more_often():
    labels = [np.array([1])] * 5 + [np.array([0])] * 95   # class 1 in 5% of the images
    draw = sm.weighted_draw(sm.epoch_weights(labels, 2, None), seed=0, epoch=0)
    rare = np.isin(draw, np.arange(5)).mean()
    assert rare > 0.35   # weights 1/5 vs 1/95 per image: about half of the draw


def test_class_maps_from_pycocotools_precision():
    from types import SimpleNamespace

    from ppmulti.rank.engine.evaluator import class_maps

    precision = -np.ones((10, 101, 3, 4, 3))
    precision[:, :, 0, 0, -1] = 0.5
    precision[:, :, 2, 0, -1] = 0.25
    ev = SimpleNamespace(eval={"precision": precision}, params=SimpleNamespace(catIds=[1, 2, 3]))
    assert class_maps(ev, {1: 0, 2: 1, 3: 2}, overall=0.4) == [0.5, 0.4, 0.25]


# ----------------------------------------------------------------------------- real trainings (slow)


def _recorded(out, rank):
    import json

    return json.loads((out / f"batching.rank{rank}.json").read_text())


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_ranks_accumulate_multi_scale_image_weights_then_resume_on_one(small_demo, tmp_path, repo):
    """2 gloo ranks, --batch 8 --accumulate 2 --multi-scale --image-weights, 2 epochs of the demo (48 images):
    6 batches and 3 optimizer steps per epoch and rank, micro-step gradients kept local (they differ between
    ranks) and the weights equal after; every step one image size on both ranks; each epoch the ranks' images
    are the two shards of that epoch's weighted draw. Resumed on 1 rank: the effective batch 16 stays (4 per
    rank x accumulate 4)."""
    import json
    import re

    from conftest import DEMO_CONFIG, demo_overrides, run_tool

    script = str(repo / "tests" / "fixtures" / "batching_train.py")
    out = tmp_path / "run"
    common = ["-c", str(DEMO_CONFIG), "-o", *demo_overrides(small_demo), "--workers", "0", "--output", str(out)]
    proc = run_tool(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", script, *common, "--batch", "8",
                     "--accumulate", "2", "--multi-scale", "--image-weights", "--epochs", "2"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first = (out / "train.log").read_text()
    assert ("world size 2, global batch 8 (4 per rank) x accumulate 2 = effective batch 16 (--accumulate 2), "
            "6 batches (3 optimizer steps) per epoch; lr ") in first
    lr_said = re.search(r"lr \S+ = base_lr \S+ x effective batch 16 / ref_batch 16", first).group(0)
    ranks = [_recorded(out, r) for r in (0, 1)]
    for rec in ranks:
        assert [s["stepped"] for s in rec["steps"]] == [False, True] * 6
        assert rec["optimizer_steps"] == 6 and rec["lr_end"] - rec["lr_start"] == 6
    micro = [[s["grad"] for s in rec["steps"] if not s["stepped"]] for rec in ranks]
    assert all(a != pytest.approx(b, rel=1e-4) for a, b in zip(*micro)), micro   # not all-reduced
    assert ranks[0]["weights"] == pytest.approx(ranks[1]["weights"], rel=1e-6)
    sizes = [[tuple(s["size"]) for s in rec["steps"]] for rec in ranks]
    assert sizes[0] == sizes[1], sizes
    assert len(set(sizes[0])) > 1 and all(v % 32 == 0 and 64 <= v <= 192 for size in sizes[0] for v in size)
    for epoch in (0, 1):
        draw = ranks[0]["epochs"][epoch]["draw"]
        assert ranks[0]["epochs"][epoch]["shard"] == draw[0::2] and ranks[1]["epochs"][epoch]["shard"] == draw[1::2]
    assert ranks[0]["epochs"][0]["draw"] != ranks[0]["epochs"][1]["draw"]

    proc = run_tool([script, *common, "--resume", str(out), "--epochs", "3"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (out / "train.log").read_text()[len(first):]
    assert ("resuming a run of 2 ranks on 1 ranks: the effective batch stays 16 (global batch 4, 4 per rank, "
            "x accumulate 4)") in log, log[-3000:]
    assert "global batch 4 (4 per rank) x accumulate 4 = effective batch 16" in log
    assert lr_said in log and "lr rescaled" not in log
    one = _recorded(out, 0)
    assert [s["stepped"] for s in one["steps"]] == [False, False, False, True] * 3   # 12 batches of 4
    assert one["optimizer_steps"] == 3 and (one["lr_start"], one["lr_end"]) == (6, 9)   # the schedule goes on
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["world_size"], metrics["global_batch"], metrics["accumulate"], metrics["effective_batch"],
            metrics["epochs"]) == (1, 4, 4, 16, 3)


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_loopback_nodes_accumulate_multi_scale_image_weights_with_a_ram_cache(small_demo, tmp_path, repo):
    """Two ``ppmulti launch`` nodes on loopback, one rank each, a YOLOv5 command line with --batch 8
    --accumulate 2 --multi-scale --image-weights --cache ram, 1 epoch: both ranks step the optimizer on the same
    micro-steps, train every step at the same image size, take the two shards of one weighted draw, and end with
    equal weights."""
    from launching import Launches, free_ports, launch_env

    script = str(repo / "tests" / "fixtures" / "batching_train.py")
    out = tmp_path / "runs" / "exp"
    port = free_ports(2)
    launches = Launches(tmp_path)
    try:
        nodes = []
        for rank in (1, 0):
            flags = ["--nnodes", "2", "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port",
                     str(port), "--node_rank", str(rank), "--log_dir", str(tmp_path / f"log{rank}")]
            nodes.append(launches.start(*flags, script, "--data", str(small_demo / "data.yaml"), "--cfg", "yolov5n",
                                        "--weights", "", "--img", "64", "--workers", "0", "--batch", "8",
                                        "--accumulate", "2", "--multi-scale", "--image-weights", "--cache", "ram",
                                        "--epochs", "1", "--noval", "--project", str(tmp_path / "runs"), "--name",
                                        "exp", env=launch_env()))
        codes = [launches.wait(node, timeout=400) for node in nodes]
        assert codes == [0, 0], [launches.output(node)[-3000:] for node in nodes]
    finally:
        launches.close()
    log = (out / "train.log").read_text()
    assert "x accumulate 2 = effective batch 16 (--accumulate 2)" in log
    ranks = [_recorded(out, r) for r in (0, 1)]
    for rec in ranks:
        assert [s["stepped"] for s in rec["steps"]] == [False, True] * 3
    assert ranks[0]["weights"] == pytest.approx(ranks[1]["weights"], rel=1e-6)
    sizes = [[tuple(s["size"]) for s in rec["steps"]] for rec in ranks]
    assert sizes[0] == sizes[1], sizes
    draw = ranks[0]["epochs"][0]["draw"]
    assert ranks[0]["epochs"][0]["shard"] == draw[0::2] and ranks[1]["epochs"][0]["shard"] == draw[1::2]


@pytest.mark.slow
def test_yolov5_line_accumulates_to_64_with_multi_scale_and_image_weights(small_demo, tmp_path, repo):
    """A YOLOv5 command line, one process: --batch 8 accumulates up to 8 batches (YOLOv5's nominal 64) once
    YOLOv5's warmup has ramped it, YOLOv5's loss trains at the drawn sizes, the images come from the weighted
    sampler, and the log says the plan."""
    import json

    from conftest import run_tool

    script = str(repo / "tests" / "fixtures" / "batching_train.py")
    proc = run_tool([script, "--data", str(small_demo / "data.yaml"), "--cfg", "yolov5n", "--weights", "",
                     "--img", "64", "--epochs", "1", "--batch", "8", "--workers", "0", "--multi-scale",
                     "--image-weights", "--project", str(tmp_path / "runs"), "--name", "exp"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "runs" / "exp"
    log = (run / "train.log").read_text()
    assert ("world size 1, global batch 8 (8 per rank) x accumulate 8 = effective batch 64 (YOLOv5's nominal "
            "batch 64; --accumulate N overrides), 6 batches (1 optimizer step after the warmup) per epoch; lr 0.01 = "
            "base_lr 0.01 x effective batch 64 / ref_batch 64; YOLOv5's warmup over the first 2 batches") in log
    assert "weight decay 0.0005 x the lr scaled from effective batch 64 / ref_batch 64" in log
    assert ("YOLOv5's warmup, first 2 batches: batches per optimizer step from 1 to 8, lr from 0, biases' lr from "
            "0.1 (warmup_bias_lr), momentum from 0.8 (warmup_momentum)") in log
    rec = _recorded(run, 0)
    # a 6-batch run warms up a third of itself: the first batch steps alone (a group of round(1 + 7 x 0 / 2) = 1),
    # then the groups need 4 and 8 batches, so the epoch's last batch ends the second; the lr counts batches
    assert [s["stepped"] for s in rec["steps"]] == [True] + [False] * 4 + [True]
    assert rec["lr_end"] - rec["lr_start"] == 6
    sizes = {tuple(s["size"]) for s in rec["steps"]}
    assert len(sizes) > 1 and all(v % 32 == 0 and 32 <= v <= 96 for size in sizes for v in size)
    assert sorted(rec["epochs"][0]["shard"]) != list(range(48))   # drawn with replacement by weight
    assert json.loads((run / "metrics.json").read_text())["effective_batch"] == 64


@pytest.mark.seam
@pytest.mark.slow
@pytest.mark.multiproc
def test_two_ranks_accumulating_equal_one_rank_with_the_whole_batch(tmp_path, repo):
    """3 optimizer steps over the same 16 samples each: 1 rank x 16 and 2 ranks x 4 x accumulate 2 end with the
    same weights (gradients kept local over the micro-steps, summed, all-reduced once); 1 rank x 8 x accumulate 2
    too; the control, the same 48 samples in 6 steps of 8, ends elsewhere."""
    from conftest import run_tool

    script = str(repo / "tests" / "fixtures" / "accumulate_equivalence.py")
    one = run_tool([script, str(tmp_path / "one.npz"), "16", "1", "3"])
    assert one.returncode == 0, one.stderr[-2000:]
    acc = run_tool([script, str(tmp_path / "acc.npz"), "8", "2", "3"])
    assert acc.returncode == 0, acc.stderr[-2000:]
    two = run_tool(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", script, str(tmp_path / "two.npz"),
                    "4", "2", "3"], cwd=tmp_path)
    assert two.returncode == 0, two.stdout[-2000:] + two.stderr[-2000:]
    half = run_tool([script, str(tmp_path / "half.npz"), "8", "1", "3"])
    assert half.returncode == 0, half.stderr[-2000:]

    def weights(name):
        data = np.load(tmp_path / name)
        return {k: data[k] for k in data.files}

    a, b, c, d = weights("one.npz"), weights("acc.npz"), weights("two.npz"), weights("half.npz")
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a[key], c[key], rtol=1e-5, atol=1e-6)
    assert max(np.abs(a[k] - d[k]).max() for k in a) > 1e-4
