"""The docs stay true: every shell command in README.md and docs/ is run, named with the test that runs it, or listed
as an install/shell line; the CLI reference matches the parsers; the MkDocs site builds with --strict, stays under
its word budget, reads as a user guide (no lab-notebook words, no sentence cut off), and every headline figure is
the number in the results file it links to."""

from __future__ import annotations

import ast
import html
import importlib.util
import json
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
OWN_DATA = "tests/test_own_data.py::test_the_pages_commands_train_validate_and_predict"
DEPLOY = ("tests/test_deploy_example.py::"
          "test_deploy_example_prints_the_same_boxes_from_paddle_inference_and_onnxruntime")
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
        "tests/test_evolve.py::test_evolve_on_cpu_two_workers_resumes_stops_and_resumes_a_candidate",
    "python tools/train.py --evolve 20 --data dataset/demo/data.yaml --cfg yolov5n --weights '' --img 128 --epochs 5 "
    "--device cpu --project runs/evolve --name demo1": "tests/test_evolve.py::test_train_py_evolve_one_worker",
    "ppmulti launch --detach --nproc_per_node 2 tools/train.py -c configs/demo/ppyoloe_demo.yml":
        "tests/test_detach.py::test_launch_detach_ps_logs",
    "ppmulti ps": "tests/test_detach.py::test_launch_detach_ps_logs",
    "ppmulti logs 1 -f": "tests/test_detach.py::test_launch_detach_ps_logs",
    "ppmulti stop 1": "tests/test_detach.py::test_stop_checkpoints_and_leaves_no_process",
    "ppmulti board output --port 8040": "tests/test_board.py::test_board_serves_the_run_scalars_over_http",
    "python tools/detect.py --weights runs/train/exp/weights/best.pdparams --source video.mp4 --vid-stride 3 "
    "--save-txt --save-crop --save-csv":
        "tests/test_detect_sources.py::test_detect_on_images_and_a_video_writes_what_yolov5_writes",
    "python tools/export.py --weights runs/train/exp/weights/best.pdparams --include onnx --half --simplify":
        "tests/test_export_half.py::test_half_onnx_matches_float32_in_onnxruntime",
    "python tools/train.py --data coco128.yaml --cfg yolov5s --logger visualdl,tensorboard,mlflow":
        "tests/test_trackers.py::test_one_training_logs_the_same_to_visualdl_tensorboard_and_an_mlflow_server",
    "mkdocs build --strict": "tests/test_docs.py::test_mkdocs_build_strict",
    # docs/own-data.md: each layout's block, run as typed (epochs and image counts shortened)
    "ppmulti data demo dataset/shapes --format yolo --train 64 --val 16": OWN_DATA,
    "python tools/train.py --data dataset/shapes/data.yaml --cfg yolov5n --weights '' --img 160 --epochs 30 --batch 16 "
    "--device cpu": OWN_DATA,
    "python tools/val.py --data dataset/shapes/data.yaml --weights runs/train/exp/weights/best.pdparams --img 160":
        OWN_DATA,
    "python tools/detect.py --weights runs/train/exp/weights/best.pdparams --source dataset/shapes/images/val "
    "--save-txt": OWN_DATA,
    "ppmulti data demo dataset/shapes-coco --format coco --train 64 --val 16": OWN_DATA,
    "python tools/train.py -c shapes_ppyoloe.yml --eval": OWN_DATA,
    "python tools/eval.py -c shapes_ppyoloe.yml --weights output/shapes_ppyoloe/weights/best.pdparams": OWN_DATA,
    "python tools/infer.py -c shapes_ppyoloe.yml --weights output/shapes_ppyoloe --infer_dir "
    "dataset/shapes-coco/images/val": OWN_DATA,
    "ppmulti data demo dataset/shapes-voc --format voc --train 64 --val 16": OWN_DATA,
    "ppmulti data convert dataset/shapes-voc dataset/shapes-voc --to yolo": OWN_DATA,
    "python tools/train.py --data dataset/shapes-voc/data.yaml --cfg yolov5n --weights '' --img 160 --epochs 30 "
    "--batch 16 --device cpu": OWN_DATA,
    "python tools/val.py --data dataset/shapes-voc/data.yaml --weights runs/train/exp/weights/best.pdparams "
    "--img 160": OWN_DATA,
    # docs/amp-export.md, Deploying from Python
    "python tools/export.py -c configs/demo/ppyoloe_demo.yml --weights output/ppyoloe_demo --output_dir "
    "output_inference --format onnx": DEPLOY,
    "python examples/deploy.py output_inference/ppyoloe_demo dataset/demo/images/val/000001.jpg": DEPLOY,
    "python examples/deploy.py output_inference/ppyoloe_demo dataset/demo/images/val/000001.jpg --onnx": DEPLOY,
    "python docs/gen_cli.py > docs/cli.md": "tests/test_docs.py::test_cli_reference_matches_the_parsers",
}

