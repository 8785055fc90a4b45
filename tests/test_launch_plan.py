"""ppmulti launch's flag builders one concern at a time, the one port check, each message's one home, LauncherSpec."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from ppmulti.common import compat
from ppmulti.common import envvars as E
from ppmulti.common.compat import PADDLE_2_6, PADDLE_3, LauncherSpec, installed_version, launcher_spec
from ppmulti.common.errors import UserError
from ppmulti.procs.launch import plan as P
from ppmulti.procs.launch.flags import (WORKER_PATH, Devices, Master, Nodes, Restarts, StartPort, build_plan,
                                        devices_of, gpu_ids_of, master_of, nodes_of, parse_launch_args, restarts_of,
                                        script_of, start_port_of, to_paddle)
from ppmulti.procs.launch.plan import LaunchPlan, check_master_port, check_port, check_start_port

REPO = Path(__file__).resolve().parents[1]
LAUNCH_DIR = REPO / "ppmulti" / "procs" / "launch"


def ns(*argv: str):
    return parse_launch_args([*argv, "t.py"])


# --- script ------------------------------------------------------------------------------------------------
def test_script_of_keeps_the_arguments_and_wants_the_launchers_suffix():
    assert script_of(parse_launch_args(["t.py", "-c", "x"]), PADDLE_2_6) == ("t.py", ("-c", "x"))
    with pytest.raises(UserError, match="no training script given"):
        script_of(parse_launch_args([]), PADDLE_2_6)
    with pytest.raises(UserError, match=r"^t\.sh: .*\.py file$"):
        script_of(parse_launch_args(["t.sh"]), PADDLE_2_6)


# --- nodes -------------------------------------------------------------------------------------------------
def test_master_of_reads_both_spellings():
    assert master_of(ns()) == Master()
    assert master_of(ns("--master_addr", "h", "--master_port", "29600")) == Master("h", 29600, "--master_port")
    assert master_of(ns("--master", "http://10.0.0.1:8090")) == Master("10.0.0.1", 8090, "--master")
    with pytest.raises(UserError, match="^--master x: not a TCP port .*e.g. --master 10.0.0.1:29500$"):
        master_of(ns("--master", "h:x"))
    with pytest.raises(UserError, match="give one of them"):
        master_of(ns("--master", "h:1", "--master_port", "2"))


NODES = [
    ("one_node", [], {}, set(), Nodes()),
    ("standalone", ["--standalone"], {}, set(), Nodes()),
    ("host_from_pod_ip", [], {E.POD_IP: "10.0.0.5"}, set(),
     Nodes(host="10.0.0.5", notes=("--host 10.0.0.5 from POD_IP",))),
    ("master_default_port", ["--nnodes", "2", "--node_rank", "1", "--master_addr", "h"], {}, set(),
     Nodes(2, 1, "h", P.DEFAULT_MASTER_PORT, None, notes=("--master_port 29500 (torchrun's default)",))),
    ("master_named_port", ["--nnodes", "3", "--node_rank", "2", "--master", "h:7000"], {}, set(),
     Nodes(3, 2, "h", 7000, "--master")),
    ("ips_found_here", ["--ips", "10.0.0.1,10.0.0.2"], {}, {"10.0.0.2"},
     Nodes(2, 1, None, None, None, ("10.0.0.1", "10.0.0.2"), "10.0.0.2",
           ("--host 10.0.0.2: the one address of --ips that belongs to this machine",))),
    ("ips_with_host", ["--ips", "127.0.0.2,127.0.0.3", "--host", "127.0.0.3", "--node_rank", "1"], {}, set(),
     Nodes(2, 1, None, None, None, ("127.0.0.2", "127.0.0.3"), "127.0.0.3")),
]


@pytest.mark.parametrize("argv, environ, addrs, want", [n[1:] for n in NODES], ids=[n[0] for n in NODES])
def test_nodes_of(argv, environ, addrs, want):
    assert nodes_of(ns(*argv), environ, addrs) == want


def test_nodes_of_names_where_a_wrong_host_came_from():
    with pytest.raises(UserError, match="^POD_IP 10.0.0.9 is not one of --ips"):
        nodes_of(ns("--ips", "10.0.0.1,10.0.0.2"), {E.POD_IP: "10.0.0.9"}, set())
    with pytest.raises(UserError, match="^--host 10.0.0.9 is not one of --ips"):
        nodes_of(ns("--ips", "10.0.0.1,10.0.0.2", "--host", "10.0.0.9"), {}, set())


# --- devices -----------------------------------------------------------------------------------------------
DEVICES = [
    ("cpu_default", [], {}, 0, Devices("cpu", 1)),
    ("cpu_two", ["--nproc_per_node", "2"], {}, None, Devices("cpu", 2)),
    ("cpu_on_gpu_machine", ["--device", "CPU", "--nproc_per_node", "2"], {}, 4, Devices("cpu", 2)),
    ("gpu_auto", ["--nproc_per_node", "auto"], {}, 2, Devices("gpu", 2, ("0", "1"))),
    ("gpu_first_n", ["--nproc_per_node", "1"], {}, 4, Devices("gpu", 1, ("0",))),
    ("gpu_labels", [], {E.CUDA_VISIBLE_DEVICES: "5,7"}, 2, Devices("gpu", 2, ("5", "7"))),
    ("gpu_listed", ["--devices", "1,3", "--nproc_per_node", "2"], {}, 4, Devices("gpu", 2, ("1", "3"))),
    ("gpu_count_unknown", ["--gpus", "0,1"], {}, None, Devices("gpu", 2, ("0", "1"))),
]


@pytest.mark.parametrize("argv, environ, count, want", [d[1:] for d in DEVICES], ids=[d[0] for d in DEVICES])
def test_devices_of(argv, environ, count, want):
    assert devices_of(ns(*argv), environ, count, PADDLE_2_6) == want


def test_gpu_ids_of_names_the_flag_that_listed_them():
    assert gpu_ids_of(ns()) == ("", ())
    assert gpu_ids_of(ns("--selected_gpu", "2,3")) == ("--selected_gpus", ("2", "3"))
    assert gpu_ids_of(ns("--gpus", "0,1", "--devices", "0, 1")) == ("--gpus", ("0", "1"))
    with pytest.raises(UserError, match="^--nproc_per_node 3 disagrees with --devices 0,1 "):
        devices_of(ns("--devices", "0,1", "--nproc_per_node", "3"), {}, 4, PADDLE_2_6)


def test_cpu_ranks_are_limited_by_gpus_only_where_the_launcher_binds_them():
    with pytest.raises(UserError, match="Paddle 2.6's launcher gives every rank one of this machine's 2 GPU"):
        devices_of(ns("--device", "cpu", "--nproc_per_node", "4"), {}, 2, PADDLE_2_6)
    unbound = dataclasses.replace(PADDLE_2_6, cpu_ranks_take_gpus=False)
    assert devices_of(ns("--device", "cpu", "--nproc_per_node", "4"), {}, 2, unbound) == Devices("cpu", 4)


# --- ports -------------------------------------------------------------------------------------------------
def test_start_port_of_default_variables_and_flag():
    assert start_port_of(ns(), {}, PADDLE_2_6) == StartPort(6070)
    assert start_port_of(ns(), {}, dataclasses.replace(PADDLE_2_6, default_start_port=7000)) == StartPort(7000)
    both = {E.FLAGS_START_PORT: "17000", E.PADDLE_START_PORT: "16000"}
    assert start_port_of(ns(), both, PADDLE_2_6) == StartPort(
        16000, E.PADDLE_START_PORT, ("--start_port 16000 from PADDLE_START_PORT (Paddle 2.6's launcher ignores that "
                                     "variable)",))
    assert start_port_of(ns("--start_port", "18000"), both, PADDLE_2_6) == StartPort(18000, "--start_port")
    assert start_port_of(ns(), {E.FLAGS_START_PORT: ""}, PADDLE_2_6) == StartPort(6070)
    with pytest.raises(UserError, match="^FLAGS_START_PORT=abc in the environment .* pass --start_port$"):
        start_port_of(ns(), {E.FLAGS_START_PORT: "abc"}, PADDLE_2_6)


PORT_OK = [("29500", 29500), (" 80 ", 80), (1, 1), (65535, 65535)]
PORT_BAD = ["x", "0", "65536", "-1", "", "1.5"]


@pytest.mark.parametrize("value, want", PORT_OK)
def test_check_port_accepts(value, want):
    assert check_port(value, "--master_port") == want


@pytest.mark.parametrize("value", PORT_BAD)
def test_check_port_refuses_naming_the_flag_and_an_example(value):
    with pytest.raises(UserError) as info:
        check_port(value, "--ssh-port", "22")
    assert str(info.value) == f"--ssh-port {str(value).strip()}: not a TCP port (1..65535), e.g. --ssh-port 22"


def test_check_port_spans_and_variables():
    assert check_master_port(65534) == 65534 and check_master_port(65535, mode="single") == 65535
    with pytest.raises(UserError, match="^--master_port 65535: Paddle's rendezvous takes the next port, so use "
                                        "1..65534, e.g. --master_port 29500$"):
        check_master_port(65535)
    assert check_start_port(2, "--start_port", 1) == 2
    with pytest.raises(UserError, match=r"^--start_port 65535: .* 2 local rank\(s\) .*so use 2..65534"):
        check_start_port(65535, "--start_port", 2)
    with pytest.raises(UserError, match="^FLAGS_START_PORT 1: .*so use 2..65535$"):   # no flag example for a variable
        check_start_port(1, E.FLAGS_START_PORT, 1)
    with pytest.raises(UserError, match="^PADDLE_START_PORT=99999 in the environment"):
        check_port("99999", E.PADDLE_START_PORT, env_fix="--start_port")


def test_the_port_range_is_written_once():
    """Every port check goes through plan.check_port: no other launch module spells the range."""
    offenders = [f"{path.name}:{n}" for path in sorted(LAUNCH_DIR.glob("*.py")) if path.name != "plan.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"\b6553[45]\b", line)]
    assert not offenders
    plan_lines = [line for line in (LAUNCH_DIR / "plan.py").read_text().splitlines()
                  if re.search(r"\b6553[56]\b", line) and not line.lstrip().startswith(("#", "raise", "f\""))]
    assert len(plan_lines) == 1 and "PORTS = range(1, 65536)" in plan_lines[0]


# --- restarts ----------------------------------------------------------------------------------------------
def test_restarts_of_reads_numbers_and_the_plan_checks_their_range():
    assert restarts_of(ns()) == Restarts(P.DEFAULT_RDZV_TIMEOUT, None)
    assert restarts_of(ns("--rdzv-timeout", "60", "--max-restarts", "3")) == Restarts(60.0, 3)
    with pytest.raises(UserError, match="^--rdzv-timeout 'soon': expected seconds"):
        restarts_of(ns("--rdzv-timeout", "soon"))
    with pytest.raises(UserError, match="^--max_restarts 'x': expected a whole number"):
        restarts_of(ns("--max_restarts", "x"))
    with pytest.raises(UserError, match="^--max_restarts -1: need 0 or more$"):
        LaunchPlan(script="t.py", max_restarts=-1)
    with pytest.raises(UserError, match="^--rdzv-timeout 0: need a positive number"):
        LaunchPlan(script="t.py", rdzv_timeout=0)


def test_build_plan_composes_the_pieces():
    plan = build_plan(ns("--ips", "10.0.0.1,10.0.0.2", "--gpus", "0,1", "--max_restarts", "2"),
                      {E.FLAGS_START_PORT: "17000"}, {"10.0.0.1"}, 2)
    assert (plan.nnodes, plan.node_rank, plan.host, plan.devices, plan.start_port, plan.start_port_flag,
            plan.max_restarts) == (2, 0, "10.0.0.1", ("0", "1"), 17000, E.FLAGS_START_PORT, 2)
    # notes by concern: the nodes', then the ports', then the rendezvous secret's source
    assert [n.split(" ")[0] for n in plan.notes] == ["--host", "--start_port", "rendezvous"]


# --- each message once -------------------------------------------------------------------------------------
def _user_error_texts(path: Path) -> list[tuple[int, str]]:
    """(line, message with every formatted value as ``{}``) for every ``UserError(...)`` written in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "UserError" and node.args:
            arg = node.args[0]
            parts = arg.values if isinstance(arg, ast.JoinedStr) else [arg]
            out.append((node.lineno, "".join(p.value if isinstance(p, ast.Constant) else "{}" for p in parts)))
    return out


