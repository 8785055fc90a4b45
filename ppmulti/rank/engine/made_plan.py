"""What rank 0 makes of a run once the world and the data are known (batch and LR plans), shared with every rank."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from ppmulti.common.errors import UserError
from ppmulti.rank.engine.lr import BatchPlan, LRPlan
from ppmulti.rank.plan import MADE_SECTION


@dataclass(frozen=True)
class MadePlan:
    """The numbers a run trains with that need the ranks' world and the loaded data: the batch plan (after a
    training set smaller than the batch shrank it), the LR plan, YOLOv5's warmup in batches (0: none) and the
    steps per epoch the lr schedule counts (optimizer steps, or batches under YOLOv5's warmup). Rank 0 makes it
    and every rank trains with it (``dist.made_on_main``); rank 0 saves it in run_plan.json."""

    batch: BatchPlan
    lr: LRPlan
    warmup_batches: int = 0
    steps_per_epoch: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MadePlan":
        return cls(batch=BatchPlan(**data["batch"]), lr=LRPlan(**data["lr"]),
                   warmup_batches=int(data.get("warmup_batches", 0)),
                   steps_per_epoch=int(data.get("steps_per_epoch", 1)))


def plan_file_text(run_plan_json: str, made: MadePlan | None = None) -> str:
    """run_plan.json's text: the RunPlan the ranks were given, with rank 0's MadePlan under ``made`` once made."""
    data = json.loads(run_plan_json)
    if made is not None:
        data[MADE_SECTION] = made.to_dict()
    return json.dumps(data, sort_keys=True) + "\n"


def read_made(text: str) -> MadePlan | None:
    """The MadePlan saved in a run_plan.json's text (None in one written before the plan was made)."""
    data = json.loads(text).get(MADE_SECTION)
    return None if data is None else MadePlan.from_dict(data)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")   # an object's repr differs between processes by its address only


def config_digest(plain: dict[str, Any]) -> dict[str, str]:
    """A short digest of each top-level key of an edited config as plain data (config.resolved): equal on two
    ranks when they read the same files with the same flags, and naming the keys where they differ."""
    out = {}
    for key, value in plain.items():
        text = _ADDRESS.sub("", json.dumps(value, sort_keys=True, default=repr))
        out[str(key)] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return out


def refuse_differing(digests: list[dict[str, str]], config: str) -> None:
    """One line, the same on every rank, when a rank's edited config differs from rank 0's (``digests``: every
    rank's config_digest, by rank): typically a config, dataset or data yaml that differs between the machines
    of a multi-node run. Rank 0's batch and LR plans would not fit the config such a rank builds from."""
    first = digests[0]
    differ = {rank: sorted(k for k in set(d) | set(first) if d.get(k) != first.get(k))
              for rank, d in enumerate(digests) if d != first}
    if not differ:
        return
    keys = sorted(set().union(*differ.values()))
    shown = ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
    ranks = ", ".join(str(r) for r in differ)
    raise UserError(f"the config of rank{'s' if len(differ) > 1 else ''} {ranks} differs from rank 0's in {shown}: "
                    f"every machine must read the same {config} (and the files it names: _BASE_, --data, --cfg, "
                    f"--hyp); copy rank 0's files to every node")


def refuse_other_data(sizes: list[int], section: str = "TrainDataset") -> None:
    """One line, the same on every rank, when a rank loaded another number of training images than rank 0
    (``sizes``: every rank's count, by rank): its loader would run another number of steps than rank 0's plan
    counts, and the ranks' collectives would wait for each other at the end of an epoch."""
    differ = [rank for rank, n in enumerate(sizes) if n != sizes[0]]
    if differ:
        which = ", ".join(f"rank {r} {sizes[r]}" for r in differ)
        raise UserError(f"the training set ({section}) has {sizes[0]} images on rank 0 but {which}: every machine "
                        f"must read the same dataset (the same annotation file and images); copy rank 0's to every "
                        f"node")
