"""Running an evolution: `ppmulti evolve` and `tools/train.py --evolve`, workers that ask, train and tell.

The population is an Optuna study (``evolve_study.py``): one per --project, in ``sqlite:///PROJECT/evolve.db`` by
default or in any --storage URL (PostgreSQL or MySQL across machines). Every worker (one per device, device group,
or CPU slot) loops: it asks the study for a trial (YOLOv5's mutation of a parent among the best finished trials, or
TPE / CMA-ES), trains it as its own ``python -m ppmulti.procs.train_command ... --hyp candidates/NNNN/hyp.yaml``
process (a fresh Paddle, in its own session) while recording the trial's heartbeat, reads ``metrics.json`` and
tells the study the fitness. ``--generations N`` is the number of finished trials, however many workers and
machines share the study. evolve.csv, hyp_evolve.yaml and evolve.png are written from the study.

Stopping (Ctrl-C, SIGTERM, ``ppmulti stop``) forwards the signal to every running candidate, which saves
``weights/last.pdstate`` and exits; its trial is failed and queued again with the same hyps, so re-running the same
command resumes that candidate from its checkpoint. A worker that dies without a word (SIGKILL, a lost machine)
stops its trial's heartbeat; after twice --heartbeat seconds another worker fails that trial and the study queues
it again, to be trained by the next worker free (from the checkpoint when it is on the same PROJECT).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ppmulti.common import envvars as E
from ppmulti.common.cpus import usable_cores
from ppmulti.common.errors import UserError, exit_on_user_error
from ppmulti.common.flags import add, names
from ppmulti.common.paths import CONFIGS
from ppmulti.common.rundir import STATE
from ppmulti.procs import supervisor

HELP = "evolve hyperparameters (YOLOv5's --evolve) with one worker per device, sharing one Optuna study"
DEFAULT_HYP = CONFIGS / "hyps" / "hyp.scratch-low.yaml"
DEFAULT_PROJECT = os.path.join("runs", "evolve")
CSV_NAME = "evolve.csv"
BEST_NAME = "hyp_evolve.yaml"
PLOT_NAME = "evolve.png"
CANDIDATES = "candidates"
TAIL_LINES = 15

# train flags that the evolution decides for each candidate, refused after `ppmulti evolve ... --`
OWNED = {"device": "--device", "nproc": "--nproc", "project": "--project", "name": "--name",
         "output": "--output", "exist_ok": "--exist-ok", "resume": "--resume", "evolve": "--evolve",
         "storage": "--storage"}


# ----------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Slot:
    """One worker: the device flags its candidates train with, and extra environment."""

    label: str
    device_args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class EvolveSpec:
    """What one ``ppmulti evolve`` process runs."""

    project: Path
    generations: int
    train_args: tuple[str, ...]          # the training, without --hyp and the flags in OWNED
    base_hyp: dict[str, float]
    slots: tuple[Slot, ...]
    seed: int = 0
    noval: bool = True                   # add --noval (YOLOv5's evolve validates the last epoch only)
    storage: str | None = None           # Optuna storage URL (None: sqlite:///PROJECT/evolve.db)
    study: str | None = None             # study name (None: the project directory's name)
    sampler: str = "yolov5"
    heartbeat: int = 60                  # seconds between a running trial's heartbeats; stale after twice that

    @property
    def csv(self) -> Path:
        return self.project / CSV_NAME

    @property
    def storage_url(self) -> str:
        from ppmulti.procs.runs.evolve_study import default_storage

        return self.storage or default_storage(self.project)

    @property
    def study_name(self) -> str:
        return self.study or self.project.name


# SLURM's job and step topology. A candidate trains on its slot of this node alone; with these a launch it
# starts would read "one of N nodes" and wait for peers (one evolution per node under srun is the way to use
# several nodes: they share one study). torchrun's node variables already go with the launch state.
_SLURM_TOPOLOGY = (E.SLURM_JOB_ID, E.SLURM_STEP_ID, E.SLURM_NNODES, E.SLURM_STEP_NUM_NODES, E.SLURM_STEP_NUM_TASKS,
                   E.SLURM_NODEID, E.SLURM_JOB_NODELIST, E.SLURM_STEP_NODELIST)


def candidate_env(environ: Mapping[str, str], slot: Slot) -> dict[str, str]:
    """A candidate's environment: ``environ`` without launch state or cluster topology, then the slot's values."""
    env = {k: v for k, v in E.clean_launcher_env(environ).items() if k not in _SLURM_TOPOLOGY}
    env.update(dict(slot.env))
    env[E.PYTHONUNBUFFERED] = "1"
    return env


def plan_slots(devices: str, per_device: int = 1, group: int = 1, workers: int | None = None,
               cores: int | None = None, environ: Mapping[str, str] | None = None) -> list[Slot]:
    """``--devices/--per-device/--devices-per-worker/--workers`` -> one Slot per concurrent worker (pure)."""
    environ = os.environ if environ is None else environ
    if per_device < 1:
        raise UserError(f"--per-device {per_device}: need at least 1 worker per device")
    if group < 1:
        raise UserError(f"--devices-per-worker {group}: need at least 1")
    if devices.strip().lower() == "cpu":
        n = 1 if workers is None else workers
        if n < 1:
            raise UserError(f"--workers {n}: need at least 1 concurrent CPU worker")
        if group != 1:
            raise UserError("--devices-per-worker is for GPUs; on CPU each candidate is one process")
        n *= per_device
        cores = cores or usable_cores()
        # Paddle takes every core per process by default: share them instead of oversubscribing
        env = () if environ.get(E.PPMULTI_CPU_THREADS) else ((E.PPMULTI_CPU_THREADS, str(max(1, cores // n))),)
        return [Slot(f"cpu#{i}", ("--device", "cpu"), env) for i in range(n)]
    if workers is not None:
        raise UserError("--workers counts CPU workers (--devices cpu); with GPUs the workers follow from "
                        "--devices, --per-device and --devices-per-worker")
    try:
        ids = [int(x) for x in devices.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--devices {devices!r}: expected cpu or GPU ids like 0,1,2,3") from None
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
        raise UserError(f"--devices {devices!r}: expected cpu or distinct GPU ids like 0,1,2,3")
    if len(ids) % group:
        raise UserError(f"--devices-per-worker {group} does not divide the {len(ids)} devices of --devices {devices}")
    slots = []
    for start in range(0, len(ids), group):
        gpus = ",".join(map(str, ids[start:start + group]))
        for k in range(per_device):
            label = f"gpu{gpus}" + (f"#{k}" if per_device > 1 else "")
            slots.append(Slot(label, ("--device", gpus)))
    return slots


def mutated_bounds() -> dict[str, tuple[float, float, float]]:
    """YOLOv5's bounds, restricted to the hyps that change something here (the others keep their value)."""
    from ppmulti.procs.runs.evolve import HYP_BOUNDS
    from ppmulti.common.hyp import HYP_MAPPED

    return {k: v for k, v in HYP_BOUNDS.items() if k in HYP_MAPPED}


