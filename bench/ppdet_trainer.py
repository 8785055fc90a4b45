"""ppmulti's tools/train.py against PaddleDetection's own tools/train.py on PaddleDetection's configs, side by side.

    python bench/ppdet_trainer.py --ppdet-root ../PaddleDetection [--configs A.yml B.yml] [--rounds 3] [--steps 12]
    python bench/ppdet_trainer.py --ppdet-root ../PD-2.7 --configs configs/rtdetr/rtdetr_r18vd_6x_coco.yml \
        --size 320 --batch 4 --name ppdet_trainer_rtdetr

Run it with the Python of a Paddle 2.6 stack (PaddleDetection's trainer does not start on Paddle 3). The checkout is
release/2.6 (PP-YOLOE, PicoDet ...) or release/2.7 (``configs/rtdetr/*.yml`` too): PaddleDetection's tools/train.py
runs its checkout's own ppdet, ppmulti's runs paddledet 2.6.0 with its release/2.7 RT-DETR modules. Both trainers get
the same config (a path inside the checkout), the same ``-o`` overrides (``use_gpu=false epoch=1 num_classes=3
TrainReader.batch_size=B log_iter=1 pretrain_weights=``, ``worker_num=N`` with ``--workers N``, and the config's
BatchRandomResize pinned to one size, ``--size``: its eval size unless told, ``eval_height`` or RT-DETR's
``eval_size``) and one process each, in turn (the order alternates by round), in one work directory holding a generated
3-class COCO set at ``dataset/coco`` (``ppmulti data demo``'s images, laid out as the configs expect it; the checkout
is not touched).

The step time is wall time, the same for both: the bench timestamps every log line as it arrives, and a step is the
interval between the step's log line and the one before it (everything the loop does per step: data wait, forward,
backward, optimizer, EMA, logging). The first ``--skip`` steps are warm-up; the window is the next ``--steps`` steps,
the same for both. Each trainer's own figures ride along: PaddleDetection's ``batch_cost`` (which leaves out its EMA
update and logging) and ``data_cost``, ppmulti's data wait (its log gives the mean per step since its last line),
and the CPU seconds per step of each trainer's process and of its loader workers (from /proc when the lines arrive:
what each does per step, whatever the load). Writes ``NAME.json`` and ``NAME.md`` into ``--out`` (default
bench/results/; ``--name``, default ppdet_trainer); run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIGS = ("configs/picodet/picodet_s_320_coco_lcnet.yml", "configs/ppyoloe/ppyoloe_plus_crn_s_80e_coco.yml")
TOOLS = ("ppdet", "ppmulti")

# PaddleDetection's LogPrinter (ppdet/engine/callbacks.py), with log_iter=1 its batch_cost/data_cost are the step's own
PPDET_STEP = re.compile(r"Epoch: \[(?P<epoch>\d+)\]\s*\[\s*(?P<step>\d+)/(?P<steps>\d+)\].*?"
                        r"batch_cost: (?P<batch>[0-9.]+).*?data_cost: (?P<data>[0-9.]+)")
# ppmulti's ConsoleLogHook: epoch and step count from 1; "data" is the mean data wait per step since its last line
PPMULTI_STEP = re.compile(r"\bepoch (?P<epoch>\d+)/\d+ step (?P<step>\d+)/(?P<steps>\d+) "
                          r".*?\bdata (?P<data>[0-9.]+)s/step")


@dataclass
class Step:
    """One training step as a trainer's log shows it."""

    index: int                  # 0-based over the run (epoch x steps per epoch + step)
    arrived: float              # when its line reached the bench (seconds, monotonic)
    data: float                 # data wait of this step (s)
    own: float | None = None    # the trainer's own step time (PaddleDetection's batch_cost), else None
    cpu: tuple[float, float] | None = None   # CPU seconds so far of the trainer's process, of its loader workers


@dataclass
class Window:
    """A run's steps ``skip .. skip + steps - 1``: the wall time per step and what the trainer says besides."""

    seconds_per_step: float
    median_step: float
    data_per_step: float
    first_data: float            # the first step's data wait (workers starting)
    own_per_step: float | None   # PaddleDetection's mean batch_cost over the window
    steps: list[float] = field(default_factory=list)
    cpu_per_step: float | None = None           # CPU seconds of the training process per step
    worker_cpu_per_step: float | None = None    # CPU seconds of its loader workers per step