# Measurement commands in bench/PERF.md (the developers' record of every measurement, outside the site): each
# produced a dated figure beside it and takes minutes to hours, so no test runs it; checked: the script exists and
# knows every flag the command gives it.
PERF = REPO / "bench" / "PERF.md"
MEASURED = {
    "python bench/stacks.py --python A=PY311 --python B=PY312 --rounds 3 -- --steps 36": "bench/stacks.py",
    "python bench/vs_yolov5.py --yolov5 DIR --img 160 --epochs 4 --rounds 3 --nproc 2 --amp": "bench/vs_yolov5.py",
    "python bench/fastpath.py --rounds 2": "bench/fastpath.py",
    "python bench/loader_vs_yolov5.py --yolov5 DIR --rounds 3": "bench/loader_vs_yolov5.py",
    "python bench/time_to_accuracy.py --yolov5 DIR --seeds 0,1,2": "bench/time_to_accuracy.py",
    "python bench/time_to_accuracy.py --yolov5 DIR --seeds 0,1,2 --cases yolov5,ppmulti/2,ppmulti/1+amp,ppmulti/2+amp":
        "bench/time_to_accuracy.py",
    "python bench/time_to_accuracy.py --yolov5 DIR --seeds 0,1,2 --cases yolov5,ppmulti/2+buffer64,ppmulti/2":
        "bench/time_to_accuracy.py",
    "python bench/loader_vs_yolov5.py --yolov5 DIR --rounds 3 --out bench/results/loader_vs_yolov5_whole_set.json":
        "bench/loader_vs_yolov5.py",
    "python bench/loader_vs_yolov5.py --yolov5 DIR --rounds 3 --mosaic-buffer 64 "
    "--out bench/results/loader_vs_yolov5_buffer64.json": "bench/loader_vs_yolov5.py",
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
    "mkdocs serve": "serves these docs locally (test_mkdocs_build_strict builds the same pages)",
    "sudo -u postgres ": "makes a PostgreSQL user and database (test_evolve_postgres.py makes its own with initdb)",
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
        return "uncovered", "a measurement: its place is bench/PERF.md, not the user guide"
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
    measured = set(commands(PERF.read_text()))
    gone = set(MEASURED) - measured
    assert not gone, f"MEASURED names commands bench/PERF.md no longer shows: {gone}"


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
    literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    if command in literals:   # the module holds the command as the docs show it (and runs it through a shell)
        return
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
    assert "- `--hang-timeout" in text and "- `--generations" in text   # launch's and evolve's own flags


def test_mkdocs_build_strict(site):
    """`mkdocs build --strict` (the `site` fixture below) builds every page, the CLI reference included."""
    assert (site / "cli" / "index.html").is_file()


def test_readme_is_short_and_links_into_the_docs():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).is_file(), f"README links to a missing page: {link}"


# --- the site as a user reads it ---------------------------------------------------------------------------------

WORD_BUDGET = 15_000   # the whole built site, the generated CLI reference included
# Lab-notebook words: the guide says what is true now; measurements and their history live in bench/PERF.md.
FORBIDDEN = [r"\bgoals?\b", r"\bissue #?\d+", r"\b(?:this|last|previous|earlier|next) sessions?\b",
             r"\bexplorations?\b", r"\bfor the record\b", r"\bTODO\b", r"\bFIXME\b", r"\bXXX\b", r"\bSTACK\.md\b",
             r"\bno GPU here\b", r"\bnot met\b", r"\bwhen tried\b", r"\btickets?\b", r"\bitem \d+\)",
             r"\bmeasurement bug\b", r"\bhelpers?'?\b"]


def _nav_pages() -> list[str]:
    import yaml

    def walk(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from walk(value)

    return list(walk(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]))


