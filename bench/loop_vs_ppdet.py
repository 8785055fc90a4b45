"""ppmulti's training loop against ppdet's own Trainer on the same config, side by side in one run.

Reports images/s of each (the first two steps excluded) and their ratio. The per-step losses of both
are printed for a look only: they start alike but do not match step for step, because ppdet's
augmentations draw from global RNG states that the two runs seed differently.
"""

from __future__ import annotations

import argparse
import json
import time


def run_ppdet(config: str, overrides: list[str], steps: int, seed: int) -> tuple[list[float], float]:
    import paddle
    from ppdet.engine import Trainer
    from ppdet.engine.callbacks import Callback

    from ppmulti import config as config_mod

    cfg = config_mod.load(config, overrides + ["log_iter=1", "use_vdl=false"])
    paddle.set_device("cpu")
    paddle.seed(seed)
    losses: list[float] = []
    times: list[float] = []

    class Stop(Exception):
        pass

    class Capture(Callback):
        def on_step_end(self, status):
            if status.get("mode") != "train":
                return
            losses.append(float(status["training_staus"].get()["loss"]))
            times.append(time.time())
            if len(losses) >= steps:
                raise Stop

    trainer = Trainer(cfg, mode="train")
    trainer._callbacks = [Capture(trainer)]
    from ppdet.engine.callbacks import ComposeCallback

    trainer._compose_callback = ComposeCallback(trainer._callbacks)
    try:
        trainer.train(validate=False)
    except Stop:
        pass
    return losses, _ips(times, int(cfg.TrainReader["batch_size"]))


def run_ppmulti(config: str, overrides: list[str], steps: int, seed: int, out: str) -> tuple[list[float], float]:
    from ppmulti.engine.hooks import Hook
    from ppmulti.engine.trainer import Trainer, TrainOptions

    losses: list[float] = []
    times: list[float] = []

    class Stop(Exception):
        pass

    class Capture(Hook):
        def after_step(self, trainer, epoch, step, outputs, lr, data_time):
            losses.append(float(outputs["loss"].numpy().reshape(-1)[0]))
            times.append(time.time())
            if len(losses) >= steps:
                raise Stop

    trainer = Trainer(TrainOptions(config=config, overrides=overrides, seed=seed, output=out, exist_ok=True))
    trainer.register(Capture())
    try:
        trainer.train()
    except Stop:
        pass
    return losses, _ips(times, trainer.batch.global_batch)


def _ips(times: list[float], batch: int) -> float:
    """Images/s over the steps after the first two (warm-up excluded)."""
    if len(times) < 4:
        return 0.0
    return (len(times) - 2) * batch / (times[-1] - times[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-c", "--config", default="configs/demo/ppyoloe_demo.yml")
    ap.add_argument("-o", nargs="*", default=[])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="output/bench_loop")
    args = ap.parse_args()
    import paddle

    paddle.base.core.set_num_threads(2)
    a_losses, a_ips = run_ppdet(args.config, args.o, args.steps, args.seed)
    b_losses, b_ips = run_ppmulti(args.config, args.o, args.steps, args.seed, args.out)
    print(json.dumps({"ppdet_trainer_img_s": round(a_ips, 3), "ppmulti_img_s": round(b_ips, 3),
                      "ratio": round(b_ips / a_ips, 3) if a_ips else None,
                      "ppdet_losses": [round(x, 4) for x in a_losses],
                      "ppmulti_losses": [round(x, 4) for x in b_losses]}, indent=1))


if __name__ == "__main__":
    main()