def parse_steps(tool: str, lines: list[tuple]) -> list[Step]:
    """The step lines among ``(arrival time, text[, cpu])`` of ``tool``'s output ("ppdet" or "ppmulti"), in order;
    ``cpu``: (process, workers) CPU seconds when the line arrived."""
    steps: list[Step] = []
    for arrived, text, *cpu in lines:
        if tool == "ppdet":
            m = PPDET_STEP.search(text)
            if m is None:
                continue
            index = int(m["epoch"]) * int(m["steps"]) + int(m["step"])
            steps.append(Step(index, arrived, float(m["data"]), float(m["batch"]), cpu[0] if cpu else None))
        elif tool == "ppmulti":
            m = PPMULTI_STEP.search(text)
            if m is None:
                continue
            index = (int(m["epoch"]) - 1) * int(m["steps"]) + int(m["step"]) - 1   # log_iter=1: a line per step
            steps.append(Step(index, arrived, float(m["data"]), cpu=cpu[0] if cpu else None))
        else:
            raise ValueError(f"unknown trainer {tool!r}")
    return steps


def window(steps: list[Step], skip: int, count: int) -> Window:
    """Wall time per step over steps ``skip .. skip + count - 1`` (each from the line before it: ``skip`` >= 1)."""
    if skip < 1 or count < 1:
        raise ValueError("the window needs skip >= 1 (its first step is timed from the line before) and steps >= 1")
    by_index = {s.index: s for s in steps}
    wanted = range(skip - 1, skip + count)
    missing = [i for i in wanted if i not in by_index]
    if missing:
        raise ValueError(f"the log has no line for step(s) {', '.join(map(str, missing[:5]))} of the window "
                         f"{skip}..{skip + count - 1} (it has {len(steps)} step lines; log_iter must be 1)")
    times = [by_index[i].arrived - by_index[i - 1].arrived for i in range(skip, skip + count)]
    inside = [by_index[i] for i in range(skip, skip + count)]
    own = [s.own for s in inside if s.own is not None]
    first = min(steps, key=lambda s: s.index)
    start, last = by_index[skip - 1].cpu, by_index[skip + count - 1].cpu
    cpu = None if start is None or last is None else [(b - a) / count for a, b in zip(start, last)]
    return Window(seconds_per_step=(by_index[skip + count - 1].arrived - by_index[skip - 1].arrived) / count,
                  median_step=statistics.median(times), data_per_step=statistics.mean(s.data for s in inside),
                  first_data=first.data, own_per_step=statistics.mean(own) if len(own) == len(inside) else None,
                  steps=[round(t, 4) for t in times], cpu_per_step=cpu and cpu[0], worker_cpu_per_step=cpu and cpu[1])


