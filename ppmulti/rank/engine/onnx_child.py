"""The conversion step alone, as a child process (`python -m ppmulti.rank.engine.onnx_child MODEL_DIR OPSET OUT`):
paddle2onnx converts the inference model and OUT receives the ONNX bytes; its native crashes end only this process
(ppmulti/procs/onnx_convert.py starts it and reads how it ended)."""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    model_dir, opset, out = argv if argv is not None else sys.argv[1:]
    from ppmulti.rank import compat

    try:
        data = compat.paddle_to_onnx(model_dir, int(opset))
    except RuntimeError as exc:
        print(f"error: {(str(exc).strip().splitlines() or ['no message'])[-1]}", file=sys.stderr)
        return 1
    Path(out).write_bytes(data)   # into the parent's temporary directory; the parent writes the user's file
    return 0


if __name__ == "__main__":
    sys.exit(main())