def _check_train_args(train_args: list[str], refuse_owned: bool = True) -> argparse.Namespace:
    """Parse the training the way tools/train.py will (unknown flags fail here, before any process starts)."""
    from ppmulti.common.train_flags import parse
    from ppmulti.rank.entry import resolve   # the rank side's entry point checks every flag

    if not train_args:
        raise UserError("no training given: put tools/train.py's flags after --, e.g. "
                        "ppmulti evolve --devices cpu --generations 10 -- --cfg yolov5n --data data.yaml --epochs 10")
    args = parse(list(train_args))
    if refuse_owned:
        for dest, flag in OWNED.items():
            if getattr(args, dest, None) not in (None, False):
                raise UserError(f"{flag} in the training's flags: the evolution sets it for every candidate "
                                f"(devices: --devices before --; directory: --project before --; "
                                f"study: --storage before --)")
    resolve(args)
    return args


def load_base_hyp(path: str | None) -> dict[str, float]:
    from ppmulti.common.hyp import load_hyp

    raw = load_hyp(str(path or DEFAULT_HYP))
    return {k: float(v) for k, v in raw.items()}


def open_population(spec: EvolveSpec) -> tuple[Any, Any]:
    """(storage, study) of an evolution: its study opened or created, a study of other hyps refused."""
    from ppmulti.procs.runs import evolve_study as S

    from ppmulti.procs.runs.evolve import EvolveStore

    storage = S.open_storage(spec.storage_url, spec.heartbeat)
    bounds = mutated_bounds()
    sampler = S.make_sampler(spec.sampler, spec.base_hyp, bounds, spec.seed)
    earlier = EvolveStore(spec.csv).rows()   # used only by the process that creates the study
    return storage, S.open_study(storage, spec.study_name, sampler, spec.base_hyp, S.shown(spec.storage_url),
                                 earlier, bounds)


