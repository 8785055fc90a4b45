"""ppmulti launch's pure flag mapping: golden torchrun/fleetrun cases -> Paddle 2.6 launcher argv + env, and errors."""

from __future__ import annotations

import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from ppmulti.common import envvars as E
from ppmulti.common.compat import launcher_spec
from ppmulti.common.errors import UserError
from ppmulti.procs.launch.flags import (UNSUPPORTED, WORKER_PATH, build_plan, describe, launch_env, parse_launch_args,
                                  to_paddle)
from ppmulti.procs.launch.plan import LaunchPlan

REPO = Path(__file__).resolve().parents[1]
LAUNCH = [sys.executable, "-m", "paddle.distributed.launch"]
CPU = {E.PADDLE_DISTRI_BACKEND: "gloo", E.PPMULTI_NODE_RANK: "0"}


def plan_of(argv, environ=None, local_addrs=(), gpus=0, spec=None) -> LaunchPlan:
    return build_plan(parse_launch_args(argv), dict(environ or {}), set(local_addrs), gpus, spec)


def paddle_of(argv, environ=None, local_addrs=(), gpus=0, spec=None):
    return to_paddle(plan_of(argv, environ, local_addrs, gpus, spec), spec)


# The Paddle versions whose launchers ppmulti drives; each golden case runs against every one of them.
PADDLE_VERSIONS = [(2, 6, 2), (3, 3, 1)]