ADVICE = ("pass ", "use ", "drop ", "give ", "fix ", "choose ", "start ", "e.g.")


def _rules(message: str) -> list[str]:
    """The statements of a message that say what is wrong, with values and flag names after the first as X:
    two of them alike are one rule written twice, whatever flag or value each names."""
    head, _, rest = message.partition(" ")
    body = re.sub(r"(--[\w-]+|\{\})", "X", rest)
    body = re.sub(r"X(\W{0,2}X)+", "X", body)
    clauses = [c.strip() for c in re.split(r"[;:]", f"{head} {body}")]
    # "--flag X" alone only names the subject; the statement about it follows the colon
    return [c for c in clauses if len(c) >= 16 and not c.startswith(ADVICE) and not re.fullmatch(r"--[\w-]+ X", c)]


def _duplicated_rules(paths: list[Path]) -> list[str]:
    seen: dict[str, str] = {}
    dupes = []
    for path in paths:
        for line, message in _user_error_texts(path):
            for rule in _rules(message):
                where = f"{path.name}:{line}"
                if rule in seen and seen[rule] != where:
                    dupes.append(f"{rule!r}: {seen[rule]} and {where}")
                seen.setdefault(rule, where)
    return dupes


def test_every_launch_error_message_is_written_once():
    """No two UserError calls in flags.py and plan.py state the same problem: each rule has one home."""
    dupes = _duplicated_rules([LAUNCH_DIR / "flags.py", LAUNCH_DIR / "plan.py"])
    assert not dupes, "the same message in two places:\n" + "\n".join(dupes)