def check_resumable(spec: EvolveSpec) -> None:
    """The storage opens and its study (if there is one) evolves the same hyperparameters as this run."""
    storage, _ = open_population(spec)
    storage.remove_session()
    storage.engine.dispose()


@dataclass
class Job:
    trial: Any                       # the Optuna trial being trained
    number: int                      # the candidate: candidates/NNNN (a retried trial keeps its original's)
    hyp: dict[str, float]
    parent: dict[str, float] | None
    directory: Path
    retry: bool = False


def move_foreign(directory: Path, hyp: dict[str, float]) -> Path | None:
    """A candidate directory left by another study (its hyp.yaml holds other hyps, e.g. evolve.db was removed) is
    moved aside, never resumed or read as this candidate's result; returns where it went (None: kept)."""
    import time

    import yaml

    try:
        there = yaml.safe_load((directory / "hyp.yaml").read_text())
    except (OSError, yaml.YAMLError):
        there = None if not directory.exists() else {}
    if there is None or there == hyp:
        return None
    aside = directory.with_name(f"{directory.name}.other-{time.strftime('%Y%m%d-%H%M%S')}")
    directory.rename(aside)
    return aside


# ----------------------------------------------------------------------------- the engine
class Evolution:
    """One ``ppmulti evolve`` process: its workers (threads, each training candidates in subprocesses)."""

    def __init__(self, spec: EvolveSpec, out=None):
        from ppmulti.procs.runs import evolve_study as S
        from ppmulti.procs.runs.evolve import EvolveStore

        self.spec = spec
        self.out = out or sys.stdout
        spec.project.mkdir(parents=True, exist_ok=True)
        self.store = EvolveStore(spec.csv)
        self.storage, self.study = open_population(spec)
        self.bounds = mutated_bounds()
        self.dists = S.distributions(spec.base_hyp, self.bounds)
        self.host = socket.gethostname()
        self.stop = threading.Event()    # a signal: candidates checkpoint, their trials are queued again
        self.halt = threading.Event()    # no new candidates (a signal or a failure)
        self.failed: list[str] = []
        self.signum: int | None = None
        self.procs: dict[str, supervisor.Child] = {}
        self._print_lock = threading.Lock()
        self._procs_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self.poll = min(max(spec.heartbeat / 4, 0.5), 5.0)   # how often a waiting worker looks at the study
        self._changed = threading.Condition()                # one of this process's trials finished, or halt

    def _wait(self, seconds: float) -> None:
        with self._changed:
            if not self.halt.is_set():
                self._changed.wait(seconds)

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def say(self, msg: str, err: bool = False) -> None:
        with self._print_lock:
            print(f"evolve: {msg}", file=sys.stderr if err else self.out, flush=True)

    # --- asking and telling
    def next_job(self, slot: Slot) -> Job | None:
        """The next candidate for this worker (its trial asked, its hyps suggested), or None when done."""
        from ppmulti.procs.runs import evolve_study as S

        try:
            trial = S.next_trial(self.study, self.storage, self.spec.generations, self.halt, self.poll, self._wait)
            if trial is None:
                return None
            hyp = {k: float(trial.suggest_float(k, d.low, d.high)) for k, d in self.dists.items()}
            trial.set_user_attr("worker", f"{self.host}/{slot.label}")
            frozen = self.storage.get_trial(trial._trial_id)
        finally:
            self.storage.remove_session()
        number = S.candidate_number(frozen)
        return Job(trial, number, hyp, frozen.system_attrs.get(S.PARENT_ATTR),
                   self.spec.project / CANDIDATES / f"{number:04d}", retry=number != frozen.number)

    def tell(self, job: Job, metrics: dict | None, requeue: bool = False) -> bool:
        """Finish the job's trial: its fitness (metrics), or failed (None; ``requeue``: queued again with the same
        hyps). False when the trial was already finished: another worker took it for dead and queued it again."""
        from optuna.trial import TrialState

        from ppmulti.procs.runs import evolve_study as S
        from ppmulti.procs.runs.evolve import fitness

        try:
            if self.storage.get_trial(job.trial._trial_id).state.is_finished():
                return False
            if metrics is None:
                self.study.tell(job.trial, state=TrialState.FAIL, skip_if_finished=True)
                if requeue:
                    S.requeue(self.study, job.trial._trial_id)
                return True
            for key in ("mAP50", "mAP50_95"):
                job.trial.set_user_attr(key, float(metrics[key]))
            job.trial.set_user_attr("candidate", f"{CANDIDATES}/{job.number:04d}")
            self.study.tell(job.trial, fitness(metrics), skip_if_finished=True)
            return True
        finally:
            self.storage.remove_session()
            self._notify()

    # --- training one candidate
    def command(self, job: Job, slot: Slot) -> list[str]:

        cmd = [sys.executable, "-m", "ppmulti.procs.train_command", *self.spec.train_args,
               "--hyp", str(job.directory / "hyp.yaml"), *slot.device_args]
        cmd.append("--noplots")    # as YOLOv5's evolve: no per-candidate plots
        if self.spec.noval:
            cmd.append("--noval")      # as YOLOv5's evolve: validate the last epoch only
        if (job.directory / "weights" / f"last{STATE}").is_file():
            cmd += ["--resume", str(job.directory)]
        else:
            cmd += ["--output", str(job.directory), "--exist-ok"]
        return cmd

    def prepare(self, job: Job) -> None:
        """The candidate's directory with its hyp.yaml (what --hyp reads) and parent.yaml (what it was bred from)."""
        import yaml

        from ppmulti.common.atomic import atomic_write_text

        job.directory.mkdir(parents=True, exist_ok=True)
        if not (job.directory / "hyp.yaml").is_file():
            atomic_write_text(job.directory / "hyp.yaml", yaml.safe_dump(job.hyp, sort_keys=False))
            if job.parent is not None:   # the first generation trains the base hyps, bred from nothing
                atomic_write_text(job.directory / "parent.yaml", yaml.safe_dump(job.parent, sort_keys=False))

    def own_directory(self, job: Job) -> None:
        aside = move_foreign(job.directory, job.hyp)
        if aside is not None:
            self.say(f"{job.directory} held another candidate's run (other hyps): moved to {aside.name}", err=True)

    def train(self, job: Job, slot: Slot) -> int:
        cmd = self.command(job, slot)
        env = candidate_env(os.environ, slot)
        with open(job.directory / "console.log", "ab") as log:
            log.write(f"$ {shlex.join(cmd)}\n".encode())
            log.flush()
            with self._procs_lock:
                if self.stop.is_set():
                    return 128 + (self.signum or signal.SIGTERM)
                # its own session: a signal to the evolution reaches a candidate only as forwarded here; and should
                # the evolution die without forwarding (SIGKILL), Linux sends the candidate SIGTERM (it stops and
                # saves as on any SIGTERM; a later evolution resumes it), since this thread waits for it below
                proc = supervisor.start(cmd, stdin=supervisor.DEVNULL, stdout=log, stderr=supervisor.STDOUT, env=env,
                                        parent_death_signal=signal.SIGTERM)
                self.procs[slot.label] = proc
            try:
                return proc.wait()
            finally:
                with self._procs_lock:
                    self.procs.pop(slot.label, None)

    def read_metrics(self, job: Job) -> dict | None:
        try:
            metrics = json.loads((job.directory / "metrics.json").read_text())
            return {"mAP50": float(metrics["mAP50"]), "mAP50_95": float(metrics["mAP50_95"])}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def worker(self, slot: Slot) -> None:
        from ppmulti.procs.runs import evolve_study as S
        from ppmulti.procs.runs.evolve import fitness

        while not self.halt.is_set():
            job = self.next_job(slot)
            if job is None:
                return
            told = False
            try:
                with S.heartbeat(self.storage, job.trial._trial_id, self.spec.heartbeat):
                    self.own_directory(job)
                    done = self.read_metrics(job) if job.retry else None   # trained, but its worker died before telling
                    if done is None:
                        resumed = (job.directory / "weights" / f"last{STATE}").is_file()
                        self.say(f"{'resuming' if resumed else 'training'} candidate {job.number} (trial "
                                 f"{job.trial.number}) on {slot.label} ({job.directory})")
                        self.prepare(job)
                        rc = self.train(job, slot)
                        if self.stop.is_set():
                            self.tell(job, None, requeue=True)   # the next run resumes it from its checkpoint
                            told = True
                            return
                        done = self.read_metrics(job) if rc == 0 else None
                        if done is None:
                            self.tell(job, None)
                            told = True
                            self._fail(job, slot, rc)
                            return
                    recorded = self.tell(job, done)
                    told = True
            finally:
                if not told:   # an exception in this worker: the trial is queued again for someone else
                    try:
                        self.tell(job, None, requeue=True)
                    except Exception:  # noqa: BLE001 - the heartbeat stopped: the study queues it again itself
                        pass
            # a finished candidate is never resumed: drop its training states (optimizer etc.), keep its weights
            for state in (job.directory / "weights").glob(f"*{STATE}"):
                state.unlink(missing_ok=True)
            rows = self._write_outputs()
            note = "" if recorded else (" (not recorded: its heartbeat was late and the study queued it again; "
                                        "is the database reachable?)")
            self.say(f"candidate {job.number} on {slot.label}: fitness {fitness(done):.4f} (mAP50 {done['mAP50']:.4f}, "
                     f"mAP50-95 {done['mAP50_95']:.4f}){note}; {len(rows)}/{self.spec.generations} generations")

    def _fail(self, job: Job, slot: Slot, rc: int) -> None:
        log = job.directory / "console.log"
        try:
            tail = log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
        except OSError:
            tail = []
        why = f"exit code {rc}" if rc else "no metrics.json"
        self.failed.append(f"candidate {job.number} on {slot.label} failed ({why}); its output: {log}")
        self.halt.set()
        self._notify()
        self.say("\n".join([self.failed[-1], *("  | " + ln for ln in tail)]), err=True)

    def _write_outputs(self, plot: bool = False) -> list[dict]:
        """evolve.csv and hyp_evolve.yaml (and with ``plot`` evolve.png) from the study's finished trials."""
        from ppmulti.procs.runs import evolve, evolve_study as S

        with self._write_lock:
            try:
                rows = S.study_rows(self.study, list(self.spec.base_hyp))
            finally:
                self.storage.remove_session()
            if rows:
                self.store.write(rows)
                evolve.write_best_yaml(self.store, self.spec.project / BEST_NAME, rows)
                if plot:
                    evolve.plot(self.store, self.spec.project / PLOT_NAME, rows)
        return rows

    # --- signals
    def _on_signal(self, signum: int) -> None:
        first = not self.stop.is_set()
        self.signum = self.signum or signum
        self.stop.set()
        self.halt.set()
        self._notify()
        with self._procs_lock:
            procs = list(self.procs.values())
        for proc in procs:   # the first signal: each candidate checkpoints and exits; a second one kills them
            proc.signal(signum if first else signal.SIGKILL)
        if first:
            self.say(f"{signal.Signals(signum).name}: stopping {len(procs)} candidate(s) after their checkpoint; "
                     f"run the same command again to continue", err=True)

    def run(self) -> int:
        """Run the workers until N trials have finished, a candidate fails, or a signal; returns the exit code."""
        from ppmulti.procs.runs import evolve_study as S
        from ppmulti.procs.runs.evolve import best

        done = len(S.study_rows(self.study, list(self.spec.base_hyp)))
        self.say(f"{done}/{self.spec.generations} generations finished in study {self.spec.study_name!r} "
                 f"({S.shown(self.spec.storage_url)}, sampler {self.spec.sampler}); "
                 f"{len(self.spec.slots)} worker(s): {', '.join(s.label for s in self.spec.slots)}")
        errors: list[BaseException] = []

        def guarded(slot: Slot) -> None:
            try:
                self.worker(slot)
            except BaseException as exc:  # noqa: BLE001 - reported below, the other workers carry on
                errors.append(exc)
                self.failed.append(f"worker {slot.label}: {type(exc).__name__}: {exc}")
                self.halt.set()
                self._notify()
            finally:
                self.storage.remove_session()

        threads = [threading.Thread(target=guarded, args=(s,), name=f"evolve-{s.label}", daemon=True)
                   for s in self.spec.slots]
        with supervisor.forward_signals(self._on_signal):
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(timeout=0.2)
        for exc in errors:
            if isinstance(exc, UserError):
                raise exc
        rows = self._write_outputs(plot=True)   # the files and the summary below describe the same rows
        if rows:
            metrics, _ = best(self.store, rows)
            self.say(f"{len(rows)}/{self.spec.generations} generations; best fitness {metrics['fitness']:.4f} "
                     f"(mAP50 {metrics['mAP50']:.4f}, mAP50-95 {metrics['mAP50_95']:.4f}): "
                     f"{self.spec.project / BEST_NAME}, {self.spec.csv}, {self.spec.project / PLOT_NAME}")
        self.storage.remove_session()
        self.storage.engine.dispose()
        if self.signum is not None:
            return 128 + int(self.signum)
        if self.failed:
            self.say(f"stopped: {self.failed[0]}", err=True)
            return 1
        return 0