# id, ppmulti launch argv, environ, local addresses, visible GPUs -> Paddle flags (before the worker), env added
GOLDEN = [
    ("torchrun_single_node", ["--nproc_per_node", "2", "train.py", "--lr", "0.1"], {}, (), 0,
     ["--nproc_per_node", "2"], CPU),
    ("torchrun_dashed_equals", ["--nproc-per-node=2", "train.py", "--lr", "0.1"], {}, (), 0,
     ["--nproc_per_node", "2"], CPU),
    ("default_one_cpu_rank", ["train.py"], {}, (), 0, ["--nproc_per_node", "1"], CPU),
    ("torchrun_multi_node_rank1",
     ["--nnodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1", "--master_port", "29500", "train.py"],
     {}, ("10.0.0.2",), 0,
     ["--nproc_per_node", "1", "--master", "10.0.0.1:29501", "--nnodes", "2", "--rank", "1"],
     {**CPU, E.PPMULTI_NODE_RANK: "1"}),
    ("torchrun_multi_node_dashed_rank0",
     ["--nnodes=2", "--node-rank=0", "--master-addr=10.0.0.1", "--master-port=29400", "--nproc-per-node", "2",
      "train.py"], {}, ("10.0.0.1",), 0,
     ["--nproc_per_node", "2", "--master", "10.0.0.1:29401", "--nnodes", "2", "--rank", "0"], CPU),
    ("torchrun_default_master_port",
     ["--nnodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1", "train.py"], {}, (), 0,
     ["--nproc_per_node", "1", "--master", "10.0.0.1:29501", "--nnodes", "2", "--rank", "1"],
     {**CPU, E.PPMULTI_NODE_RANK: "1"}),
    ("paddle_master_spelling", ["--master", "10.0.0.1:8090", "--nnodes", "2", "--node_rank", "1", "train.py"],
     {}, (), 0, ["--nproc_per_node", "1", "--master", "10.0.0.1:8091", "--nnodes", "2", "--rank", "1"],
     {**CPU, E.PPMULTI_NODE_RANK: "1"}),
    ("fleetrun_ips_flags_start_port", ["--ips", "10.0.0.1,10.0.0.2", "train.py"], {E.FLAGS_START_PORT: "17000"},
     ("10.0.0.2", "127.0.0.1"), 0,
     ["--nproc_per_node", "1", "--ips", "10.0.0.1,10.0.0.2", "--host", "10.0.0.2", "--start_port", "17000"],
     {**CPU, E.PPMULTI_NODE_RANK: "1"}),
    ("explicit_start_port_beats_env", ["--ips", "10.0.0.1,10.0.0.2", "--start_port", "18000", "train.py"],
     {E.FLAGS_START_PORT: "17000", E.PADDLE_START_PORT: "16000"}, ("10.0.0.1",), 0,
     ["--nproc_per_node", "1", "--ips", "10.0.0.1,10.0.0.2", "--host", "10.0.0.1", "--start_port", "18000"], CPU),
    ("paddle_start_port_env", ["--ips", "10.0.0.1,10.0.0.2", "train.py"], {E.PADDLE_START_PORT: "16000"},
     ("10.0.0.1",), 0,
     ["--nproc_per_node", "1", "--ips", "10.0.0.1,10.0.0.2", "--host", "10.0.0.1", "--start_port", "16000"], CPU),
    ("ips_loopback_nodes_with_host", ["--ips", "127.0.0.2,127.0.0.3", "--host", "127.0.0.3", "train.py"], {},
     ("127.0.0.1",), 0,
     ["--nproc_per_node", "1", "--ips", "127.0.0.2,127.0.0.3", "--host", "127.0.0.3", "--start_port", "6070"],
     {**CPU, E.PPMULTI_NODE_RANK: "1"}),
    ("ips_host_from_pod_ip", ["--ips", "10.0.0.1,10.0.0.2", "train.py"], {E.POD_IP: "10.0.0.2"}, (), 0,
     ["--nproc_per_node", "1", "--ips", "10.0.0.1,10.0.0.2", "--host", "10.0.0.2", "--start_port", "6070"],
     {**CPU, E.PPMULTI_NODE_RANK: "1"}),
    ("ips_single_localhost", ["--ips", "127.0.0.1", "--nproc_per_node", "2", "train.py"], {}, (), 0,
     ["--nproc_per_node", "2", "--ips", "127.0.0.1", "--host", "127.0.0.1", "--start_port", "6070"], CPU),
    ("selected_gpus_new_launcher", ["--selected_gpus", "0,1,2,3", "train.py"], {}, (), 4,
     ["--devices", "0,1,2,3"], {E.PPMULTI_NODE_RANK: "0"}),
    ("selected_gpu_paddledet_docs_spelling", ["--selected_gpu=0,1", "train.py"], {}, (), 4,
     ["--devices", "0,1"], {E.PPMULTI_NODE_RANK: "0"}),
    ("fleetrun_gpus", ["--gpus", "0,1", "train.py"], {}, (), 2, ["--devices", "0,1"], {E.PPMULTI_NODE_RANK: "0"}),
    ("paddle_devices", ["--devices", "1,3", "--nproc_per_node", "2", "train.py"], {}, (), 4,
     ["--devices", "1,3"], {E.PPMULTI_NODE_RANK: "0"}),
    ("nproc_picks_first_gpus", ["--nproc_per_node", "2", "train.py"], {}, (), 4,
     ["--devices", "0,1"], {E.PPMULTI_NODE_RANK: "0"}),
    ("nproc_auto_all_gpus", ["--nproc_per_node", "auto", "train.py"], {}, (), 4,
     ["--devices", "0,1,2,3"], {E.PPMULTI_NODE_RANK: "0"}),
    ("gpus_as_listed_in_cuda_visible_devices", ["--gpus", "5,7", "train.py"], {E.CUDA_VISIBLE_DEVICES: "5,7"}, (),
     2, ["--devices", "5,7"], {E.PPMULTI_NODE_RANK: "0"}),
    ("device_cpu_on_gpu_machine", ["--device", "cpu", "--nproc_per_node", "2", "train.py"], {}, (), 4,
     ["--nproc_per_node", "2"], CPU),
    ("gpu_count_unknown_with_ids", ["--gpus", "0,1", "train.py"], {}, (), None,
     ["--devices", "0,1"], {E.PPMULTI_NODE_RANK: "0"}),
    ("max_restarts_log_dir_job_id",
     ["--max_restarts", "3", "--log-dir", "out/log", "--job-id", "yolo1", "--nproc_per_node", "2", "train.py"],
     {}, (), 0, ["--nproc_per_node", "2", "--log_dir", "out/log", "--job_id", "yolo1"], CPU),
    ("standalone", ["--standalone", "--nproc_per_node", "2", "train.py"], {}, (), 0, ["--nproc_per_node", "2"], CPU),
    ("master_port_single_node_is_not_passed", ["--nproc_per_node", "2", "--master_port", "29600", "train.py"],
     {}, (), 0, ["--nproc_per_node", "2"], CPU),
]


