"""Training callbacks for tests/test_yolo_api.py, importable by the ranks: each call appends one JSON line to the
file named by YOLO_API_TEST_LOG."""

import json
import os


def record(run) -> None:
    line = {"event": run.event, "rank": run.rank, "world": run.world_size, "epoch": run.epoch,
            "epochs": run.epochs, "metrics": sorted(run.metrics), "losses": sorted(run.loss_items),
            "save_dir": None if run.save_dir is None else str(run.save_dir)}
    with open(os.environ["YOLO_API_TEST_LOG"], "a") as f:
        f.write(json.dumps(line) + "\n")


def stop_after_first_epoch(run) -> None:
    if run.epoch >= 0:
        run.stop = True


class NotAFunction:
    def __call__(self, run) -> None:
        pass
