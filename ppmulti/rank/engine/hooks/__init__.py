"""The training hooks, one concern per module; the Trainer's loop only calls them (points: ``base.HOOK_POINTS``).

Built-in hooks in the order they run at every point (ascending ``priority``); "core" ones come with every
Trainer built from options (engine.builder), the reporting ones with ``Trainer.default_hooks()`` (or, in a
built run, when no hook was chosen). A Trainer built from parts runs the hooks it is given, no others:

prio hook              module       does                                                    state in a checkpoint
3    ProfilerHook      profiler     -o profiler_options: paddle.profiler over its steps, a  -
                                    trace per rank, the summary on rank 0 (PaddleDetection's)
5    YOLOv5WarmupHook  warmup       YOLOv5's warmup per batch: biases' lr from warmup_bias_lr, -
                                    momentum from warmup_momentum (YOLOv5 command lines)
10   EMAHook           ema          builds ModelEMA; updates it right after each optimizer  ema: averaged weights,
                                    step; not after an accumulation's micro-steps (core)    update count
12   MixedPrecisionHook amp         the step's precision (--amp): float16 autocast + loss   amp: GradScaler scale
                                    scaling (GPU) or bf16 convolutions (CPU); skipped steps  and counters, skipped
                                    -> stats.amp (core)                                     steps
20   ResumeHook        resume       engine.resume_plan's decision at build; restores the    resume: epochs
                                    model, optimizer, lr, counters, rng, every hook (core)  planned
30   EvaluationHook    evaluation   COCO mAP with the EMA weights on snapshot/last epochs   -
                                    -> stats.metrics (core)
35   ImageWeightsHook  image_weights  per-class mAP of the last evaluation to the          image_weights:
                                    --image-weights sampler before each epoch               per-class mAP
40   EarlyStopHook     early_stop   best fitness; --patience sets trainer.stop_training     early_stop: best
                                    (core)                                                  fitness and epoch
45   LossWatchHook     loss_watch   a loss component non-finite or 1000x its running value: -
                                    one WARNING line, the first time (core)
50   ConsoleLogHook    console      step lines, "epoch N done" line, terminal bars          -
60   CheckpointHook    checkpoint   weights/last|best|epochN; the save on a signal (core)   checkpoint: best mAP
70   ResultsHook       results      results.csv rows, metrics.json                          -
80   PlotsHook         plots        results.png, PR_curve.png; labels.jpg, train_batch0-2   -
                                    at the start; confusion matrix, F1/P/R curves,
                                    val_batch0-2 at the end (YOLOv5's pictures)
90   TrackersHook      trackers     --logger: VisualDL (run_dir/vdl; VisualDLHook alone),   trackers: MLflow
                                    TensorBoard, MLflow: scalars, hyperparameters, pictures run id
95   (your Hook)                    the default priority of a hook you register
100  StopOnSignalHook  signals      SIGINT/SIGTERM: ranks agree, trainer.stop_training,     -
                                    raises Interrupted after the save (core)
"""

from ppmulti.rank.engine.hooks.amp import MixedPrecisionHook
from ppmulti.rank.engine.hooks.base import HOOK_POINTS, Hook, StepOutputs, host_losses
from ppmulti.rank.engine.hooks.checkpoint import CheckpointHook
from ppmulti.rank.engine.hooks.console import ConsoleLogHook
from ppmulti.rank.engine.hooks.early_stop import EarlyStopHook
from ppmulti.rank.engine.hooks.ema import EMAHook
from ppmulti.rank.engine.hooks.evaluation import EvaluationHook
from ppmulti.rank.engine.hooks.loss_watch import LossWatchHook
from ppmulti.rank.engine.hooks.plots import PlotsHook
from ppmulti.rank.engine.hooks.results import RESULT_FIELDS, ResultsHook
from ppmulti.rank.engine.hooks.resume import ResumeHook
from ppmulti.rank.engine.hooks.signals import Interrupted, Interruption, StopOnSignalHook
from ppmulti.rank.engine.hooks.trackers import TrackersHook, VisualDLHook
from ppmulti.rank.engine.hooks.visualdl import HPARAM_METRICS, run_hparams

__all__ = ["HOOK_POINTS", "Hook", "StepOutputs", "host_losses", "CheckpointHook", "ConsoleLogHook", "EarlyStopHook",
           "EMAHook", "MixedPrecisionHook", "EvaluationHook",
           "LossWatchHook", "PlotsHook", "RESULT_FIELDS", "ResultsHook", "ResumeHook",
           "Interrupted", "Interruption", "StopOnSignalHook", "HPARAM_METRICS", "TrackersHook", "VisualDLHook",
           "run_hparams"]