def words(text: str) -> int:
    """`wc -w` of the page's markdown, the measure the budget was set in (table pipes count too)."""
    return len(text.split())


def test_the_site_stays_within_its_word_budget():
    counts = {page: words((DOCS / page).read_text()) for page in _nav_pages()}
    total = sum(counts.values())
    assert total <= WORD_BUDGET, (f"the site has {total} words, over its {WORD_BUDGET}: "
                                  + ", ".join(f"{p} {n}" for p, n in sorted(counts.items(), key=lambda x: -x[1])))


def _prose(text: str) -> list[tuple[int, str]]:
    """(line number, last line) of every paragraph of plain prose: not code, table, list, heading, quote or html."""
    out, para, fence = [], [], False
    for number, line in enumerate(text.splitlines() + [""], 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = not fence
            para = []
            continue
        if fence:
            continue
        if not stripped or stripped.startswith("#"):
            if para:
                out.append(para[-1])
            para = []
            continue
        starts_block = re.match(r"(\||[-*+] |\d+\. |>|<|!\[|    )", line) is not None
        if starts_block and not para:
            para = None   # a table, list, quote, image or indented block: not a paragraph of its own
        if para is not None:
            para.append((number, stripped))
        elif not stripped:
            para = []
    return out


def test_no_sentence_is_cut_off():
    """A paragraph of prose ends with a full stop (or :, ?, !) before the blank line or heading that follows."""
    bad = []
    for name in ["README.md", *_nav_pages()]:
        path = REPO / name if name == "README.md" else DOCS / name
        for number, last in _prose(path.read_text()):
            if not re.search(r"[.:?!](\*\*|_|\)|`)?$", last):
                bad.append(f"{name}:{number}: ...{last[-60:]}")
    assert not bad, "paragraphs that end without a full stop (cut off?):\n" + "\n".join(bad)


def test_a_cut_off_sentence_is_found():
    text = ("# Page\n\nDistributed evaluation is split across ranks. A 2-rank\n\n## Next\n\nA list follows:\n\n"
            "- an item without a stop\n\n| a | table |\n\n```bash\nppmulti demo\n```\n\n"
            "The bf16 path was trained on this\n")
    assert [last for _, last in _prose(text)] == ["Distributed evaluation is split across ranks. A 2-rank",
                                                  "A list follows:", "The bf16 path was trained on this"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -r docs/requirements.txt)")
    pytest.importorskip("material", reason="mkdocs-material is not installed (pip install -r docs/requirements.txt)")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                           "-d", str(out)], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def _page_text(site: Path, page: str) -> str:
    name = page[:-3]
    path = site / ("index.html" if name == "index" else f"{name}/index.html")
    body = path.read_text()
    body = body[body.find("<article"):body.rfind("</article>")]
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


def _built_pages(site: Path) -> list[str]:
    """Every page mkdocs built, in and out of the nav (the results pages the guide links to), as its source name."""
    pages = []
    for html_file in sorted(site.rglob("index.html")):
        rel = html_file.parent.relative_to(site).as_posix()
        if rel in ("search",) or rel.startswith(("assets", "search/")):
            continue
        pages.append("index.md" if rel == "." else f"{rel}.md")
    return pages


def test_every_published_page_is_found(site):
    pages = _built_pages(site)
    assert set(_nav_pages()) <= set(pages)
    assert {"results/demo.md", "results/rank_gap.md", "results/sync_bn.md"} <= set(pages), pages


def test_the_built_site_reads_as_a_user_guide(site):
    """Every page mkdocs builds (the results pages the guide links to included), and README, speak of the product."""
    found = []
    texts = [(page, _page_text(site, page)) for page in _built_pages(site)]
    texts.append(("README.md", (REPO / "README.md").read_text()))
    for page, text in texts:
        for pattern in FORBIDDEN:
            found += [f"{page}: '{m.group(0)}' in ...{text[max(0, m.start() - 60):m.end() + 40]!r}"
                      for m in re.finditer(pattern, text, re.I)]
    assert not found, "words of a lab notebook, not of a user guide:\n" + "\n".join(found)


def test_the_site_shows_the_version(site):
    from ppmulti import __version__

    assert f"ppmulti {__version__}" in (site / "index.html").read_text(), \
        "mkdocs.yml's copyright line must name ppmulti's version (ppmulti/common/version.py)"


# --- headline figures come from their results files ----------------------------------------------------------------

NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?=x\b|[^\w.]|\.(?!\d)|$)")


def _numbers_in(value) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, str):
        return [float(n) for n in NUMBER.findall(value)]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [n for item in items for n in _numbers_in(item)]


def _in_results(shown: str, path: Path) -> bool:
    """``shown`` (as printed, e.g. 0.99) is a value of the results file rounded to the digits shown."""
    if path.suffix == ".json":
        decimals = len(shown.split(".")[1]) if "." in shown else 0
        return any(abs(v - float(shown)) <= 0.5 * 10 ** -decimals + 1e-9 for v in _numbers_in(json.loads(
            path.read_text())))
    return re.search(rf"(?<![\w.]){re.escape(shown)}(?![\d])", path.read_text()) is not None


def headline_rows(page: Path) -> list[tuple[list[str], Path]]:
    """The rows of the page's figures table: (the cells after the first, the results file the row links to)."""
    rows = []
    for line in page.read_text().splitlines():
        link = re.search(r"\]\(((?:\.\./)?(?:bench/)?results/[^)#]+)\)", line)
        if not (line.startswith("|") and link):
            continue
        target = (page.parent / link.group(1)).resolve()
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append((cells[1:-1], target))
    return rows


@pytest.mark.parametrize("page", ["README.md", "docs/performance.md"])
def test_headline_figures_are_the_numbers_in_their_results_files(page):
    rows = headline_rows(REPO / page)
    assert len(rows) >= 4, f"{page}: no table of headline figures linking to bench/results/ found"
    bad = []
    for cells, target in rows:
        assert target.is_file(), f"{page} links to a results file that does not exist: {target}"
        for cell in cells:
            text = re.sub(r"`[^`]*`", " ", cell)
            bad += [f"{page}: {n} in '{cell}' is not in {target.name}" for n in NUMBER.findall(text)
                    if not _in_results(n, target)]
    assert not bad, "\n".join(bad)


def test_a_figure_that_is_not_in_its_file_fails(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "x.json").write_text(json.dumps({"rows": [{"ratio": 0.621, "processes": 2}]}))
    page = tmp_path / "page.md"
    page.write_text("| what | figure | file |\n| --- | --- | --- |\n"
                    "| speed | 0.62 of YOLOv5's time on 2 ranks | [x](results/x.json) |\n")
    (cells, target), = headline_rows(page)
    assert [_in_results(n, target) for n in NUMBER.findall(cells[0])] == [True, True]
    page.write_text(page.read_text().replace("0.62 of", "0.60 of"))
    (cells, target), = headline_rows(page)
    assert [_in_results(n, target) for n in NUMBER.findall(cells[0])] == [False, True]


# --- version, changelog, the docs' own requirements ----------------------------------------------------------------

