"""What rank 0 makes for every rank: the MadePlan's round trip through run_plan.json, the ranks' config digests,
and dist.made_on_main in a world of threads (rank 0's value everywhere, one refusal on every rank, no hang)."""

from __future__ import annotations

import json
import threading

import pytest

from ppmulti.common.errors import UserError
from ppmulti.rank import dist
from ppmulti.rank.engine.lr import BatchPlan, LRPlan
from ppmulti.rank.engine.made_plan import (MadePlan, config_digest, plan_file_text, read_made,
                                           refuse_differing, refuse_other_data)
from ppmulti.rank.plan import ConfigEdit, RunPlan

MADE = MadePlan(batch=BatchPlan(16, 8, 2, 4, "YOLOv5's nominal batch 64; --accumulate N overrides"),
                lr=LRPlan(0.01, 0.01, 64, 64, 0, 100, yolov5_warmup=True, ref_source="-o ref_batch=64"),
                warmup_batches=100, steps_per_epoch=12)


def test_run_plan_json_keeps_the_run_plan_and_adds_what_rank_0_made():
    plan = RunPlan(config="configs/yolo.yml", overrides=("epoch=3",), batch=16, edit=ConfigEdit(imgsz=128))
    text = plan_file_text(plan.to_json(), MADE)
    data = json.loads(text)
    assert data["batch"] == 16   # the RunPlan's --batch, untouched beside the made section
    assert data["made"]["batch"]["per_rank"] == 8 and data["made"]["lr"]["warmup_steps"] == 100
    assert RunPlan.from_json(text) == plan   # readers of the RunPlan read it as before
    assert read_made(text) == MADE
    assert read_made(plan_file_text(plan.to_json())) is None   # written at the start, before the plan was made


def test_config_digest_is_per_key_and_ignores_object_addresses():
    cfg = {"epoch": 3, "TrainReader": {"batch_size": 8}, "op": "<Foo object at 0x7f00aa>"}
    same = {"epoch": 3, "TrainReader": {"batch_size": 8}, "op": "<Foo object at 0x7f11bb>"}
    assert config_digest(cfg) == config_digest(same)
    other = config_digest({**cfg, "TrainReader": {"batch_size": 4}})
    assert [k for k in other if other[k] != config_digest(cfg)[k]] == ["TrainReader"]


def test_refuse_differing_names_the_ranks_and_keys():
    a = config_digest({"epoch": 3, "TrainDataset": {"dataset_dir": "/data"}})
    b = config_digest({"epoch": 3, "TrainDataset": {"dataset_dir": "/other"}})
    refuse_differing([a, a, a], "c.yml")   # all the same: nothing said
    with pytest.raises(UserError) as err:
        refuse_differing([a, b, a, b], "configs/x.yml")
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("the config of ranks 1, 3 differs from rank 0's in TrainDataset: every machine must "
                           "read the same configs/x.yml"), line


def test_refuse_other_data_names_the_ranks_and_their_counts():
    refuse_other_data([48, 48])
    with pytest.raises(UserError, match=r"^the training set \(TrainDataset\) has 48 images on rank 0 but rank 2 40: "
                                        r"every machine must read the same dataset"):
        refuse_other_data([48, 48, 40])


def _world(n: int, body, timeout: float = 10.0) -> list[tuple[str, object]]:
    """Run ``body(rank, gather)`` on ``n`` threads whose ``gather`` behaves as all_gather_object (every rank's
    object, by rank, once all have sent theirs); each rank's ("ok", value) or ("raised", exception)."""
    barrier, slots, results = threading.Barrier(n), [None] * n, [None] * n

    def gather_for(rank):
        def gather(obj):
            slots[rank] = obj
            barrier.wait(timeout)
            out = list(slots)
            barrier.wait(timeout)
            return out
        return gather

    def run(rank):
        try:
            results[rank] = ("ok", body(rank, gather_for(rank)))
        except Exception as exc:   # noqa: BLE001 - the test looks at what each rank raised
            results[rank] = ("raised", exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank hangs"
    return results


def test_every_rank_takes_rank_0s_plan_and_only_the_others_follow():
    made, followed = [], []

    def body(rank, gather):
        def make():
            made.append(rank)
            return MADE
        return dist.made_on_main(make, follow=lambda m: followed.append((rank, m)), mine={"epoch": "x"},
                                 check=lambda d: refuse_differing(d, "c.yml"), gather=gather, main=rank == 0)

    results = _world(3, body)
    assert results == [("ok", MADE)] * 3
    assert made == [0] and sorted(followed) == [(1, MADE), (2, MADE)]


def test_a_rank_with_another_config_stops_every_rank_with_one_line():
    def body(rank, gather):
        digest = config_digest({"epoch": 3, "num_classes": 80 if rank == 1 else 3})
        return dist.made_on_main(lambda: MADE, follow=lambda m: None, mine=digest,
                                 check=lambda d: refuse_differing(d, "configs/demo.yml"), gather=gather,
                                 main=rank == 0)

    results = _world(2, body)
    assert [kind for kind, _ in results] == ["raised", "raised"]
    lines = {str(exc) for _, exc in results}
    assert len(lines) == 1 and all(isinstance(exc, UserError) for _, exc in results)
    assert lines.pop().startswith("the config of rank 1 differs from rank 0's in num_classes: every machine "
                                  "must read the same configs/demo.yml")


def test_rank_0s_refusal_is_every_ranks_and_its_failure_stops_the_others():
    def refused(rank, gather):
        def make():
            raise UserError("--batch 3 is not divisible by the world size 2")
        return dist.made_on_main(make, gather=gather, main=rank == 0)

    results = _world(2, refused)
    assert all(kind == "raised" and isinstance(exc, UserError) and str(exc).startswith("--batch 3")
               for kind, exc in results)

    def broken(rank, gather):
        def make():
            raise KeyError("LearningRate")
        return dist.made_on_main(make, gather=gather, main=rank == 0)

    (kind0, exc0), (kind1, exc1) = _world(2, broken)
    assert isinstance(exc0, KeyError)   # rank 0 raises its own failure, with its traceback
    assert isinstance(exc1, RuntimeError) and "rank 0 stopped while making the plan (KeyError" in str(exc1)


def test_alone_the_plan_is_made_without_a_gather():
    assert dist.made_on_main(lambda: MADE, follow=lambda m: pytest.fail("a lone rank follows no one")) == MADE