@pytest.mark.parametrize("version", PADDLE_VERSIONS, ids=lambda v: "paddle" + ".".join(map(str, v)))
@pytest.mark.parametrize("argv, environ, addrs, gpus, flags, env", [g[1:] for g in GOLDEN], ids=[g[0] for g in GOLDEN])
def test_golden(argv, environ, addrs, gpus, flags, env, version):
    """Paddle 3.3.1's launcher takes 2.6.2's argv unchanged (every flag, default and legacy fallback kept)."""
    paddle_argv, paddle_env = paddle_of(argv, environ, addrs, gpus, launcher_spec(version))
    script_at = argv.index("train.py")
    assert paddle_argv == [*LAUNCH, *flags, WORKER_PATH, "train.py", *argv[script_at + 1:]]
    assert paddle_env == env


# id, argv, environ, local addresses, visible GPUs -> words the one-line error must contain
ERRORS = [
    ("nproc_vs_gpus", ["--nproc_per_node", "4", "--gpus", "0,1", "t.py"], {}, (), 4,
     ["--nproc_per_node 4", "--gpus 0,1"]),
    ("ips_with_master_addr", ["--ips", "10.0.0.1,10.0.0.2", "--master_addr", "10.0.0.1", "t.py"], {},
     ("10.0.0.1",), 0, ["--ips", "--master_addr"]),
    ("node_rank_too_big", ["--nnodes", "2", "--node_rank", "2", "--master_addr", "10.0.0.1", "t.py"], {}, (), 0,
     ["--node_rank 2", "--nnodes 2", "0 .. 1"]),
    ("nnodes_vs_ips", ["--nnodes", "2", "--ips", "10.0.0.1,10.0.0.2,10.0.0.3", "t.py"], {}, ("10.0.0.1",), 0,
     ["--nnodes 2", "3 nodes"]),
    ("master_port_not_a_number", ["--nnodes", "2", "--node_rank", "1", "--master_addr", "h", "--master_port", "x1",
                                  "t.py"], {}, (), 0, ["--master_port x1", "1..65535"]),
    ("master_port_out_of_range", ["--master_port", "70000", "t.py"], {}, (), 0, ["--master_port 70000", "1..65535"]),
    ("start_port_env_not_a_number", ["--ips", "10.0.0.1", "t.py"], {E.FLAGS_START_PORT: "abc"}, ("10.0.0.1",), 0,
     ["FLAGS_START_PORT=abc", "--start_port"]),
    ("this_node_not_in_ips", ["--ips", "10.0.0.1,10.0.0.2", "t.py"], {}, ("192.168.1.5", "127.0.0.1"), 0,
     ["10.0.0.1,10.0.0.2", "--host", "192.168.1.5"]),
    ("host_not_in_ips", ["--ips", "10.0.0.1,10.0.0.2", "--host", "10.0.0.9", "t.py"], {}, (), 0,
     ["--host 10.0.0.9", "10.0.0.1,10.0.0.2"]),
    ("pod_ip_not_in_ips", ["--ips", "10.0.0.1,10.0.0.2", "t.py"], {E.POD_IP: "10.0.0.9"}, (), 0,
     ["POD_IP 10.0.0.9"]),
    ("localhost_in_multi_node_ips", ["--ips", "127.0.0.1,10.0.0.2", "t.py"], {}, ("10.0.0.2",), 0,
     ["127.0.0.1", "127.0.0.2"]),
    ("several_local_ips_need_host", ["--ips", "127.0.0.2,127.0.0.3", "t.py"], {}, (), 0,
     ["several", "--host 127.0.0.2"]),
    ("ips_listed_twice", ["--ips", "10.0.0.1,10.0.0.1", "--host", "10.0.0.1", "t.py"], {}, (), 0, ["twice"]),
    ("ips_vs_node_rank", ["--ips", "10.0.0.1,10.0.0.2", "--host", "10.0.0.2", "--node_rank", "0", "t.py"], {}, (),
     0, ["--node_rank 0", "--host 10.0.0.2"]),
    ("nnodes_needs_node_rank", ["--nnodes", "2", "--master_addr", "10.0.0.1", "t.py"], {}, (), 0,
     ["--node_rank"]),
    ("nnodes_needs_master_addr", ["--nnodes", "2", "--node_rank", "1", "t.py"], {}, (), 0, ["--master_addr"]),
    ("elastic_nnodes_range", ["--nnodes", "1:4", "t.py"], {}, (), 0, ["--nnodes 1:4", "etcd"]),
    ("node0_not_at_master_addr", ["--nnodes", "2", "--node_rank", "0", "--master_addr", "10.0.0.7", "t.py"], {},
     ("10.0.0.1", "127.0.0.1"), 0, ["--master_addr 10.0.0.7", "--node_rank 0"]),
    ("gpus_and_devices_disagree", ["--gpus", "0,1", "--devices", "0,2", "t.py"], {}, (), 4,
     ["--gpus 0,1", "--devices 0,2"]),
    ("gpu_ids_malformed", ["--gpus", "0,a", "t.py"], {}, (), 4, ["--gpus", "0,1,2,3"]),
    ("gpu_not_visible", ["--gpus", "0", "t.py"], {E.CUDA_VISIBLE_DEVICES: "2,3"}, (), 2,
     ["GPU 0", "CUDA_VISIBLE_DEVICES=2,3"]),
    ("too_many_gpu_ranks", ["--device", "gpu", "--nproc_per_node", "4", "t.py"], {}, (), 2,
     ["--nproc_per_node 4", "2 GPU"]),
    ("device_gpu_without_gpus", ["--device", "gpu", "t.py"], {}, (), 0, ["no GPU"]),
    ("device_cpu_with_gpus", ["--device", "cpu", "--gpus", "0", "t.py"], {}, (), 1, ["--device cpu", "--gpus 0"]),
    ("nproc_auto_on_cpu", ["--nproc_per_node", "auto", "t.py"], {}, (), 0, ["--nproc_per_node auto", "number"]),
    ("nproc_zero", ["--nproc_per_node", "0", "t.py"], {}, (), 0, ["--nproc_per_node 0"]),
    ("nproc_zero_gpu", ["--nproc_per_node", "0", "t.py"], {}, (), 2, ["--nproc_per_node 0"]),
    ("nproc_word", ["--nproc_per_node", "two", "t.py"], {}, (), 0, ["--nproc_per_node 'two'"]),
    ("standalone_with_nnodes", ["--standalone", "--nnodes", "2", "t.py"], {}, (), 0, ["--standalone"]),
    ("master_and_master_addr", ["--master", "h:1", "--master_addr", "h", "t.py"], {}, (), 0,
     ["--master h:1", "--master_addr"]),
    ("rdzv_timeout_negative", ["--rdzv-timeout", "-5", "t.py"], {}, (), 0, ["--rdzv-timeout -5"]),
    ("rdzv_timeout_word", ["--rdzv_timeout", "soon", "t.py"], {}, (), 0, ["--rdzv-timeout 'soon'"]),
    ("no_script", ["--nproc_per_node", "2"], {}, (), 0, ["no training script"]),
    ("not_a_python_script", ["--nproc_per_node", "2", "train.sh"], {}, (), 0, ["train.sh", ".py"]),
    ("max_restarts_negative", ["--max_restarts", "-1", "t.py"], {}, (), 0, ["--max_restarts -1"]),
]