def run_evolution(spec: EvolveSpec, out=None) -> int:
    return Evolution(spec, out).run()


# ----------------------------------------------------------------------------- `ppmulti evolve`
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        allow_abbrev=False,   # `--det` must not pass for --detach: the child would detach again, and again
        prog="ppmulti evolve", description=HELP + ". Flags before -- are the evolution's; the training's "
        "(tools/train.py's, including its own --workers for data loading) come after --.",
        usage="ppmulti evolve [--devices cpu|0,1,...] [--workers N] [--per-device K] --generations N "
              "[--project DIR] [--storage URL] [--sampler yolov5|tpe|cmaes] [--detach] -- TRAIN FLAGS ...\n"
              "       ppmulti evolve --dashboard [--project DIR | --storage URL] [--port N]",
        epilog="example: ppmulti evolve --devices 0,1,2,3 --generations 300 --project runs/evolve/coco -- "
               "--cfg yolov5s --data coco.yaml --epochs 10 --batch 64 --hyp configs/hyps/hyp.scratch-low.yaml")
    add(p, "devices", default="cpu", help="GPU ids, one worker each (e.g. 0,1,2,3), or cpu (default cpu)")
    add(p, "workers", help="with --devices cpu: concurrent CPU workers (default 1); the CPU's cores are shared "
                           "between them. Not the data loader's --workers, which goes after --")
    p.add_argument("--per-device", "--per_device", dest="per_device", type=int, default=1,
                   help="concurrent workers per device (or device group), e.g. 2 small models per GPU (default 1)")
    p.add_argument("--devices-per-worker", "--devices_per_worker", dest="group", type=int, default=1,
                   help="GPUs per worker: 2 trains each candidate as 2 ranks on --device 0,1 (default 1)")
    p.add_argument("--generations", type=int, default=None,
                   help="finished candidates in total (trials of the study, already finished ones count), "
                        "however many workers and machines share the study")
    add(p, "project", default=DEFAULT_PROJECT,
        help=f"evolution directory: evolve.db, evolve.csv, {BEST_NAME}, {PLOT_NAME}, candidates/ "
             f"(default {DEFAULT_PROJECT}; the same directory resumes)")
    add(p, "storage", help="Optuna storage holding the population (default sqlite:///PROJECT/evolve.db); across "
                           "machines a server, e.g. postgresql://user@host:5432/db (password from ~/.pgpass or "
                           "PGPASSWORD)")
    p.add_argument("--study", default=None, metavar="NAME",
                   help="study name in the storage (default the --project directory's name); workers and machines "
                        "with the same storage and study share one evolution")
    p.add_argument("--sampler", default="yolov5", choices=("yolov5", "tpe", "cmaes"),
                   help="yolov5 (YOLOv5's mutation, default), tpe or cmaes (Optuna's own)")
    p.add_argument("--heartbeat", type=int, default=60, metavar="SECONDS",
                   help="a running candidate's heartbeat period; a candidate silent for twice this (its worker or "
                        "machine died) is failed and trained again by another worker (default 60)")
    add(p, "seed", help="seed of the yolov5 sampler's mutations (candidate k draws from (seed, k)) and of tpe/cmaes")
    p.add_argument("--dashboard", action="store_true",
                   help="serve optuna-dashboard on the study's storage (no training) and print its URL")
    add(p, "host", default="127.0.0.1", help="with --dashboard: address to listen on (default 127.0.0.1)")
    add(p, "port", default=8080, help="with --dashboard: port (default 8080)")
    p.add_argument("--detach", action="store_true",
                   help="run in the background (ppmulti ps / logs / stop); output goes to PROJECT/evolve.log")
    return p