def tree_cpu(pid: int) -> tuple[float, float] | None:
    """(CPU seconds of process ``pid``, of its live children) from /proc; None where /proc cannot say."""
    tick = os.sysconf("SC_CLK_TCK")

    def stat(p: str) -> list[str] | None:
        try:
            with open(f"/proc/{p}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None

    own = stat(str(pid))
    if own is None:
        return None
    kids = 0.0
    for p in filter(str.isdigit, os.listdir("/proc")):
        fields = stat(p)
        if fields is not None and fields[1] == str(pid):
            kids += (int(fields[11]) + int(fields[12])) / tick
    return (int(own[11]) + int(own[12])) / tick, kids


def make_data(workdir: Path, images: int, val: int) -> Path:
    """The demo set (synthdata) in ``workdir/demo``, linked as ``workdir/dataset/coco`` in COCO's own layout."""
    from ppmulti.common.synthdata import generate

    demo = workdir / "demo"
    generate(demo, fmt="coco", n_train=images, n_val=val)   # the same bytes for the same arguments
    coco = workdir / "dataset" / "coco"
    if coco.exists():
        shutil.rmtree(coco)
    (coco / "annotations").mkdir(parents=True)
    (coco / "train2017").symlink_to(demo / "images" / "train")
    (coco / "val2017").symlink_to(demo / "images" / "val")
    for split in ("train", "val"):
        (coco / "annotations" / f"instances_{split}2017.json").symlink_to(
            demo / "annotations" / f"instances_{split}.json")
    return coco


def read_config(path: Path) -> dict:
    """A ppdet config with its ``_BASE_`` files merged (later over earlier, the file over its bases, sections
    merged key by key, lists replaced, as ppdet merges them); ppdet's ``!Class`` tags read as plain mappings."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def tagged(loader, _suffix, node):
        return loader.construct_mapping(node, deep=True) if isinstance(node, yaml.MappingNode) else None

    Loader.add_multi_constructor("!", tagged)

    def merge(into: dict, more: dict) -> dict:
        for key, value in more.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value
        return into

    body = yaml.load(path.read_text(), Loader=Loader) or {}
    merged: dict = {}
    for base in body.pop("_BASE_", []) or []:
        merge(merged, read_config(path.parent / base))
    return merge(merged, body)


def eval_pixels(cfg: dict) -> int | None:
    """A merged config's eval size in pixels: release/2.6's ``eval_height`` (PP-YOLOE, PicoDet), else release/2.7
    RT-DETR's ``eval_size: [h, w]`` (its height); None where it names neither."""
    if cfg.get("eval_height"):
        return int(cfg["eval_height"])
    size = cfg.get("eval_size")
    return int(size[0]) if isinstance(size, (list, tuple)) and size else None


def size_override(config: Path, size: str) -> list[str]:
    """``-o TrainReader.batch_transforms=[...]`` with the config's BatchRandomResize drawing one size: ``size`` pixels,
    or the config's eval size for "eval" (see ``eval_pixels``); nothing for "random" (the config's own draw) or
    without that op. Both trainers draw their sizes with their own seeds, and a step at 768 px costs 6x one at
    320 px: with the draw left in, a few steps compare sizes more than trainers."""
    if size == "random":
        return []
    cfg = read_config(config)
    ops = ((cfg.get("TrainReader") or {}).get("batch_transforms")) or []
    at = next((i for i, op in enumerate(ops) if isinstance(op, dict) and "BatchRandomResize" in op), None)
    if at is None:
        return []
    pixels = int(size) if size != "eval" else eval_pixels(cfg) or max(ops[at]["BatchRandomResize"]["target_size"])
    ops = [dict(op) for op in ops]
    ops[at] = {"BatchRandomResize": {**ops[at]["BatchRandomResize"], "target_size": [pixels]}}
    return [f"TrainReader.batch_transforms={json.dumps(ops, separators=(',', ':'))}"]


def pinned_sizes(config: Path, size: str) -> dict:
    """What ``size_override`` trains ``config`` at: ``{"train": pixels or None (the config's own draw), "eval": the
    config's eval size in pixels or None}``, for the results' header."""
    said = size_override(config, size)
    ops = json.loads(said[0].split("=", 1)[1]) if said else []
    train = next((op["BatchRandomResize"]["target_size"][0] for op in ops if "BatchRandomResize" in op), None)
    return {"train": train, "eval": eval_pixels(read_config(config))}


def overrides(args: argparse.Namespace, config: Path | None = None) -> list[str]:
    out = ["use_gpu=false", "epoch=1", "num_classes=3", f"TrainReader.batch_size={args.batch}", "log_iter=1",
           "pretrain_weights="]
    if args.workers is not None:
        out.append(f"worker_num={args.workers}")
    if config is not None:
        out += size_override(config, args.size)
    return out + list(args.opt)


def command(tool: str, root: Path, config: str, args: argparse.Namespace) -> list[str]:
    train = root / "tools" / "train.py" if tool == "ppdet" else REPO / "tools" / "train.py"
    return [args.python, str(train), "-c", str(root / config), "-o", *overrides(args, root / config)]


def run(cmd: list[str], cwd: Path, log_path: Path, timeout: float) -> tuple[float, list[tuple]]:
    """Run ``cmd`` in its own process group, every output line timestamped as it arrives (and written to
    ``log_path``) with the CPU time of the process and its children then; the group is killed on a timeout or
    an interrupt. Returns (start time, lines); raises on a non-zero exit."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    lines: list[tuple] = []
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        with open(log_path, "w") as log, selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            pending = b""
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{' '.join(cmd[:4])} ... took more than {timeout:.0f} s")
                if not sel.select(timeout=1.0):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                now = time.monotonic()
                if not chunk:
                    break
                pending += chunk
                *done, pending = pending.split(b"\n")
                cpu = tree_cpu(proc.pid) if done else None
                for raw in done:
                    text = raw.decode(errors="replace")
                    lines.append((now, text, cpu))
                    log.write(text + "\n")
                log.flush()
            if pending:
                lines.append((time.monotonic(), pending.decode(errors="replace"), None))
                log.write(lines[-1][1] + "\n")
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if code != 0:
        tail = "\n".join(text for _, text, _ in lines[-15:])
        raise RuntimeError(f"exit {code}: {' '.join(cmd)}\n(log {log_path})\n{tail}")
    return started, lines


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "memory_gib": round(mem, 1),
            "python": platform.python_version(), "system": platform.platform()}


def versions(python: str) -> dict:
    code = "import paddle, ppdet; print('versions', paddle.__version__, ppdet.__version__)"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    said = [line.split()[1:] for line in out.stdout.splitlines() if line.startswith("versions ")]
    paddle_v, ppdet_v = said[-1] if said and len(said[-1]) == 2 else ("", "")
    return {"paddle": paddle_v or "?", "ppdet (ppmulti's)": ppdet_v or "?"}


def _cpu(w: dict) -> str:
    """CPU seconds per step, the training process's + its loader workers'."""
    if w.get("cpu_per_step") is None:
        return "?"
    return f"{w['cpu_per_step']:.2f} + {w['worker_cpu_per_step']:.2f}"


def markdown(result: dict) -> str:
    rows = ["| config | round | PaddleDetection s/step | ppmulti s/step | PaddleDetection / ppmulti "
            "| data wait per step (PD / ppmulti) | CPU s per step (PD / ppmulti) | PD's own batch_cost |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for cfg in result["configs"]:
        for r, pair in enumerate(cfg["rounds"], 1):
            pd, pm = pair["ppdet"], pair["ppmulti"]
            rows.append(f"| {cfg['config']} | {r} | {pd['seconds_per_step']:.3f} | {pm['seconds_per_step']:.3f} | "
                        f"{pair['ratio']:.3f} | {pd['data_per_step']:.4f} / {pm['data_per_step']:.4f} | "
                        f"{_cpu(pd)} / {_cpu(pm)} | {pd['own_per_step']:.3f} |")
        rows.append(f"| {cfg['config']} | median | {cfg['median_ppdet']:.3f} | {cfg['median_ppmulti']:.3f} | "
                    f"**{cfg['median_ratio']:.3f}** | | | |")
    m = result["machine"]
    return "\n".join([
        "# ppmulti's tools/train.py against PaddleDetection's own, on PaddleDetection's configs", "",
        f"Command: `{result['command']}`; {result['date']}; {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; "
        f"Python {m['python']}, Paddle {result['versions']['paddle']}; load average {result['load_average'][0]:.2f} "
        f"before, {result['load_average'][1]:.2f} after.", "",
        f"Overrides (both): `-o {' '.join(result['overrides'])}`; one process each, alternating; steps "
        f"{result['window'][0]}..{result['window'][1]} of epoch 1 (wall time between step log lines as they arrive).",
        f"Training size (`--size {result['size']}`): "
        + ("as each config draws it." if result["size"] == "random" else
           "each config's BatchRandomResize draws one size (the override is in the JSON), so both trainers train "
           "on the same pixels in every step"
           + "".join(f"; {c}: {v['train']} px" + (f" (its eval size {v['eval']} px)" if v["eval"] else "")
                     for c, v in result.get("sizes", {}).items() if v["train"]) + "."),
        "A ratio above 1 means ppmulti is faster.", "", *rows, ""])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ppdet-root", required=True, type=Path, help="a PaddleDetection checkout (release/2.6 or 2.7)")
    p.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), help="config paths inside the checkout")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=12, help="timed steps per run (after --skip)")
    p.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the timing")
    p.add_argument("--batch", type=int, default=8, help="TrainReader.batch_size (one process)")
    p.add_argument("--workers", type=int, default=None, help="worker_num for both (default: the config's)")
    p.add_argument("--size", default="eval", help="training size: the config's BatchRandomResize draws only this "
                   "(pixels), or the config's eval size (eval, the default), or as the config says (random)")
    p.add_argument("-o", "--opt", nargs="*", default=[], help="more overrides, given to both trainers")
    p.add_argument("--python", default=sys.executable, help="the Python of the Paddle 2.6 stack (default: this one)")
    p.add_argument("--workdir", type=Path, default=None, help="where the data set and runs go (default: a temp dir)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="where the JSON and table go")
    p.add_argument("--name", default="ppdet_trainer", help="their file name without .json/.md (another name keeps "
                   "an earlier result, e.g. ppdet_trainer_rtdetr beside release/2.6's ppdet_trainer)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per training run")
    args = p.parse_args(argv)
    root = args.ppdet_root.resolve()
    if not (root / "tools" / "train.py").is_file():
        print(f"error: --ppdet-root {root}: no tools/train.py there; give a PaddleDetection checkout", file=sys.stderr)
        return 2
    missing = [c for c in args.configs if not (root / c).is_file()]
    if missing:
        print(f"error: --configs: {', '.join(missing)} not in {root}", file=sys.stderr)
        return 2
    if args.skip < 1 or args.steps < 1 or args.rounds < 1:
        print("error: --skip, --steps and --rounds must be at least 1", file=sys.stderr)
        return 2
    if args.size not in ("eval", "random") and not (args.size.isdigit() and int(args.size) >= 32):
        print(f"error: --size {args.size}: give pixels (e.g. 320, at least 32), eval or random", file=sys.stderr)
        return 2
    if not args.name or "/" in args.name or args.name.startswith("."):
        print(f"error: --name {args.name!r}: give a plain file name without .json/.md, e.g. ppdet_trainer_rtdetr",
              file=sys.stderr)
        return 2
    # epoch 1 must hold the window: PaddleDetection's COCO source finds 12-15 % of the demo set's images invalid
    images = math.ceil((args.skip + args.steps + 2) * args.batch / 0.75)
    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="ppdet_trainer_")
    workdir = (args.workdir or Path(tmp.name)).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        make_data(workdir, images, 8)
        load_before = os.getloadavg()[0]
        configs = []
        for config in args.configs:
            rounds = []
            for r in range(args.rounds):
                pair = {}
                for tool in (TOOLS if r % 2 == 0 else TOOLS[::-1]):
                    log_path = workdir / f"{Path(config).stem}_{tool}_{r}.log"
                    started, lines = run(command(tool, root, config, args), workdir, log_path, args.timeout)
                    steps = parse_steps(tool, lines)
                    w = window(steps, args.skip, args.steps)
                    pair[tool] = {**w.__dict__, "load_average_after": round(os.getloadavg()[0], 2),
                                  "first_step_line_after": round(steps[0].arrived - started, 2),
                                  "run_seconds": round(lines[-1][0] - started, 2),
                                  **({"log": str(log_path)} if tmp is None else {})}
                    print(f"{config} round {r + 1}/{args.rounds} {tool}: {w.seconds_per_step:.3f} s/step "
                          f"(median {w.median_step:.3f}), data wait {w.data_per_step:.4f} s/step (first step's "
                          f"{w.first_data:.3f} s), CPU s/step {_cpu(pair[tool])}; first step's line after "
                          f"{pair[tool]['first_step_line_after']:.1f} s", flush=True)
                pair["ratio"] = pair["ppdet"]["seconds_per_step"] / pair["ppmulti"]["seconds_per_step"]
                rounds.append(pair)
            configs.append({"config": config, "rounds": rounds,
                            "median_ppdet": statistics.median(x["ppdet"]["seconds_per_step"] for x in rounds),
                            "median_ppmulti": statistics.median(x["ppmulti"]["seconds_per_step"] for x in rounds),
                            "median_ratio": statistics.median(x["ratio"] for x in rounds)})
        result = {"what": "wall seconds per training step, PaddleDetection's tools/train.py and ppmulti's, same "
                          "config and overrides, one process each; ratio = PaddleDetection / ppmulti (> 1: ppmulti "
                          "faster)",
                  "command": " ".join(["python", "bench/ppdet_trainer.py",   # the checkout by its name only
                                       *(a.replace(str(args.ppdet_root), Path(args.ppdet_root).name)
                                         for a in (argv if argv is not None else sys.argv[1:]))]),
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
                  "versions": versions(args.python), "overrides": overrides(args),
                  "size": args.size, "size_overrides": {c: size_override(root / c, args.size) for c in args.configs},
                  "sizes": {c: pinned_sizes(root / c, args.size) for c in args.configs},
                  "window": [args.skip, args.skip + args.steps - 1], "train_images": images,
                  "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)], "configs": configs}
    finally:
        if tmp is not None:
            tmp.cleanup()
    from ppmulti.common.atomic import atomic_write_text

    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / f"{args.name}.json", json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    atomic_write_text(args.out / f"{args.name}.md", table)
    print(table)
    cores = result["machine"]["cores"]
    if max(result["load_average"]) > cores:
        print(f"load average above {cores} cores: the figures are provisional", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