def test_the_scan_finds_a_rule_written_twice(tmp_path):
    """Messages that differ only in the flag or value they name count as one rule (as build_plan's and
    LaunchPlan's copies did)."""
    (tmp_path / "a.py").write_text('raise UserError(f"--device cpu with {flag} {value}: drop one of them")\n'
                                   'raise UserError(f"--nproc_per_node {n}: need at least 1 process per node")\n')
    (tmp_path / "b.py").write_text('raise UserError(f"--device cpu with --gpus {ids}: drop one of them")\n'
                                   'raise UserError(f"--nnodes {n}: need at least 1 node")\n')
    dupes = _duplicated_rules([tmp_path / "a.py", tmp_path / "b.py"])
    assert len(dupes) == 1 and "a.py:1 and b.py:1" in dupes[0]


def test_each_plan_rule_owns_a_message():
    tree = ast.parse((LAUNCH_DIR / "plan.py").read_text())
    checks = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("check_")}
    assert {"check_port", "check_script", "check_nproc", "check_ips", "check_host_in_ips"} <= set(checks)
    for name, func in checks.items():
        raises = [n for n in ast.walk(func) if isinstance(n, ast.Raise)]
        calls = {getattr(n.func, "id", "") for n in ast.walk(func) if isinstance(n, ast.Call)}
        assert raises or calls & set(checks), f"{name} neither raises nor delegates to another check"