def dashboard(ns: argparse.Namespace) -> int:
    """``ppmulti evolve --dashboard``: optuna-dashboard on the evolution's storage, until Ctrl-C or SIGTERM."""
    from ppmulti.procs.runs import evolve_study as S

    project = Path(ns.project).resolve()
    if ns.storage is None and not (project / S.DB_NAME).is_file():
        raise UserError(f"--dashboard: no {S.DB_NAME} in {project}; give the evolution's --project or --storage URL")
    try:
        import optuna_dashboard
    except ImportError:
        raise UserError("--dashboard needs optuna-dashboard: pip install optuna-dashboard") from None
    url = ns.storage or S.default_storage(project)
    storage = S.open_storage(url, ns.heartbeat)
    page = f"http://{ns.host}:{ns.port}/dashboard/"
    try:
        page += f"studies/{storage.get_study_id_from_name(ns.study or project.name)}"
    except KeyError:
        pass   # no study of that name: the list of the storage's studies
    print(f"evolve: optuna-dashboard of {S.shown(url)}: {page}  (Ctrl-C stops it)", flush=True)
    def interrupt(signum: int) -> None:
        raise KeyboardInterrupt   # SIGTERM (ppmulti stop, a test) ends the server as Ctrl-C does

    with supervisor.forward_signals(interrupt):
        try:
            optuna_dashboard.run_server(storage, host=ns.host, port=ns.port)
        except KeyboardInterrupt:
            return 0
        except OSError as exc:
            raise UserError(f"--dashboard: cannot listen on {ns.host}:{ns.port} ({exc.strerror}); pick another "
                            f"--port") from None
    return 0


