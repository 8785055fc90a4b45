"""Running an evolution: `ppmulti evolve` and `tools/train.py --evolve`, workers that breed, train and record.

Every worker (one per device, device group, or CPU slot) loops: under the lock of ``PROJECT/evolve.csv`` it
claims a candidate slot in ``PROJECT/evolve.claims.json`` and breeds the candidate's hyps from every row any
worker has recorded (YOLOv5's semantics, ``ppmulti.procs.runs.evolve``); it trains the candidate as its own
``python -m ppmulti.procs.train_command ... --hyp candidates/NNNN/hyp.yaml`` process (a fresh Paddle, in its own
session); it reads ``metrics.json`` and, under the lock again, appends one row and drops the claim.
``--generations N`` is the number of rows: a slot is claimed only while rows + live claims < N, so several
workers (or several machines on a shared file system) never overshoot.

Stopping (Ctrl-C, SIGTERM, ``ppmulti stop``) forwards the signal to every running candidate, which saves
``weights/last.pdstate`` and exits; the claims stay behind. A claim whose owner process is gone (or, from
another host, that has not been refreshed for ``STALE_SECONDS``) is stale: the next run takes it over and
resumes that candidate from its checkpoint with the same hyps. So re-running the same command continues
where it stopped, and a complete evolution does nothing but rewrite its outputs.
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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ppmulti.common import envvars as E
from ppmulti.common import procfs as procs
from ppmulti.common.cpus import usable_cores
from ppmulti.common.errors import UserError, exit_on_user_error
from ppmulti.common.paths import CONFIGS
from ppmulti.common.rundir import STATE
from ppmulti.procs import supervisor

HELP = "evolve hyperparameters (YOLOv5's --evolve) with one worker per device, sharing one evolve.csv"
DEFAULT_HYP = CONFIGS / "hyps" / "hyp.scratch-low.yaml"
DEFAULT_PROJECT = os.path.join("runs", "evolve")
CSV_NAME = "evolve.csv"
CLAIMS_NAME = "evolve.claims.json"
BEST_NAME = "hyp_evolve.yaml"
PLOT_NAME = "evolve.png"
CANDIDATES = "candidates"
STALE_SECONDS = 600.0     # a claim of another host not refreshed for this long is taken over
HEARTBEAT_SECONDS = 60.0
TAIL_LINES = 15

# train flags that the evolution decides for each candidate, refused after `ppmulti evolve ... --`
OWNED = {"device": "--device", "nproc": "--nproc", "project": "--project", "name": "--name",
         "output": "--output", "exist_ok": "--exist-ok", "resume": "--resume", "evolve": "--evolve"}


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

    @property
    def csv(self) -> Path:
        return self.project / CSV_NAME


# SLURM's job and step topology. A candidate trains on its slot of this node alone; with these a launch it
# starts would read "one of N nodes" and wait for peers (one evolution per node under srun is the way to use
# several nodes: they share PROJECT's claims). torchrun's node variables already go with the launch state.
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
    from ppmulti.rank.entry import options_from_args   # the rank side's entry point checks every flag

    if not train_args:
        raise UserError("no training given: put tools/train.py's flags after --, e.g. "
                        "ppmulti evolve --devices cpu --generations 10 -- --cfg yolov5n --data data.yaml --epochs 10")
    args = parse(list(train_args))
    if refuse_owned:
        for dest, flag in OWNED.items():
            if getattr(args, dest, None) not in (None, False):
                raise UserError(f"{flag} in the training's flags: the evolution sets it for every candidate "
                                f"(devices: --devices before --; directory: --project before --)")
    options_from_args(args)
    return args


def load_base_hyp(path: str | None) -> dict[str, float]:
    from ppmulti.common.hyp import load_hyp

    raw = load_hyp(str(path or DEFAULT_HYP))
    return {k: float(v) for k, v in raw.items()}


def check_resumable(spec: EvolveSpec) -> None:
    """An evolve.csv that is already there must hold the same hyperparameters (else it is another evolution)."""
    from ppmulti.procs.runs.evolve import METRIC_COLUMNS, EvolveStore

    header = EvolveStore(spec.csv)._read_header()
    if header is not None and set(header[len(METRIC_COLUMNS):]) != set(spec.base_hyp):
        raise UserError(f"{spec.csv} evolves other hyperparameters than this run's --hyp; pick another --project "
                        f"or the same hyp file")


# ----------------------------------------------------------------------------- claims
@dataclass
class Owner:
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    start: int | None = field(default_factory=lambda: procs.start_time(os.getpid()))

    def as_dict(self) -> dict:
        return {"host": self.host, "pid": self.pid, "start": self.start}


def _claim_live(claim: dict, now: float) -> bool:
    owner = claim.get("owner") or {}
    if owner.get("host") != socket.gethostname():
        return now - float(claim.get("beat", 0)) < STALE_SECONDS
    return owner.get("pid") is not None and procs.start_time(int(owner["pid"])) == owner.get("start")


@dataclass
class Job:
    slot: int
    hyp: dict[str, float]
    parent: dict[str, float] | None
    directory: Path
    taken_over: bool = False


class Claims:
    """``evolve.claims.json``: the next slot number and the candidates being trained. Callers hold the lock."""

    def __init__(self, path: Path):
        self.path = path

    def load(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"next": 0, "claims": {}}
        except (OSError, ValueError):
            # a hand-edited or foreign file: start numbering after every candidate directory there is
            print(f"evolve: {self.path} is unreadable; starting a fresh claims file", file=sys.stderr)
            used = [int(p.name) for p in (self.path.parent / CANDIDATES).glob("*") if p.name.isdigit()]
            return {"next": max(used, default=-1) + 1, "claims": {}}
        data.setdefault("next", 0)
        data.setdefault("claims", {})
        return data

    def save(self, data: dict) -> None:
        from ppmulti.common.atomic import atomic_write_text

        atomic_write_text(self.path, json.dumps(data, indent=1, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------- the engine
class Evolution:
    """One ``ppmulti evolve`` process: its workers (threads, each training candidates in subprocesses)."""

    def __init__(self, spec: EvolveSpec, out=None):
        from ppmulti.procs.runs.evolve import EvolveStore

        self.spec = spec
        self.out = out or sys.stdout
        spec.project.mkdir(parents=True, exist_ok=True)
        self.store = EvolveStore(spec.csv)
        self.claims = Claims(spec.project / CLAIMS_NAME)
        self.owner = Owner()
        self.stop = threading.Event()
        self.failed: list[str] = []
        self.signum: int | None = None
        self.procs: dict[str, supervisor.Child] = {}
        self._print_lock = threading.Lock()
        self._procs_lock = threading.Lock()
        self.bounds = mutated_bounds()

    def say(self, msg: str, err: bool = False) -> None:
        with self._print_lock:
            print(f"evolve: {msg}", file=sys.stderr if err else self.out, flush=True)

    # --- claiming
    def claim(self, slot: Slot) -> Job | None:
        import numpy as np

        from ppmulti.procs.runs.evolve import breed

        with self.store.lock:
            if self.stop.is_set() or self.failed:
                return None
            rows = self.store.rows()
            data = self.claims.load()
            now = time.time()
            live = {k: c for k, c in data["claims"].items() if _claim_live(c, now)}
            stale = sorted((k for k in data["claims"] if k not in live), key=int)
            if len(rows) + len(live) >= self.spec.generations:
                return None
            if stale:
                key = stale[0]
                claim = data["claims"][key]
                taken = True
            else:
                n = int(data["next"])
                data["next"] = n + 1
                key = str(n)
                rng = np.random.RandomState([self.spec.seed, n])
                if n == 0 and not rows:
                    parent, hyp = None, dict(self.spec.base_hyp)   # YOLOv5: the first generation is the base hyps
                else:
                    parent, hyp = breed(rows, self.spec.base_hyp, rng, self.bounds)
                claim = {"slot": n, "hyp": hyp, "parent": parent, "dir": f"{CANDIDATES}/{n:04d}"}
                taken = False
            claim.update(owner=self.owner.as_dict(), beat=now, worker=slot.label)
            data["claims"][key] = claim
            self.claims.save(data)
        return Job(int(claim["slot"]), claim["hyp"], claim.get("parent"), self.spec.project / claim["dir"], taken)

    def heartbeat(self) -> None:
        """Refresh this process's claims (read by workers on other hosts sharing the file system)."""
        with self.store.lock:
            data = self.claims.load()
            mine = [c for c in data["claims"].values() if c.get("owner") == self.owner.as_dict()]
            for c in mine:
                c["beat"] = time.time()
            if mine:
                self.claims.save(data)

    def release(self, job: Job) -> None:
        with self.store.lock:
            data = self.claims.load()
            data["claims"].pop(str(job.slot), None)
            self.claims.save(data)

    def record(self, job: Job, metrics: dict) -> bool:
        """Append the candidate's row and drop its claim, atomically under the lock; False if already there."""
        with self.store.lock:
            appended = True
            if job.taken_over and self._already_recorded(job, metrics):
                appended = False   # the previous owner died between appending and dropping its claim
            else:
                self.store.append(metrics, job.hyp)
            data = self.claims.load()
            data["claims"].pop(str(job.slot), None)
            self.claims.save(data)
        return appended

    def _already_recorded(self, job: Job, metrics: dict) -> bool:
        for row in self.store.rows():
            if row["mAP50"] == float(metrics["mAP50"]) and row["mAP50_95"] == float(metrics["mAP50_95"]) \
                    and all(row.get(k) == float(v) for k, v in job.hyp.items()):
                return True
        return False

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

    def train(self, job: Job, slot: Slot) -> int:
        cmd = self.command(job, slot)
        env = candidate_env(os.environ, slot)
        with open(job.directory / "console.log", "ab") as log:
            log.write(f"$ {shlex.join(cmd)}\n".encode())
            log.flush()
            with self._procs_lock:
                if self.stop.is_set():
                    return 128 + (self.signum or signal.SIGTERM)
                # its own session: a signal to the evolution reaches a candidate only as forwarded here
                proc = supervisor.start(cmd, stdin=supervisor.DEVNULL, stdout=log, stderr=supervisor.STDOUT, env=env)
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
        from ppmulti.procs.runs.evolve import fitness

        while not self.stop.is_set() and not self.failed:
            job = self.claim(slot)
            if job is None:
                return
            done = self.read_metrics(job) if job.taken_over else None
            try:
                if done is None:
                    what = "resuming" if job.taken_over else "training"
                    self.say(f"{what} candidate {job.slot} on {slot.label} ({job.directory})")
                    self.prepare(job)
                    rc = self.train(job, slot)
                    if self.stop.is_set():
                        return   # keep the claim: the next run resumes this candidate from its checkpoint
                    done = self.read_metrics(job) if rc == 0 else None
                    if done is None:
                        self._fail(job, slot, rc)
                        return
                appended = self.record(job, done)
            except BaseException:
                if not self.stop.is_set():
                    self.release(job)
                raise
            # a finished candidate is never resumed: drop its training states (optimizer etc.), keep its weights
            for state in (job.directory / "weights").glob(f"*{STATE}"):
                state.unlink(missing_ok=True)
            self._write_best()
            rows = len(self.store.rows())
            self.say(f"candidate {job.slot} on {slot.label}: fitness {fitness(done):.4f} (mAP50 {done['mAP50']:.4f}, "
                     f"mAP50-95 {done['mAP50_95']:.4f}){'' if appended else ' (already recorded)'}; "
                     f"{rows}/{self.spec.generations} generations")

    def _fail(self, job: Job, slot: Slot, rc: int) -> None:
        log = job.directory / "console.log"
        try:
            tail = log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
        except OSError:
            tail = []
        self.release(job)
        why = f"exit code {rc}" if rc else "no metrics.json"
        self.failed.append(f"candidate {job.slot} on {slot.label} failed ({why}); its output: {log}")
        self.say("\n".join([self.failed[-1], *("  | " + ln for ln in tail)]), err=True)

    def _write_best(self) -> None:
        from ppmulti.procs.runs.evolve import write_best_yaml

        try:
            write_best_yaml(self.store, self.spec.project / BEST_NAME)
        except UserError:
            pass   # no row yet

    # --- signals
    def _on_signal(self, signum: int) -> None:
        first = not self.stop.is_set()
        self.signum = self.signum or signum
        self.stop.set()
        with self._procs_lock:
            procs = list(self.procs.values())
        for proc in procs:   # the first signal: each candidate checkpoints and exits; a second one kills them
            proc.signal(signum if first else signal.SIGKILL)
        if first:
            self.say(f"{signal.Signals(signum).name}: stopping {len(procs)} candidate(s) after their checkpoint; "
                     f"run the same command again to continue", err=True)

    def run(self) -> int:
        """Run the workers until N rows are recorded, a candidate fails, or a signal; returns the exit code."""
        from ppmulti.procs.runs.evolve import best, plot, write_best_yaml

        check_resumable(self.spec)
        rows = len(self.store.rows())
        self.say(f"{rows}/{self.spec.generations} generations recorded in {self.spec.csv}; "
                 f"{len(self.spec.slots)} worker(s): {', '.join(s.label for s in self.spec.slots)}")
        errors: list[BaseException] = []

        def guarded(slot: Slot) -> None:
            try:
                self.worker(slot)
            except BaseException as exc:  # noqa: BLE001 - reported below, the other workers carry on
                errors.append(exc)
                self.failed.append(f"worker {slot.label}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=guarded, args=(s,), name=f"evolve-{s.label}", daemon=True)
                   for s in self.spec.slots]
        with supervisor.forward_signals(self._on_signal):
            for t in threads:
                t.start()
            beat = time.monotonic()
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(timeout=0.2)
                if time.monotonic() - beat > HEARTBEAT_SECONDS:
                    self.heartbeat()
                    beat = time.monotonic()
        for exc in errors:
            if isinstance(exc, UserError):
                raise exc
        rows = self.store.rows()   # read once: the files and the summary below describe the same rows
        if rows:
            write_best_yaml(self.store, self.spec.project / BEST_NAME, rows)
            plot(self.store, self.spec.project / PLOT_NAME, rows)
            metrics, _ = best(self.store, rows)
            self.say(f"{len(rows)}/{self.spec.generations} generations; best fitness {metrics['fitness']:.4f} "
                     f"(mAP50 {metrics['mAP50']:.4f}, mAP50-95 {metrics['mAP50_95']:.4f}): "
                     f"{self.spec.project / BEST_NAME}, {self.spec.csv}, {self.spec.project / PLOT_NAME}")
        if self.signum is not None:
            return 128 + int(self.signum)
        if self.failed:
            self.say(f"stopped: {self.failed[0]}", err=True)
            return 1
        if len(rows) < self.spec.generations:
            self.say(f"{self.spec.generations - len(rows)} generation(s) still being trained by other workers "
                     f"sharing {self.spec.csv}")
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
              "[--project DIR] [--detach] -- TRAIN FLAGS ...",
        epilog="example: ppmulti evolve --devices 0,1,2,3 --generations 300 --project runs/evolve/coco -- "
               "--cfg yolov5s --data coco.yaml --epochs 10 --batch 64 --hyp configs/hyps/hyp.scratch-low.yaml")
    p.add_argument("--devices", default="cpu",
                   help="GPU ids, one worker each (e.g. 0,1,2,3), or cpu (default cpu)")
    p.add_argument("--workers", type=int, default=None,
                   help="with --devices cpu: concurrent CPU workers (default 1); the CPU's cores are shared "
                        "between them. Not the data loader's --workers, which goes after --")
    p.add_argument("--per-device", "--per_device", dest="per_device", type=int, default=1,
                   help="concurrent workers per device (or device group), e.g. 2 small models per GPU (default 1)")
    p.add_argument("--devices-per-worker", "--devices_per_worker", dest="group", type=int, default=1,
                   help="GPUs per worker: 2 trains each candidate as 2 ranks on --device 0,1 (default 1)")
    p.add_argument("--generations", type=int, required=True,
                   help="candidates in total, i.e. rows in evolve.csv (already recorded ones count)")
    p.add_argument("--project", default=DEFAULT_PROJECT,
                   help=f"evolution directory: evolve.csv, {BEST_NAME}, {PLOT_NAME}, candidates/ "
                        f"(default {DEFAULT_PROJECT}; the same directory resumes)")
    p.add_argument("--seed", type=int, default=0, help="seed of the mutations (candidate k draws from (seed, k))")
    p.add_argument("--detach", action="store_true",
                   help="run in the background (ppmulti ps / logs / stop); output goes to PROJECT/evolve.log")
    return p