def test_version_prints_the_stack_without_importing_paddle():
    from importlib import metadata

    from ppmulti import __version__

    code = ("import sys; from ppmulti.cli import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit as e:\n    code = e.code\n"
            "print(sorted(m for m in ('paddle', 'ppdet') if m in sys.modules), code)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    first, last = proc.stdout.strip().splitlines()[0], proc.stdout.strip().splitlines()[-1]
    assert last == "[] 0", f"--version imported {last}"
    assert first.startswith(f"ppmulti {__version__} (Python {sys.version.split()[0]}")
    for dist in ("paddlepaddle", "paddledet"):
        try:
            assert f"{dist} {metadata.version(dist)}" in first
        except metadata.PackageNotFoundError:
            pass


def test_changelog_has_the_current_version_and_unreleased():
    from ppmulti import __version__

    text = (REPO / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text
    assert re.search(rf"^## \[{re.escape(__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", text, re.M), \
        f"CHANGELOG.md has no section for ppmulti {__version__} (ppmulti/common/version.py)"
    for heading in re.findall(r"^### (.+)$", text, re.M):
        assert heading in ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"), heading


def test_docs_requirements_pin_mkdocs_and_material_only():
    lines = [line.split("#")[0].strip() for line in (DOCS / "requirements.txt").read_text().splitlines()]
    names = sorted(re.split(r"[=<>!~]", line)[0].lower() for line in lines if line)
    assert names == ["mkdocs", "mkdocs-material"], names
    assert all("==" in line for line in lines if line)


def test_pictures_are_small():
    pictures = sorted((DOCS / "img").glob("*.png"))
    assert pictures, "docs/img/ holds the home page's pictures"
    assert all(p.stat().st_size < 150_000 for p in pictures), [(p.name, p.stat().st_size) for p in pictures]


def _side_by_side() -> list[tuple[str, str]]:
    """ppmulti's commands in the side-by-side tables of the two "Coming from" pages (their right-hand column)."""
    out = []
    for page in ("from-yolov5.md", "from-paddledetection.md"):
        for line in (DOCS / page).read_text().splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| `") and len(cells) == 2:
                out += [(page, code) for code in re.findall(r"`([^`]+)`", cells[1])
                        if code.startswith(("python tools/", "ppmulti launch")) and ".py" in code]
    return out


@pytest.mark.parametrize("page,command", _side_by_side())
def test_side_by_side_commands_parse(page, command):
    """Every flag of ppmulti's column is one its launcher and tool know (`...` stands for the rest of the line)."""
    from ppmulti.procs.launch.flags import build_parser as launch_parser

    words = [w for w in shlex.split(command) if w != "..."]
    script = next(i for i, w in enumerate(words) if w.endswith(".py"))
    if words[0] == "ppmulti":
        _, extra = launch_parser().parse_known_args(words[2:script])
        assert not extra, f"{page}: ppmulti launch does not know {extra}: {command}"
    _, extra = _gen_cli().tool_parser(Path(words[script]).stem).parse_known_args(words[script + 1:])
    assert not extra, f"{page}: {words[script]} does not know {extra}: {command}"


# --- claims the guide makes that a test can check -----------------------------------------------------------------

# Flags of other programs that the guide names in passing, with the program: everything else in backticks that looks
# like a flag must be one that ppmulti's parsers know, or one that ppmulti refuses by name.
OTHER_PROGRAMS = {
    "--no-deps": "pip", "-e": "pip", "-m": "python -m / pytest -m", "--shm-size": "docker run",
    "--strict": "mkdocs build", "--logdir": "tensorboard", "--ntasks-per-node": "srun", "-N2": "srun",
    "--tee": "torchrun (refused by ppmulti launch in one line)",
}


def _known_flags() -> tuple[set[str], set[str]]:
    """(every option string of ppmulti's parsers and tools, every flag a tool refuses by name)."""
    import argparse

    from ppmulti.cli import build_parser
    from ppmulti.common.train_flags import UNSUPPORTED

    module = _gen_cli()
    known: set[str] = set()

    def collect(parser):
        for action in parser._actions:
            known.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    collect(sub)

    collect(build_parser())
    for example in (REPO / "examples").glob("*.py"):   # examples/deploy.py's own flags
        known.update(re.findall(r"add_argument\(\"(--[\w-]+)\"", example.read_text()))
    for make in module._passthrough_parsers().values():
        collect(make())
    refused = set(UNSUPPORTED)
    for tool in module.tools():
        collect(module.tool_parser(tool))
        spec = importlib.util.spec_from_file_location(f"_docs_tool_{tool}", REPO / "tools" / f"{tool}.py")
        source = (REPO / "tools" / f"{tool}.py").read_text()
        if "UNSUPPORTED = " in source:
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            refused.update(mod.UNSUPPORTED)
    return known, refused


def _flags_in_prose(text: str) -> list[str]:
    """Flags written in inline code (`--x`, `--x VALUE`) outside code blocks."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return [f for span in re.findall(r"`([^`\n]+)`", text) for f in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", span)]


def test_every_flag_the_guide_names_exists():
    known, refused = _known_flags()
    bad = []
    for name in ["README.md", *_nav_pages()]:
        path = REPO / name if name == "README.md" else DOCS / name
        bad += [f"{name}: {flag}" for flag in _flags_in_prose(path.read_text())
                if flag not in known and flag not in refused and flag not in OTHER_PROGRAMS]
    assert not bad, "flags the guide names that no parser knows or refuses:\n" + "\n".join(sorted(set(bad)))


def test_a_flag_that_does_not_exist_is_found():
    known, refused = _known_flags()
    assert "--mosaic-buffer" in known and "--quad" in refused
    assert [f for f in _flags_in_prose("Use `--mosaic-bufer 64` or `--quad`.") if f not in known | refused] \
        == ["--mosaic-bufer"]


@pytest.mark.slow
def test_the_files_the_run_directory_table_names_are_written(yolov5_run, two_rank_run):
    """configs.md's run-directory table against real runs: a YOLOv5 line (conftest.yolov5_run; it is --noplots, so
    the pictures are left to the plot tests) and a 2-rank run for logs/rankN.log. hyp.yaml without --hyp:
    test_own_data.py's runs."""
    table = (DOCS / "configs.md").read_text().split("## The run directory", 1)[1].split("## Resume", 1)[0]
    named = [f for row in table.splitlines() if row.startswith("| `")
             for f in re.findall(r"`([^`]+)`", row.split("|")[1])]
    assert "hyp.yaml" in named and "weights/last.pdstate" in named
    pictures = {f for f in named if f.endswith((".png", ".jpg"))}   # the yolov5 run is --noplots: visualdl.md's test
    missing = []
    for name in named:
        if name in pictures or name == "...":
            continue
        run = two_rank_run.path if "rankN" in name else yolov5_run.path
        path = run / name.replace("rankN", "rank1")
        if not path.exists():
            missing.append(f"{name} (looked for {path})")
    assert not missing, "files configs.md says a run writes, missing from a real run:\n" + "\n".join(missing)


def linked_sentences(text: str) -> list[tuple[str, str]]:
    """(sentence, results file) for each prose sentence of ``text`` that links to a results file."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    out = []
    for para in re.split(r"\n\s*\n", text):
        if para.lstrip().startswith("|"):
            continue   # tables: headline_rows
        flat = " ".join(para.split())
        for sentence in re.split(r"(?<=[a-z0-9)`*][.!?])\s+(?=[A-Z`(\[])", flat):
            for link in re.findall(r"\]\(((?:\.\./)?(?:bench/)?results/[^)#]+)\)", sentence):
                out.append((sentence, link))
    return out


def test_figures_in_sentences_are_the_numbers_in_their_results_files():
    """A figure given in a sentence that links to its results file (`2.33x the step time ([sync_bn.md](...))`) is a
    number of that file: decimals and ratios (plain whole numbers such as "2 ranks" are conditions, not figures)."""
    bad, seen = [], 0
    for name in ["README.md", *_nav_pages()]:
        path = REPO / name if name == "README.md" else DOCS / name
        for sentence, link in linked_sentences(path.read_text()):
            target = (path.parent / link).resolve()
            assert target.is_file(), f"{name} links to a missing results file: {link}"
            seen += 1
            plain = re.sub(r"`[^`]*`|\[[^\]]*\]\([^)]*\)", " ", sentence)
            figures = [n for n in re.findall(r"(?<![\w.])(\d+\.\d+(?:e-?\d+)?|\d+(?:\.\d+)?(?=x\b))", plain)]
            bad += [f"{name}: {n} ('{sentence[:90]}...') is not in {target.name}" for n in figures
                    if not _in_results(n, target)]
    assert seen >= 2, "no sentence links a results file: is the link syntax still ](results/...)?"
    assert not bad, "\n".join(bad)


def test_a_sentence_figure_not_in_its_file_fails(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "x.md").write_text("| mode | s/step |\n| plain | 0.217 |\n\ntakes 2.33x the step time\n")
    text = "It takes 2.33x the step time ([x.md](results/x.md)), 0.217 s a step. Another sentence: 9.99."
    (sentence, link), = linked_sentences(text)
    assert "9.99" not in sentence and link == "results/x.md"
    assert _in_results("2.33", tmp_path / link) and not _in_results("2.34", tmp_path / link)


def test_every_results_file_holds_its_command_and_date():
    """README and performance.md say each results file holds its command and date: every file in bench/results."""
    bad = []
    for path in sorted((REPO / "bench" / "results").rglob("*")):
        if path.suffix not in (".json", ".md"):
            continue
        text = path.read_text()
        if not re.search(r"20\d\d-\d\d-\d\d", text):
            bad.append(f"{path.name}: no date")
        if not re.search(r"(python (bench|tools)/[\w./]+\.py|ppmulti (bench|demo)\b)", text):
            bad.append(f"{path.name}: no command")
    assert not bad, "\n".join(bad)


def test_talk_of_the_work_is_found():
    for text in ("what differs (issue 34, item 1)", "0.42 (goal: at most 0.5)", "failed on CPU/gloo when tried",
                 "three other helpers' jobs", "A measurement bug, fixed:"):
        assert any(re.search(p, text, re.I) for p in FORBIDDEN), text