@pytest.mark.parametrize("argv, environ, addrs, gpus, needles", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_conflicts_are_one_line_user_errors(argv, environ, addrs, gpus, needles):
    with pytest.raises(UserError) as info:
        paddle_of(argv, environ, addrs, gpus)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


UNSUPPORTED_NAMES = [name for names, _, _ in UNSUPPORTED for name in names]


@pytest.mark.parametrize("name", UNSUPPORTED_NAMES)
def test_unsupported_flags_fail_by_name(name):
    takes_value = next(t for names, t, _ in UNSUPPORTED if name in names)
    argv = [name, "x"] if takes_value else [name]
    with pytest.raises(UserError, match=f"^{name} is a launcher flag ppmulti launch cannot honour: "):
        parse_launch_args([*argv, "train.py"])


def test_unknown_flag_names_itself_and_the_fix():
    with pytest.raises(UserError, match="unknown launch flag --nprocs .*after its path"):
        parse_launch_args(["--nprocs", "2", "train.py"])


def test_missing_value_gives_an_example():
    with pytest.raises(UserError, match="--master_port needs a value, e.g. --master_port 29500"):
        parse_launch_args(["--master_port"])


def test_script_args_are_untouched_even_when_they_look_like_launch_flags():
    ns = parse_launch_args(["--nproc_per_node", "2", "train.py", "--nproc_per_node", "3", "--tee", "-m", "--",
                            "--x=1"])
    assert ns.nproc_per_node == "2" and ns.script == "train.py"
    assert ns.script_args == ["--nproc_per_node", "3", "--tee", "-m", "--", "--x=1"]
    argv, _ = to_paddle(build_plan(ns, {}, set(), 0))
    assert argv[-7:] == ["train.py", "--nproc_per_node", "3", "--tee", "-m", "--", "--x=1"]


def test_double_dash_before_the_script():
    ns = parse_launch_args(["--nproc_per_node", "2", "--", "train.py", "--", "a"])
    assert ns.script == "train.py" and ns.script_args == ["--", "a"]


def test_selected_gpus_never_reaches_paddle_as_a_legacy_flag():
    argv, _ = paddle_of(["--selected_gpus", "0,1,2,3", "train.py"], gpus=4)
    launcher_flags = argv[: argv.index(WORKER_PATH)]
    assert "--selected_gpus" not in launcher_flags and "--legacy" not in launcher_flags
    assert launcher_flags[3:] == ["--devices", "0,1,2,3"]


def test_plan_is_frozen_and_checks_itself():
    plan = plan_of(["--nproc_per_node", "2", "train.py"])
    with pytest.raises(Exception):
        plan.nproc_per_node = 3  # type: ignore[misc]
    with pytest.raises(UserError, match="--node_rank 3"):
        LaunchPlan(script="t.py", nnodes=2, node_rank=3, master_addr="h", master_port=1234)
    with pytest.raises(UserError, match="--nproc_per_node 2 disagrees with --gpus 0"):
        LaunchPlan(script="t.py", nproc_per_node=2, device="gpu", devices=("0",))
    with pytest.raises(UserError, match="--host 10.0.0.9"):
        LaunchPlan(script="t.py", nnodes=2, ips=("10.0.0.1", "10.0.0.2"), host="10.0.0.9")


def test_plan_rendezvous_endpoints():
    assert plan_of(["t.py"]).rdzv_endpoint is None
    assert plan_of(["--nnodes", "2", "--node_rank", "1", "--master_addr", "h", "--master_port", "2000",
                    "t.py"]).rdzv_endpoint == ("h", 2000)
    ips = plan_of(["--ips", "10.0.0.1,10.0.0.2", "--start_port", "17000", "t.py"], local_addrs={"10.0.0.2"})
    assert ips.rdzv_endpoint == ("10.0.0.1", 16999) and ips.node_rank == 1 and ips.world_size == 2


# --- environment -----------------------------------------------------------------------------------------
INHERITED = {
    "PATH": "/usr/bin", "PADDLE_PG_TIMEOUT": "60000", E.FLAGS_START_PORT: "17000",
    # what a worker of an earlier launch carries
    E.PADDLE_TRAINER_ID: "1", E.PADDLE_TRAINERS_NUM: "2", E.PADDLE_TRAINER_ENDPOINTS: "a:1,b:2",
    E.PADDLE_CURRENT_ENDPOINT: "b:2", E.PADDLE_MASTER: "a:3", E.PADDLE_NNODES: "1", E.PADDLE_LOCAL_RANK: "1",
    E.PADDLE_GLOBAL_RANK: "1", E.PADDLE_LOCAL_SIZE: "2", E.FLAGS_SELECTED_GPUS: "1", E.POD_IP: "10.0.0.2",
    E.RANK: "1", E.WORLD_SIZE: "2", E.MASTER_ADDR: "a", E.MASTER_PORT: "3", "PADDLE_SOMETHING_NEW": "x",
    # what Paddle 3.x's launcher adds to its workers; FLAGS_FIXED_PORT is the user's knob, not launch state
    E.PADDLE_AUTO_CLUSTER: "0", E.HTTP_PROXY_ORIGINAL: "http://proxy:3128", E.HTTPS_PROXY_ORIGINAL: "http://proxy:3128",
    E.FLAGS_FIXED_PORT: "36000",
}


def test_clean_launcher_env_drops_launch_state_and_keeps_user_settings():
    clean = E.clean_launcher_env(INHERITED)
    assert clean == {"PATH": "/usr/bin", "PADDLE_PG_TIMEOUT": "60000", E.FLAGS_START_PORT: "17000",
                     E.FLAGS_FIXED_PORT: "36000"}


@pytest.mark.parametrize("version", PADDLE_VERSIONS, ids=lambda v: "paddle" + ".".join(map(str, v)))
def test_every_variable_a_launcher_adds_to_its_workers_is_launch_state(version):
    """A launch started from inside a worker must not inherit what either launcher gave that worker."""
    spec = launcher_spec(version)
    assert set(spec.extra_worker_env) <= E._LAUNCH_STATE
    assert not E.clean_launcher_env({name: "x" for name in spec.extra_worker_env})
    if spec.fixed_port_var:
        assert E.clean_launcher_env({spec.fixed_port_var: "36000"}) == {spec.fixed_port_var: "36000"}


def test_inherited_trainer_id_is_cleared_for_the_launcher():
    plan = plan_of(["--nproc_per_node", "2", "train.py"], INHERITED)
    child, changed, removed = launch_env(plan, INHERITED)
    assert E.PADDLE_TRAINER_ID not in child and E.PADDLE_TRAINER_ENDPOINTS not in child
    assert E.PADDLE_TRAINER_ID in removed and E.POD_IP in removed
    assert child[E.PADDLE_DISTRI_BACKEND] == "gloo" and child["PADDLE_PG_TIMEOUT"] == "60000"
    assert changed == CPU


def test_dry_run_output_is_the_command_then_key_value_lines():
    environ = {"PATH": "/usr/bin", E.PADDLE_TRAINER_ID: "3", E.FLAGS_START_PORT: "17000"}
    plan = plan_of(["--ips", "127.0.0.2,127.0.0.3", "--host", "127.0.0.3", "train.py", "--epochs", "2"], environ)
    assert describe(plan, environ).splitlines() == [
        f"{sys.executable} -m paddle.distributed.launch --nproc_per_node 1 --ips 127.0.0.2,127.0.0.3 "
        f"--host 127.0.0.3 --start_port 17000 {WORKER_PATH} train.py --epochs 2",
        "PADDLE_DISTRI_BACKEND=gloo",
        "PPMULTI_NODE_RANK=1",
        "unset PADDLE_TRAINER_ID",
        f"# --start_port 17000 from FLAGS_START_PORT ({launcher_spec().name} ignores that variable)",
        "# rendezvous secret: none given (PPMULTI_RDZV_TOKEN or --rdzv-token-file): derived from the job id, "
        "which keeps out other runs but not a stranger who knows it",
    ]


def test_worker_info_and_torch_variables():
    assert E.worker_info({}) == E.WorkerInfo(0, 1, 0, 1, 0, 1)
    assert not E.in_paddle_worker({})
    worker = {E.PADDLE_TRAINER_ID: "3", E.PADDLE_TRAINERS_NUM: "4", E.PADDLE_LOCAL_RANK: "1",
              E.PADDLE_LOCAL_SIZE: "2", E.PADDLE_NNODES: "2", E.PADDLE_MASTER: "10.0.0.1:40000",
              E.PADDLE_TRAINER_ENDPOINTS: "10.0.0.1:1,10.0.0.1:2,10.0.0.2:1,10.0.0.2:2"}
    assert E.in_paddle_worker(worker)
    assert E.worker_info(worker) == E.WorkerInfo(rank=3, world_size=4, local_rank=1, local_size=2, node_rank=1,
                                                 nnodes=2)
    assert E.torch_worker_env(worker) == {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                                          "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "40000"}
    # --ips mode has no PADDLE_MASTER: rank 0's store is the first endpoint
    del worker[E.PADDLE_MASTER]
    assert E.master_endpoint(worker) == ("10.0.0.1", 1)


# --- architecture ----------------------------------------------------------------------------------------
def test_launcher_side_never_imports_paddle():
    code = ("import sys, ppmulti.procs.launch.flags, ppmulti.procs.launch.plan, ppmulti.procs.launch.runner, "
            "ppmulti.procs.launch.command, ppmulti.rank.worker, ppmulti.common.envvars; print('paddle' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def _string_literals(path: Path):
    with path.open("rb") as fh:
        for tok in tokenize.tokenize(fh.readline):
            if tok.type == tokenize.STRING:
                yield tok.start[0], tok.string


def test_paddle_variable_names_live_only_in_envvars_py():
    offenders = []
    for folder in ("ppmulti", "tools"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path == REPO / "ppmulti" / "common" / "envvars.py":
                continue
            for line, literal in _string_literals(path):
                body = literal.lstrip("rbfuRBFU").lstrip("'\"")
                if body.startswith("PADDLE_"):
                    offenders.append(f"{path.relative_to(REPO)}:{line}: {literal[:60]}")
    assert not offenders, "PADDLE_ names belong in ppmulti/common/envvars.py:\n" + "\n".join(offenders)


def _cli(*args, env=None):
    import os

    full = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "FLAGS_START"))}
    full["PYTHONPATH"] = str(REPO)
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "ppmulti.cli", "launch", *args], capture_output=True, text=True,
                          cwd=REPO, env=full, timeout=60)