def split_evolve_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def spec_from_argv(argv: list[str]) -> tuple[EvolveSpec, argparse.Namespace, list[str]]:
    own, train_args = split_evolve_argv(argv)
    ns = build_parser().parse_args(own)
    if ns.generations < 1:
        raise UserError(f"--generations {ns.generations}: need at least 1")
    slots = plan_slots(ns.devices, ns.per_device, ns.group, ns.workers)
    args = _check_train_args(train_args)
    base_hyp = load_base_hyp(args.hyp)
    rest = _strip(train_args, {"--hyp"}, set(), set())
    spec = EvolveSpec(project=Path(ns.project).resolve(), generations=ns.generations, train_args=tuple(rest),
                      base_hyp=base_hyp, slots=tuple(slots), seed=ns.seed,
                      noval=not (args.eval or args.patience or args.noval))
    return spec, ns, own


def _cmd_evolve(argv: list[str]) -> int:
    own, _ = split_evolve_argv(argv)
    if "-h" in own or "--help" in own:
        build_parser().print_help()
        return 0
    spec, ns, _ = spec_from_argv(argv)
    if ns.detach:
        from ppmulti.procs.runs.detach import start

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
    rest = _strip(list(argv), {"--hyp", "--project", "--name"}, {"--exist-ok", "--exist_ok"}, {"--evolve"})
    check = _check_train_args(rest, refuse_owned=False)
    for dest in ("evolve", "project", "name", "hyp"):
        if getattr(check, dest, None) not in (None, False):
            raise UserError(f"spell --{dest} in full with --evolve (an abbreviation cannot be taken apart)")
    slot_args = []
    candidate = _strip(rest, {"--device", "--nproc"}, set(), set())
    if check.device is not None:
        slot_args += ["--device", str(check.device)]
    if check.nproc is not None:
        slot_args += ["--nproc", str(check.nproc)]
    spec = EvolveSpec(project=project, generations=int(args.evolve), train_args=tuple(candidate),
                      base_hyp=base_hyp, slots=(Slot("train", tuple(slot_args)),), seed=int(args.seed or 0),
                      noval=not (args.eval or args.patience or args.noval))
    return run_evolution(spec)


def main(argv: list[str] | None = None) -> int:
    """``python -m ppmulti.procs.runs.evolve_run ARGS`` = ``ppmulti evolve ARGS``."""
    return exit_on_user_error(_cmd_evolve, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