def split_evolve_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def spec_from_argv(argv: list[str]) -> tuple[EvolveSpec, argparse.Namespace, list[str]]:
    own, train_args = split_evolve_argv(argv)
    ns = build_parser().parse_args(own)
    if ns.generations is None:
        raise UserError("--generations N is required: the number of candidates to finish, e.g. --generations 300")
    if ns.generations < 1:
        raise UserError(f"--generations {ns.generations}: need at least 1")
    slots = plan_slots(ns.devices, ns.per_device, ns.group, ns.workers)
    args = _check_train_args(train_args)
    base_hyp = load_base_hyp(args.hyp)
    rest = _strip(train_args, {"--hyp"}, set(), set())
    spec = EvolveSpec(project=Path(ns.project).resolve(), generations=ns.generations, train_args=tuple(rest),
                      base_hyp=base_hyp, slots=tuple(slots), seed=ns.seed,
                      noval=not (args.eval or args.patience or args.noval), storage=ns.storage, study=ns.study,
                      sampler=ns.sampler, heartbeat=ns.heartbeat)
    return spec, ns, own


def _cmd_evolve(argv: list[str]) -> int:
    own, _ = split_evolve_argv(argv)
    if "-h" in own or "--help" in own:
        build_parser().print_help()
        return 0
    if "--dashboard" in own:
        return dashboard(build_parser().parse_args(own))
    spec, ns, _ = spec_from_argv(argv)
    if ns.detach:
        from ppmulti.procs.runs.detach import start
        from ppmulti.procs.runs.evolve_study import password

        if ns.storage and password(ns.storage):
            raise UserError("--storage with a password and --detach: ppmulti ps shows the command line; drop the "
                            "password from the URL and put it in ~/.pgpass or PGPASSWORD")

        check_resumable(spec)   # before detaching (the same check runs in Evolution.run otherwise)
        rest = [a for a in own if a != "--detach"] + ["--", *split_evolve_argv(argv)[1]]
        return start("evolve", rest, run_dir=spec.project, log_path=spec.project / "evolve.log",
                     meta={"generations": spec.generations})
    return run_evolution(spec)