# --- the launcher's facts in the version seam --------------------------------------------------------------
def test_launcher_spec_is_chosen_by_the_installed_paddle():
    assert launcher_spec((2, 6, 2)) is PADDLE_2_6
    assert launcher_spec(()) is PADDLE_2_6          # no Paddle here (a dry run on a laptop): the oldest entry
    assert launcher_spec((2, 5)) is PADDLE_2_6
    assert launcher_spec((3,)) is PADDLE_3
    assert launcher_spec((3, 3, 1)) is PADDLE_3
    assert launcher_spec((4, 0)) is PADDLE_3        # newer than every entry: the newest one
    assert launcher_spec() is launcher_spec(installed_version() or ())
    assert launcher_spec() is (PADDLE_3 if (installed_version() or ()) >= (3,) else PADDLE_2_6)
    assert [s.since for s in compat.LAUNCHERS] == sorted(s.since for s in compat.LAUNCHERS)


def test_paddle3_launcher_differs_from_2_6_only_in_what_it_gives_workers():
    """Same argv (every flag spelling, default, legacy fallback); Paddle 3.x's differences are modelled as data."""
    changed = {f.name for f in dataclasses.fields(LauncherSpec)
               if getattr(PADDLE_2_6, f.name) != getattr(PADDLE_3, f.name)}
    assert changed == {"name", "since", "master_in_ips_mode", "fixed_port_var", "extra_worker_env", "env_dump_var"}
    assert not PADDLE_2_6.master_in_ips_mode and PADDLE_3.master_in_ips_mode
    assert PADDLE_3.fixed_port_var == E.FLAGS_FIXED_PORT and PADDLE_2_6.fixed_port_var is None
    assert set(PADDLE_3.extra_worker_env) == {E.PADDLE_AUTO_CLUSTER, E.HTTP_PROXY_ORIGINAL, E.HTTPS_PROXY_ORIGINAL}
    assert PADDLE_3.env_dump_var == E.FLAGS_PRINT_LAUNCHER_ENV and PADDLE_2_6.env_dump_var is None


