"""The docs stay true: every shell command in README.md and docs/ is run, named with the test that runs it, or listed
as an install/shell line; the CLI reference matches the parsers; the MkDocs site builds with --strict."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]

# (b) Commands that a named test, or a session fixture of conftest that tests read, really runs (with its own paths,
# sizes and epochs). Checked: the test or fixture exists, and its module uses the command's program and every flag.
TESTED = {
    "ppmulti demo": "tests/test_cli.py::test_demo_command_end_to_end",
    "ppmulti data demo dataset/demo": "tests/test_cli.py::test_data_demo_command",
    "ppmulti data demo dataset/demo --format yolo": "tests/test_cli.py::test_data_demo_command",
    "python tools/train.py -c configs/demo/ppyoloe_demo.yml --eval": "tests/conftest.py::ppyoloe_run",
    "python tools/eval.py -c configs/demo/ppyoloe_demo.yml --weights output/ppyoloe_demo/weights/best.pdparams":
        "tests/test_train.py::test_eval_from_checkpoint_matches_training",
    "python tools/infer.py -c configs/demo/ppyoloe_demo.yml --weights output/ppyoloe_demo --infer_dir "
    "dataset/demo/images/val --output_dir output/infer": "tests/test_train.py::test_infer_draws_pngs",
    "python tools/export.py -c configs/demo/ppyoloe_demo.yml --weights output/ppyoloe_demo --output_dir "
    "output_inference": "tests/test_train.py::test_export_inference_model",
    "python tools/export.py -c configs/demo/ppyoloe_demo.yml --weights output/ppyoloe_demo --format onnx --no-nms "
    "--dynamic": "tests/test_onnx_export.py::test_without_nms_dynamic_batch_matches_paddle",
    "python tools/train.py -c configs/demo/ppyoloe_demo.yml --resume output/ppyoloe_demo":
        "tests/test_train.py::test_resume_continues_where_it_stopped",
    "python tools/train.py --data dataset/demo/data.yaml --cfg yolov5n --weights '' --img 160 --epochs 30 --batch 16 "
    "--hyp configs/hyps/hyp.demo.yaml --optimizer AdamW --cos-lr --device cpu --workers 1":
        "tests/conftest.py::yolov5_run",
    "python tools/eval.py --data dataset/demo/data.yaml --weights runs/train/exp/weights/best.pdparams --img 160":
        "tests/test_eval_tool.py::test_eval_with_and_without_the_runs_config_matches_the_runs_own_evaluation",
    "python tools/val.py --data dataset/demo/data.yaml --weights runs/train/exp/weights/best.pdparams --img 160 "
    "--batch 16": "tests/test_yolov5_tools.py::test_val_detect_export_and_detect_from_onnx_as_yolov5s_ci",
    "python tools/detect.py --weights runs/train/exp/weights/best.pdparams --source dataset/demo/images/val "
    "--save-txt": "tests/test_yolov5_tools.py::test_val_detect_export_and_detect_from_onnx_as_yolov5s_ci",
    "python tools/export.py --weights runs/train/exp/weights/best.pdparams --include onnx":
        "tests/test_yolov5_tools.py::test_val_detect_export_and_detect_from_onnx_as_yolov5s_ci",
    "python tools/detect.py --weights runs/train/exp/weights/best.onnx --source dataset/demo/images/val --save-txt":
        "tests/test_yolov5_tools.py::test_val_detect_export_and_detect_from_onnx_as_yolov5s_ci",
    "python tools/train.py -c configs/demo/ppyoloe_demo.yml --device cpu --nproc 2":
        "tests/test_distributed.py::test_train_py_device_cpu_nproc_relaunches",
    "python -m paddle.distributed.launch --nproc_per_node 2 tools/train.py -c configs/demo/ppyoloe_demo.yml":
        "tests/test_distributed.py::test_paddle_launcher_without_ppmulti",
    "srun -N2 --ntasks-per-node=1 ppmulti launch --dry-run tools/train.py -c configs/yolo.yml":
        "tests/test_cluster_env.py::test_srun_two_nodes_plan_from_slurms_variables",
    "srun ppmulti launch tools/train.py -c configs/yolo.yml --batch 128":
        "tests/test_cluster_env.py::test_sbatch_two_nodes_train_together",
    "ppmulti evolve --devices cpu --workers 2 --generations 20 --project runs/evolve/demo -- --data "
    "dataset/demo/data.yaml --cfg yolov5n --img 128 --epochs 5 --batch 16 --workers 0":
        "tests/test_evolve.py::test_evolve_on_cpu_two_workers_resumes",
    "python tools/train.py --evolve 20 --data dataset/demo/data.yaml --cfg yolov5n --weights '' --img 128 --epochs 5 "
    "--device cpu --project runs/evolve --name demo1": "tests/test_evolve.py::test_train_py_evolve_one_worker",
    "ppmulti launch --detach --nproc_per_node 2 tools/train.py -c configs/demo/ppyoloe_demo.yml":
        "tests/test_detach.py::test_launch_detach_ps_logs",
    "ppmulti ps": "tests/test_detach.py::test_launch_detach_ps_logs",
    "ppmulti logs 1 -f": "tests/test_detach.py::test_launch_detach_ps_logs",
    "ppmulti stop 1": "tests/test_detach.py::test_stop_checkpoints_and_leaves_no_process",
    "ppmulti board output --port 8040": "tests/test_board.py::test_board_serves_the_run_scalars_over_http",
    "ppmulti bench --predict --gpus 8 --nodes 4 --bandwidth 100Gbit":
        "tests/test_perf_scaling.py::test_predict_command_answers_without_gpu",
    "mkdocs build --strict": "tests/test_docs.py::test_mkdocs_build_strict",
    "python docs/gen_cli.py > docs/cli.md": "tests/test_docs.py::test_cli_reference_matches_the_parsers",
}

# Measurement commands on the performance page: each produced a dated figure beside it and takes minutes to hours,
# so no test runs it; checked: the script exists and knows every flag the command gives it.
MEASURED = {
    "python bench/stacks.py --python A=PY311 --python B=PY312 --rounds 3 -- --steps 36": "bench/stacks.py",
    "python bench/vs_yolov5.py --yolov5 DIR --img 160 --epochs 4 --rounds 3 --nproc 2 --amp": "bench/vs_yolov5.py",
    "python bench/fastpath.py --rounds 2": "bench/fastpath.py",
    "python bench/loader_vs_yolov5.py --yolov5 DIR --rounds 3": "bench/loader_vs_yolov5.py",
    "python bench/time_to_accuracy.py --yolov5 DIR --seeds 0,1,2": "bench/time_to_accuracy.py",
    "python bench/time_to_accuracy.py --yolov5 DIR --seeds 0,1,2 --cases yolov5,ppmulti/2,ppmulti/1+amp,ppmulti/2+amp":
        "bench/time_to_accuracy.py",
    "python tools/train.py --data DATA/data.yaml --cfg yolov5n --weights '' --hyp configs/hyps/hyp.scratch-low.yaml "
    "--img 256 --epochs 30 --batch 16 --device cpu --workers 2 --nproc 2 --accumulate 1": "tools/train.py",
    "python bench/amp.py --rounds 2 --demo-epochs 30 --yolo-epochs 15": "bench/amp.py",
    "ppmulti bench --heartbeat --models yolov5s --ranks 1,2 --repeat 3": "ppmulti bench",
    "python tools/train.py --data dataset/demo/data.yaml --cfg yolov5n --weights '' --img 160 --epochs 30 --batch 16 "
    "--hyp configs/hyps/hyp.demo.yaml --optimizer AdamW --cos-lr --device cpu --nproc 2 --workers 1 --noval":
        "tools/train.py",
}

# (c) Install and shell lines: they change the environment rather than exercise ppmulti (the install lines are
# what CI's fresh venvs run), or they run the test suite itself.
SHELL = {
    "pip ": "an install (CI installs this way in fresh venvs)",
    "python3.12 -m venv": "makes a venv",
    ". .venv/bin/activate": "activates it",
    "export ": "sets a variable",
    "kubectl apply": "submits a manifest to a cluster",
    "python -m pytest": "runs this test suite",
    "etcd ": "starts etcd (tests/test_elastic.py's etcd fixture starts it with these flags on loopback ports)",
}

# Placeholders in the docs and what the dry runs use instead (loopback addresses this machine owns).
SUBSTITUTE = {"10.0.0.1": "127.0.0.2", "10.0.0.2": "127.0.0.3"}


def _blocks(text: str) -> list[str]:
    """The bodies of fenced shell code blocks (```bash / sh / shell / console), dedented."""
    out = []
    for m in re.finditer(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```", text, re.M | re.S):
        if m.group(2) in ("bash", "sh", "shell", "console"):
            indent = len(m.group(1))
            out.append("\n".join(line[indent:] for line in m.group(3).splitlines()))
    return out


def commands(text: str) -> list[str]:
    """Shell commands in ``text``'s code blocks: continuations joined, comments dropped, `&&` chains split."""
    out = []
    for block in _blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if not line or line.startswith("#"):
                continue
            out += [" ".join(part.split()) for part in line.split(" && ")]
    return out


def _without_env(command: str) -> str:
    words = command.split()
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words.pop(0)
    return " ".join(words)


def classify(command: str, page: str) -> tuple[str, str]:
    """(kind, detail): tested / measured / shell / run (a --help or --dry-run, or a launch run with --dry-run)."""
    if command in TESTED:
        return "tested", TESTED[command]
    if command in MEASURED:
        return ("measured", MEASURED[command]) if page == "performance.md" else ("uncovered", "measured elsewhere")
    bare = _without_env(command)
    for prefix, why in SHELL.items():
        if bare.startswith(prefix):
            return "shell", why
    words = shlex.split(bare)
    if words[:2] == ["ppmulti", "launch"] and "--detach" not in words:
        dry = command if "--dry-run" in words else command.replace("ppmulti launch", "ppmulti launch --dry-run", 1)
        return "run", dry
    if "--help" in words or "--dry-run" in words:
        return "run", command
    return "uncovered", ""


def _all_commands() -> list[tuple[str, str]]:
    return [(page.name, c) for page in PAGES for c in commands(page.read_text())]


def test_every_shell_command_in_the_docs_is_covered():
    found = _all_commands()
    assert len(found) > 40, "the extractor found too few commands; is the code-block syntax still ```bash?"
    uncovered = [(page, c) for page, c in found if classify(c, page)[0] == "uncovered"]
    assert not uncovered, ("commands that no test runs: add --dry-run/--help, name the test in TESTED, or drop them:\n"
                           + "\n".join(f"  {p}: {c}" for p, c in uncovered))
    shown = {c for _, c in found}
    assert not set(TESTED) - shown, f"TESTED names commands the docs no longer show: {set(TESTED) - shown}"
    assert not set(MEASURED) - shown, f"MEASURED names commands the docs no longer show: {set(MEASURED) - shown}"


def _flags(command: str) -> list[str]:
    words = shlex.split(_without_env(command.split(" > ")[0]))
    return [w.split("=", 1)[0] for w in words if w.startswith("-") and w != "--" and not w.lstrip("-").isdigit()]


def _program(command: str) -> str:
    words = shlex.split(_without_env(command.split(" > ")[0]))
    if words[0] in ("srun",):
        return "srun"
    if words[0] == "ppmulti":
        return words[1]
    script = next((w for w in words[1:] if w.endswith(".py") or "." in w and words[1] == "-m"), words[0])
    return script


def _quoted(word: str, source: str) -> bool:
    """``word`` opens a string literal in ``source`` (a script also by its file name: REPO / "tools" / "train.py")."""
    return any(f"{q}{w}" in source for q in "'\"" for w in {word, word.rsplit("/", 1)[-1]})


@pytest.mark.parametrize("command", sorted(TESTED))
def test_named_test_exists_and_runs_the_command(command):
    path, name = TESTED[command].split("::")
    source = (REPO / path).read_text()
    tree = ast.parse(source)
    names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert name in names, f"{TESTED[command]} does not exist (doc command: {command})"
    program = _program(command)
    missing = [f for f in [program, *_flags(command)] if not _quoted(f, source)]
    assert not missing, f"{TESTED[command]} never uses {missing} of the doc command: {command}"


@pytest.mark.parametrize("command", sorted(MEASURED))
def test_measurement_commands_name_real_scripts_and_flags(command):
    target = MEASURED[command]
    flags = _flags(command.split(" -- ")[0])
    if target == "ppmulti bench":
        from ppmulti.procs.bench.command import register
        import argparse

        sub = argparse.ArgumentParser().add_subparsers()
        register(sub)
        _, extra = sub.choices["bench"].parse_known_args(shlex.split(command)[2:])
        assert not extra, f"ppmulti bench does not know {extra}"
        return
    if target == "tools/train.py":
        from ppmulti.common.train_flags import build_parser

        _, extra = build_parser().parse_known_args(shlex.split(command)[2:])
        assert not extra, f"tools/train.py does not know {extra}"
        return
    source = (REPO / target).read_text()
    missing = [f for f in flags if f'"{f}"' not in source and f"'{f}'" not in source]
    assert not missing, f"{target} has no flag {missing} (command: {command})"


def _runs() -> list[tuple[str, str]]:
    return sorted({(page, detail) for page, c in _all_commands() for kind, detail in [classify(c, page)]
                   if kind == "run"})


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A directory that looks like a checkout (tools/, configs/) without being one: dry runs write nothing here."""
    root = tmp_path_factory.mktemp("docs_cwd")
    for name in ("tools", "configs"):
        (root / name).symlink_to(REPO / name)
    return root


@pytest.mark.parametrize("page,command", _runs())
def test_help_and_dry_run_commands_run(page, command, workdir):
    for placeholder, value in SUBSTITUTE.items():
        command = command.replace(placeholder, value)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(REPO)}
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "SLURM_JOB_ID", "SLURM_STEP_NUM_NODES"):
        env.pop(name, None)
    before = set(workdir.iterdir())
    proc = subprocess.run(["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{page}: {command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert proc.stdout.strip(), f"{page}: {command} printed nothing"
    assert set(workdir.iterdir()) == before, f"{page}: {command} wrote files; a dry run must not"
    if "--dry-run" in command and "ppmulti launch" in command:
        assert "paddle.distributed.launch" in proc.stdout or "ssh " in proc.stdout, proc.stdout


def _gen_cli():
    spec = importlib.util.spec_from_file_location("gen_cli", DOCS / "gen_cli.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_matches_the_parsers():
    """docs/cli.md is what `python docs/gen_cli.py > docs/cli.md` writes from today's parsers."""
    proc = subprocess.run([sys.executable, "docs/gen_cli.py"], capture_output=True, text=True, timeout=60,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (DOCS / "cli.md").read_text(), \
        "docs/cli.md differs from the parsers: run `python docs/gen_cli.py > docs/cli.md`"


def test_cli_reference_covers_every_command_without_paddle():
    code = ("import sys; sys.path.insert(0, 'docs'); import gen_cli; text = gen_cli.render(); "
            "print(sorted(m for m in ('paddle', 'ppdet') if m in sys.modules)); print(text)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    first, text = proc.stdout.split("\n", 1)
    assert first == "[]", f"generating the CLI reference imported {first}"
    from ppmulti.cli import build_parser

    module = _gen_cli()
    for name, sub, _ in module._subparsers(build_parser()):
        assert f"## `ppmulti {name}`" in text
        takes_rest = any(a.nargs == "..." for a in sub._actions)
        assert not takes_rest or name in module._passthrough_parsers(), \
            f"ppmulti {name} hands its flags to another parser: name it in gen_cli._passthrough_parsers"
    for tool in sorted(p.stem for p in (REPO / "tools").glob("*.py")):
        assert f"## `python tools/{tool}.py`" in text, f"tools/{tool}.py is missing from gen_cli.TOOLS"
    assert "`--hang-timeout SECONDS`" in text and "`--generations" in text   # launch's and evolve's own flags


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]'); CI installs it")
    pytest.importorskip("material", reason="mkdocs-material is not installed (pip install -e '.[docs]')")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "site" / "cli" / "index.html").is_file()


def test_readme_is_short_and_links_into_the_docs():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).is_file(), f"README links to a missing page: {link}"
