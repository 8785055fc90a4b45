"""Where one CPU training step of the demo config spends its time, by operator (Paddle's profiler).

Answers "why does one Paddle process keep about one core busy": in Paddle 2.6 on CPU only the BLAS
GEMM inside conv2d / matmul runs on several threads (MKL, sized by ``set_num_threads``); the other
kernels (elementwise, activations, batch norm, reductions, im2col, the optimizer) run on one thread.
The share of time in GEMM-bearing ops bounds what a second thread can give (Amdahl). Prints the top
operators and that share, for the thread count given.

    PPMULTI_CPU_THREADS=1 python bench/op_profile.py --data DIR
"""

from __future__ import annotations

import argparse
import io
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# forward ops are listed as "<op> dygraph", backward ones as their grad nodes
GEMM_OPS = ("conv2d dygraph", "depthwise_conv2d dygraph", "matmul dygraph", "Conv2dGradNodeFinal",
            "DepthwiseConv2dGradNodeFinal", "MatmulGradNodeFinal", "MatmulGradNode")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a demo dataset (ppmulti data demo DIR)")
    ap.add_argument("--config", default=str(REPO / "configs/demo/ppyoloe_demo.yml"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6, help="profiled steps (after 3 warm-up steps)")
    ap.add_argument("--dump", default="/tmp/ppmulti_op_profile.txt", help="where the profiler's own table goes")
    args = ap.parse_args()
    import paddle.profiler as profiler

    from ppmulti.rank.engine.hooks import Hook
    from ppmulti.rank.engine.builder import build_trainer
    from ppmulti.rank.engine.trainer import RunPlan

    # no trace export: Paddle's default would write ./profiler_log into the working directory
    prof = profiler.Profiler(targets=[profiler.ProfilerTarget.CPU], timer_only=False, on_trace_ready=lambda p: None)

    class Stop(Exception):
        pass

    class Profile(Hook):
        n = 0

        def after_step(self, trainer, epoch, step, outputs, lr, data_time):
            self.n += 1
            if self.n == 3:
                prof.start()
            elif self.n > 3:
                prof.step()
            if self.n == 3 + args.steps:
                prof.stop()
                raise Stop

    d = args.data
    overrides = [f"{s}.dataset_dir={d}" for s in ("TrainDataset", "EvalDataset", "TestDataset")]
    opts = RunPlan(config=args.config, batch=args.batch, epochs=1000, output="/tmp/ppmulti_op_profile",
                   exist_ok=True, overrides=[*overrides, "snapshot_epoch=100000"])
    trainer = build_trainer(opts)
    trainer.register(Profile())
    try:
        trainer.train()
    except Stop:
        pass
    buf = io.StringIO()
    with redirect_stdout(buf):
        prof.summary(sorted_by=profiler.SortedKeys.CPUTotal, op_detail=False,
                     views=[profiler.SummaryView.OperatorView], time_unit="ms")
    text = buf.getvalue()
    Path(args.dump).write_text(text)
    rows = []
    text = text.split("Thread: All threads merged")[-1].split("\n\n")[0]   # the merged table only
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9_]+(?: dygraph)?)\s+(\d+)\s+([0-9.]+)\s*/", line)
        if m:
            rows.append((m.group(1), int(m.group(2)), float(m.group(3))))
    total = sum(r[2] for r in rows)
    gemm = sum(r[2] for r in rows if r[0] in GEMM_OPS)
    print(f"threads {getattr(trainer, 'threads', '?')}; {args.steps} steps; operator time {total:.0f} ms")
    for name, calls, ms in sorted(rows, key=lambda r: -r[2])[:15]:
        print(f"  {name:28s} {calls:6d} calls {ms:9.1f} ms {ms / total:6.1%}")
    print(f"GEMM-bearing ops (conv2d/matmul and their grads): {gemm / total:.1%} of operator time")
    print(f"=> at most {1 / (1 - gemm / total / 2):.2f}x from a second thread if those ops scaled perfectly")


if __name__ == "__main__":
    main()