@pytest.mark.parametrize("spec", [PADDLE_2_6, PADDLE_3], ids=["paddle2.6", "paddle3"])
def test_ips_store_is_the_same_with_or_without_paddle_master(spec):
    """Under --ips only Paddle 3.x gives PADDLE_MASTER; both name the first trainer endpoint as rank 0's store."""
    worker = {E.PADDLE_TRAINER_ID: "1", E.PADDLE_TRAINERS_NUM: "2",
              E.PADDLE_TRAINER_ENDPOINTS: "127.0.0.2:17300,127.0.0.3:17300"}
    if spec.master_in_ips_mode:
        worker[E.PADDLE_MASTER] = "127.0.0.2:17300"
    assert E.master_endpoint(worker) == ("127.0.0.2", 17300)
    assert E.torch_worker_env(worker)[E.MASTER_PORT] == "17300"


def test_to_paddle_spells_every_flag_from_the_spec():
    """A launcher that spells everything differently gets everything spelled its way: no spelling in flags.py."""
    fields = [f.name for f in dataclasses.fields(LauncherSpec) if f.name.endswith("_flag")]
    other = dataclasses.replace(PADDLE_2_6, module="other.launch",
                                cpu_env=(("OTHER_BACKEND", "gloo"),), **{f: f"--X{f}" for f in fields})
    master = build_plan(ns("--nnodes", "2", "--node_rank", "1", "--master_addr", "h", "--host", "h2",
                           "--log_dir", "L", "--job_id", "J"), {}, set(), 0)
    argv, env = to_paddle(master, other)
    assert argv[1:3] == ["-m", "other.launch"]
    assert argv[3:argv.index(WORKER_PATH)] == ["--Xnproc_flag", "1", "--Xmaster_flag", "h:29501", "--Xnnodes_flag",
                                                "2", "--Xrank_flag", "1", "--Xhost_flag", "h2", "--Xlog_dir_flag", "L",
                                                "--Xjob_id_flag", "J"]
    assert env == {E.PPMULTI_NODE_RANK: "1", "OTHER_BACKEND": "gloo"}
    ips = build_plan(ns("--ips", "127.0.0.2,127.0.0.3", "--host", "127.0.0.2", "--gpus", "0"), {}, set(), 1)
    argv, env = to_paddle(ips, other)
    assert argv[3:argv.index(WORKER_PATH)] == ["--Xdevices_flag", "0", "--Xips_flag", "127.0.0.2,127.0.0.3",
                                                "--Xhost_flag", "127.0.0.2", "--Xstart_port_flag", "6070"]
    assert env == {E.PPMULTI_NODE_RANK: "0"}