def register(subparsers: Any) -> None:
    """Add ``evolve`` to the ``ppmulti`` subcommands (its own parser splits at ``--``)."""
    parser = subparsers.add_parser("evolve", help=HELP, description=HELP, prefix_chars="+", add_help=False,
                                   usage="ppmulti evolve [FLAGS] -- TRAIN FLAGS ...  (see --help)")
    parser.add_argument("evolve_argv", nargs=argparse.REMAINDER, metavar="ARG")
    parser.set_defaults(func=lambda args: _cmd_evolve(list(args.evolve_argv)))


# ----------------------------------------------------------------------------- `tools/train.py --evolve N`
def _strip(argv: list[str], valued: set[str], flags: set[str], optional_int: set[str]) -> list[str]:
    """argv without the named flags (``--x V``/``--x=V`` for valued, bare for flags, ``--x [INT]``)."""
    out, i = [], 0
    while i < len(argv):
        item = argv[i]
        name = item.split("=", 1)[0]
        if name in valued:
            i += 1 if "=" in item else 2
            continue
        if name in flags:
            i += 1
            continue
        if name in optional_int:
            i += 1
            if "=" not in item and i < len(argv) and argv[i].lstrip("-").isdigit():
                i += 1
            continue
        out.append(item)
        i += 1
    return out


