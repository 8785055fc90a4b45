"""The interface a tracker (VisualDL, TensorBoard, MLflow) offers the trackers hook."""

from __future__ import annotations

from pathlib import Path


class Tracker:
    """What the hook asks of a tracker; each method may raise (the hook then stops using that tracker)."""

    label = "tracker"

    def hparams(self, hp: dict) -> None: ...

    def scalars(self, values: dict[str, float], step: int) -> None: ...

    def pictures(self, paths: list[Path], step: int) -> None: ...

    def files(self, paths: list[Path]) -> None: ...

    def flush(self) -> None: ...

    def close(self, status: str) -> None:
        """``status``: FINISHED, KILLED (stopped by a signal) or FAILED (training raised)."""

    def redact(self, text: str) -> str:
        return text