def test_to_paddle_writes_no_launcher_spelling_itself():
    tree = ast.parse((LAUNCH_DIR / "flags.py").read_text())
    func = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "to_paddle")
    body = func.body[1:]                                                      # after its docstring
    literals = [n.value for s in body for n in ast.walk(s) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert literals and not [s for s in literals if s.startswith("--") or "paddle" in s]


def test_no_golden_case_wakes_the_legacy_launcher():
    from tests.test_launch_flags import GOLDEN, paddle_of

    for _, argv, environ, addrs, gpus, _, _ in GOLDEN:
        launcher_argv, _ = paddle_of(argv, environ, addrs, gpus)
        launcher_flags = launcher_argv[3:launcher_argv.index(WORKER_PATH)]
        assert not set(launcher_flags) & set(PADDLE_2_6.legacy_flags), argv
        spelled = {getattr(PADDLE_2_6, f.name) for f in dataclasses.fields(LauncherSpec) if f.name.endswith("_flag")}
        assert {w for w in launcher_flags if w.startswith("--")} <= spelled, argv


# --- a scheduler's variables (cluster_env.py) ----------------------------------------------------------------
SRUN = {E.SLURM_JOB_ID: "41", E.SLURM_STEP_ID: "0", E.SLURM_NNODES: "2", E.SLURM_STEP_NUM_NODES: "2",
        E.SLURM_STEP_NUM_TASKS: "2", E.SLURM_JOB_NODELIST: "gpu[07-08]", E.SLURM_STEP_NODELIST: "gpu[07-08]"}
NODE0 = {**SRUN, E.SLURM_NODEID: "0", E.SLURMD_NODENAME: "gpu07"}
NODE1 = {**SRUN, E.SLURM_NODEID: "1", E.SLURMD_NODENAME: "gpu08"}
BATCH = {E.SLURM_JOB_ID: "41", E.SLURM_NNODES: "2", E.SLURM_NODEID: "0", E.SLURM_JOB_NODELIST: "gpu[07-08]",
         E.SLURMD_NODENAME: "gpu07"}
PYTORCHJOB = {E.MASTER_ADDR: "job-master-0", E.MASTER_PORT: "23456", E.WORLD_SIZE: "3", E.RANK: "2"}
DNS = {"gpu07": "10.1.0.7", "gpu08": "10.1.0.8", "job-master-0": "10.2.0.1", "n1": "10.3.0.1"}


def cluster_plan(argv, environ, gpus=0):
    return build_plan(parse_launch_args([*argv, "t.py"]), environ, set(), gpus, PADDLE_2_6, resolve=DNS.get)


def plan_fields(plan):
    return (plan.nnodes, plan.node_rank, plan.master_addr, plan.master_port, plan.host, plan.job_id,
            plan.nproc_per_node, plan.device)


# id, flags, environment, visible GPUs -> (nnodes, node_rank, master_addr, master_port, host, job_id, nproc, device)
CLUSTER = [
    ("srun_node0", [], NODE0, 0, (2, 0, "10.1.0.7", 29500, "10.1.0.7", "slurm-41-0", 1, "cpu")),
    ("srun_node1", [], NODE1, 0, (2, 1, "10.1.0.7", 29500, "10.1.0.8", "slurm-41-0", 1, "cpu")),
    ("srun_flags_that_agree", ["--nnodes", "2", "--node_rank", "1"], NODE1, 0,
     (2, 1, "10.1.0.7", 29500, "10.1.0.8", "slurm-41-0", 1, "cpu")),
    ("flags_win_master_port_job_host", ["--master_addr", "10.9.0.7", "--master_port", "6000", "--job_id", "j",
                                        "--host", "10.9.0.8"], NODE1, 0,
     (2, 1, "10.9.0.7", 6000, "10.9.0.8", "j", 1, "cpu")),
    ("master_port_variable", [], {**NODE1, E.MASTER_PORT: "29700"}, 0,
     (2, 1, "10.1.0.7", 29700, "10.1.0.8", "slurm-41-0", 1, "cpu")),
    ("master_addr_variable", [], {**NODE1, E.MASTER_ADDR: "n1"}, 0,
     (2, 1, "10.3.0.1", 29500, "10.1.0.8", "slurm-41-0", 1, "cpu")),
    ("sub_step_of_one_node", [], {**NODE0, E.SLURM_NNODES: "1", E.SLURM_STEP_NUM_NODES: "1",
                                  E.SLURM_STEP_NUM_TASKS: "1", E.SLURM_STEP_NODELIST: "gpu07"}, 0,
     (1, 0, None, None, None, "slurm-41-0", 1, "cpu")),
    ("gpus_on_node", [], {**NODE0, E.SLURM_GPUS_ON_NODE: "2", E.CUDA_VISIBLE_DEVICES: "2,3"}, 2,
     (2, 0, "10.1.0.7", 29500, "10.1.0.7", "slurm-41-0", 2, "gpu")),
    ("gpus_flag_wins", ["--gpus", "2"], {**NODE0, E.SLURM_GPUS_ON_NODE: "2", E.CUDA_VISIBLE_DEVICES: "2,3"}, 2,
     (2, 0, "10.1.0.7", 29500, "10.1.0.7", "slurm-41-0", 1, "gpu")),
    ("batch_script_one_node_by_flag", ["--nnodes", "1"], BATCH, 0, (1, 0, None, None, None, None, 1, "cpu")),
    ("batch_of_one_node", [], {**BATCH, E.SLURM_NNODES: "1", E.SLURM_JOB_NODELIST: "gpu07"}, 0,
     (1, 0, None, None, None, None, 1, "cpu")),
    ("standalone_ignores_slurm", ["--standalone"], NODE1, 0, (1, 0, None, None, None, None, 1, "cpu")),
    # the job's name from the master pod's (JOB-master-0)
    ("pytorchjob_worker", [], PYTORCHJOB, 0, (3, 2, "10.2.0.1", 23456, None, "job", 1, "cpu")),
    ("pytorchjob_master", [], {**PYTORCHJOB, E.RANK: "0"}, 0, (3, 0, "10.2.0.1", 23456, "10.2.0.1", "job", 1, "cpu")),
    ("torchrun_worker_variables_are_not_nodes", [], {**PYTORCHJOB, E.LOCAL_RANK: "0"}, 0,
     (1, 0, None, None, None, None, 1, "cpu")),
    ("paddle_worker_ignores_slurm", [], {**NODE1, E.PADDLE_TRAINER_ID: "1", E.PADDLE_TRAINERS_NUM: "2"}, 0,
     (1, 0, None, None, None, None, 1, "cpu")),
]


@pytest.mark.parametrize("argv, environ, gpus, want", [c[1:] for c in CLUSTER], ids=[c[0] for c in CLUSTER])
def test_cluster_variables_to_plan(argv, environ, gpus, want):
    assert plan_fields(cluster_plan(argv, environ, gpus)) == want


CLUSTER_BAD = [
    ("nnodes_conflict", ["--nnodes", "3"], NODE1,
     "--nnodes 3 disagrees with SLURM_STEP_NUM_NODES=2 set by the scheduler; drop --nnodes"),
    ("node_rank_conflict", ["--node_rank", "0"], NODE1,
     "--node_rank 0 disagrees with SLURM_NODEID=1 set by the scheduler; drop --node_rank"),
    ("pytorchjob_conflict", ["--nnodes", "2"], PYTORCHJOB,
     "--nnodes 2 disagrees with WORLD_SIZE=3 set by the scheduler; drop --nnodes"),
    ("batch_script_of_two_nodes", [], BATCH, "srun --ntasks-per-node=1 ppmulti launch"),
    ("salloc_shell_of_two_nodes", [], {E.SLURM_JOB_ID: "9", E.SLURM_NNODES: "2", E.SLURM_JOB_NODELIST: "gpu[07-08]"},
     "salloc shell"),
    ("tasks_per_rank", [], {**NODE0, E.SLURM_STEP_NUM_TASKS: "4"},
     "srun started 4 tasks on 2 nodes; ppmulti launch starts the ranks itself and wants one task per node"),
    ("master_does_not_resolve", [], {**NODE0, E.SLURM_STEP_NODELIST: "nowhere[1-2]"},
     "nowhere1 (node 0, from SLURM_STEP_NODELIST) does not resolve to an IPv4 address here; pass --master_addr"),
    ("bad_master_port_variable", [], {**NODE0, E.MASTER_PORT: "x"},
     "MASTER_PORT=x in the environment is not a TCP port (1..65535); fix or unset it, or pass --master_port"),
    ("bad_count_variable", [], {**NODE0, E.SLURM_STEP_NUM_NODES: "two"},
     "SLURM_STEP_NUM_NODES=two in the environment is not a whole number"),
]


@pytest.mark.parametrize("argv, environ, needle", [c[1:] for c in CLUSTER_BAD], ids=[c[0] for c in CLUSTER_BAD])
def test_cluster_conflicts_are_one_line(argv, environ, needle):
    with pytest.raises(UserError) as info:
        cluster_plan(argv, environ)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_cluster_notes_say_where_each_value_came_from():
    notes = cluster_plan([], NODE1).notes
    assert notes[:5] == ("--nnodes 2 from SLURM_STEP_NUM_NODES", "--node_rank 1 from SLURM_NODEID",
                         "--master_addr 10.1.0.7: gpu07 from SLURM_STEP_NODELIST",
                         "--host 10.1.0.8: this node's address",
                         "--job_id slurm-41-0 from SLURM_JOB_ID")
    argv, _ = to_paddle(cluster_plan([], NODE1), PADDLE_2_6)
    assert argv[3:argv.index(WORKER_PATH)] == ["--nproc_per_node", "1", "--master", "10.1.0.7:29501", "--nnodes", "2",
                                                "--rank", "1", "--host", "10.1.0.8", "--job_id", "slurm-41-0"]


def test_rank_watch_survives_its_launch_directory_going(tmp_path):
    """A launch directory removed from outside while the ranks run (a cleanup of /tmp): the watch reads no marks
    instead of ending the launch with a traceback."""
    import os
    import shutil

    from ppmulti.procs.launch.runner import _RankWatch

    directory = tmp_path / "ppmulti-launch-x"
    directory.mkdir()
    (directory / "rank0.started").write_text(str(os.getpid()))
    watch = _RankWatch(str(directory))
    assert watch.started() == {0: os.getpid()}
    shutil.rmtree(directory)
    assert watch.started() == {} and watch.failed() == {}
    watch.poll()
    watch.reset()
    assert watch.first_gone is None


def test_rank_watch_names_the_killed_rank_before_the_peer_it_took_down(tmp_path):
    """Rank 1 is killed by SIGKILL (no mark) and rank 0's allreduce fails for want of it (a Python error on
    Paddle 3, an abort on 2.6); on a loaded machine both are gone by the next poll. The launch names rank 1, not
    rank 0 (the lower rank but a victim); a rank with an error of its own is still named before a victim."""
    import subprocess
    import sys

    from ppmulti.procs.launch.runner import _RankWatch

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    directory = tmp_path / "ppmulti-launch-x"
    directory.mkdir()
    for rank in (0, 1, 2):
        (directory / f"rank{rank}.started").write_text(str(dead.pid))
    (directory / "rank0.failed").write_text("OSError: [enforce fail at gloo/transport/tcp/pair.cc:598] "
                                            "Connection reset by peer")
    (directory / "rank2.stopped").write_text("stopped by SIGTERM")
    watch = _RankWatch(str(directory))
    watch.poll()
    assert watch.first_gone == 1
    assert watch.cause().startswith("rank 1 died without a Python error")

    # Paddle 2.6: gloo's IoException aborts rank 0 (no Python error, faulthandler's record instead)
    watch.reset()
    for rank in (0, 1):
        (directory / f"rank{rank}.started").write_text(str(dead.pid))
    (directory / "rank0.fatal").write_text("Fatal Python error: Aborted\n\nThread 0x1 (most recent call first):\n")
    (directory / "rank1.fatal").write_text("")   # faulthandler's file, empty: SIGKILL writes nothing
    watch.poll()
    assert watch.first_gone == 1
    assert watch.cause().startswith("rank 1 died without a Python error")

    watch.reset()
    for rank in (0, 1):
        (directory / f"rank{rank}.started").write_text(str(dead.pid))
    (directory / "rank0.failed").write_text("RuntimeError: peer went away (gloo)")
    (directory / "rank1.failed").write_text("ValueError: a bad box")
    watch.poll()
    assert watch.cause() == "rank 1 failed: ValueError: a bad box"