def evolve_from_train(args: argparse.Namespace, argv: list[str]) -> int:
    """``tools/train.py --evolve N ...``: the same engine with one worker on this command's --device/--nproc,
    in PROJECT/NAME (default runs/evolve/exp, not numbered: the same command resumes)."""
    if E.in_paddle_worker():
        raise UserError("--evolve starts its own trainings: run tools/train.py --evolve directly, not under a launcher")
    if args.evolve < 1:
        raise UserError(f"--evolve {args.evolve}: need at least 1 generation")
    if args.resume is not None or args.output:
        raise UserError("--evolve places every candidate itself: drop --resume/--output (use --project/--name)")
    base_hyp = load_base_hyp(args.hyp)
    project = Path(args.project or DEFAULT_PROJECT, args.name or "exp").resolve()
    rest = _strip(list(argv), {"--hyp", *names("project"), *names("name"), *names("storage")}, set(names("exist_ok")),
                  {"--evolve"})
    check = _check_train_args(rest, refuse_owned=False)
    for dest in ("evolve", "project", "name", "hyp", "storage"):
        if getattr(check, dest, None) not in (None, False):
            raise UserError(f"spell --{dest} in full with --evolve (an abbreviation cannot be taken apart)")
    slot_args = []
    candidate = _strip(rest, {*names("device"), *names("nproc")}, set(), set())
    if check.device is not None:
        slot_args += ["--device", str(check.device)]
    if check.nproc is not None:
        slot_args += ["--nproc", str(check.nproc)]
    spec = EvolveSpec(project=project, generations=int(args.evolve), train_args=tuple(candidate),
                      base_hyp=base_hyp, slots=(Slot("train", tuple(slot_args)),), seed=int(args.seed or 0),
                      noval=not (args.eval or args.patience or args.noval), storage=getattr(args, "storage", None))
    return run_evolution(spec)


def main(argv: list[str] | None = None) -> int:
    """``python -m ppmulti.procs.runs.evolve_run ARGS`` = ``ppmulti evolve ARGS``."""
    return exit_on_user_error(_cmd_evolve, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