def test_cli_dry_run_keeps_script_args_and_clears_inherited_rank():
    proc = _cli("--nproc-per-node", "2", "--dry-run", "train.py", "--lr", "0.1", "--", "--x",
                env={E.PADDLE_TRAINER_ID: "5"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].endswith(f"-m paddle.distributed.launch --nproc_per_node 2 {WORKER_PATH} train.py --lr 0.1 -- --x")
    assert "PADDLE_DISTRI_BACKEND=gloo" in lines and "unset PADDLE_TRAINER_ID" in lines


def test_cli_dry_run_drives_the_installed_paddles_launcher():
    """``ppmulti launch`` picks the LauncherSpec of the Paddle installed beside it (read from package metadata)."""
    from ppmulti.common.compat import installed_version

    proc = _cli("--ips", "127.0.0.2,127.0.0.3", "--host", "127.0.0.3", "--dry-run", "train.py",
                env={E.FLAGS_START_PORT: "17000"})
    assert proc.returncode == 0, proc.stderr
    want = "Paddle 3.x's launcher" if (installed_version() or ()) >= (3,) else "Paddle 2.6's launcher"
    assert f"# --start_port 17000 from FLAGS_START_PORT ({want} ignores that variable)" in proc.stdout.splitlines()


def test_cli_bad_flag_is_one_line_and_exit_2():
    proc = _cli("--rdzv_backend", "c10d", "train.py")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: --rdzv-backend c10d: ppmulti runs its own rendezvous on --master_addr:--master_port; drop it, "
        "or use --rdzv-backend etcd for --nnodes MIN:MAX"]


def test_cli_help_lists_both_spellings_with_examples():
    proc = _cli("--help")
    assert proc.returncode == 0
    # Python 3.13's argparse names the metavar once, after the last spelling; earlier ones after each spelling
    both = ("--nproc_per_node, --nproc-per-node N" if sys.version_info >= (3, 13)
            else "--nproc_per_node N, --nproc-per-node N")
    for needle in (both, "--selected_gpus", "e.g. 0,1,2,3", "--rdzv-timeout", "FLAGS_START_PORT"):
        assert needle in proc.stdout


@pytest.mark.parametrize("argv, spec, value, note", [
    (["--master", "127.0.0.2:29500", "--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "2", "t.py"],
     "3", "36000", "worker ports 36001..36002 (FLAGS_FIXED_PORT + node rank + local rank: nodes that share a host "
                   "overlap)"),
    (["--master", "127.0.0.2:29500", "--nnodes", "2", "--node_rank", "0", "t.py"], "2.6", "36000",
     "FLAGS_FIXED_PORT is read by Paddle 3.x's launcher only; {name} picks free worker ports"),
    (["--nproc_per_node", "2", "t.py"], "3", "36000", "FLAGS_FIXED_PORT applies to --master launches only; this one "
                                                      "ignores it"),
    (["--master", "127.0.0.2:29500", "--nnodes", "2", "--node_rank", "0", "t.py"], "3", "x",
     "FLAGS_FIXED_PORT='x' is not a port number; {name} will fail on it"),
])
def test_fixed_port_note_per_paddle(argv, spec, value, note):
    """Paddle 3's FLAGS_FIXED_PORT is the user's: passed through, and --dry-run says what it does on this Paddle."""
    from ppmulti.common.compat import PADDLE_2_6, PADDLE_3
    from ppmulti.procs.launch.flags import _fixed_port_note

    spec = {"2.6": PADDLE_2_6, "3": PADDLE_3}[spec]
    plan = plan_of(argv, {})
    assert _fixed_port_note(plan, {E.FLAGS_FIXED_PORT: value}, spec) == note.format(name=spec.name)
    assert _fixed_port_note(plan, {}, spec) is None
