"""Every flag of Paddle's launchers, read from the installed Paddle's own parsers, is either accepted by
``ppmulti launch`` with its meaning or refused by name with the reason.

The parsers are the ones ``python -m paddle.distributed.launch`` builds (context/args_envs.py ``parse_args``) and
the legacy ``fleetrun`` (fleet/launch.py ``_parse_args``); they are built fresh each call and parsed at once, so the
test stops them at ``parse_known_args`` and reads their actions. The legacy launcher adds ``--gpus`` /
``--selected_gpus`` and ``--xpus`` / ``--selected_xpus`` only on CUDA / XPU builds, so the flag names in its source
are read too. Run on Paddle 3.3.1 (the default stack) and 2.6.2:
``PYTHONPATH=. /path/to/stack26/bin/python -m pytest tests/test_paddle_flags.py``.
"""

from __future__ import annotations

import argparse
import inspect
import re

import pytest

from ppmulti.common.errors import UserError
from ppmulti.procs.launch.flags import build_plan, parse_launch_args, split_argv, to_paddle

paddle = pytest.importorskip("paddle")

# Paddle's flag -> the ppmulti launch flag (its dest) that means the same; None: refused by name
MEANING: dict[str, str | None] = {
    # paddle.distributed.launch (2.6 and 3.3)
    "--master": "master", "--rank": "node_rank", "--nnodes": "nnodes", "--nproc_per_node": "nproc_per_node",
    "--log_dir": "log_dir", "--job_id": "job_id", "--devices": "devices", "--gpus": "gpus", "--host": "host",
    "--ips": "ips", "--start_port": "start_port", "--max_restart": "max_restarts", "--run_mode": "run_mode",
    "--log_level": "log_level", "--log_overwrite": "log_overwrite", "--enable_gpu_log": "enable_gpu_log",
    "--legacy": None, "--sort_ip": None, "--npus": None, "--xpus": None, "--auto_parallel_config": None,
    "--auto_cluster_config": None, "--auto_tuner_json": None, "--servers": None, "--trainers": None,
    "--trainer_num": None, "--server_num": None, "--gloo_port": None, "--with_gloo": None,
    "--elastic_level": "elastic_level", "--elastic_timeout": "elastic_timeout",
    # the legacy fleet/launch.py (fleetrun --legacy)
    "--selected_gpus": "selected_gpus", "--selected_xpus": None, "--backend": None, "--cluster_topo_path": None,
    "--rank_mapping_path": None, "--enable_auto_mapping": None, "--workers": None, "--worker_num": None,
    "--coordinators": None, "--coordinator_num": None, "--heter_workers": None, "--heter_worker_num": None,
    "--heter_devices": None, "--http_port": None, "--elastic_server": None, "--elastic_pre_hook": None,
    "--np": None, "--scale": None, "--force": None,
}
VALUE = {"--master": "10.0.0.1:29500", "--ips": "127.0.0.1", "--run_mode": "collective", "--log_level": "DEBUG",
         "--devices": "0", "--gpus": "0", "--selected_gpus": "0", "--host": "127.0.0.1", "--start_port": "17000",
         "--log_overwrite": "true", "--enable_gpu_log": "false"}


def _parser_flags(build) -> set[str]:
    """The option strings of the parser ``build()`` makes, stopped before it parses anything."""
    seen: list[argparse.ArgumentParser] = []

    class Stop(Exception):
        pass

    def grab(self, *args, **kwargs):
        seen.append(self)
        raise Stop

    original = argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_known_args = grab
    try:
        build()
    except Stop:
        pass
    finally:
        argparse.ArgumentParser.parse_known_args = original
    assert seen, f"{build} built no parser"
    return {s for action in seen[0]._actions for s in action.option_strings if s.startswith("--")} - {"--help"}


def paddle_flags() -> dict[str, str]:
    """Every flag of the installed Paddle's launchers -> which launcher has it."""
    from paddle.distributed.fleet import launch as legacy
    from paddle.distributed.launch.context import args_envs

    found = {f: "paddle.distributed.launch" for f in _parser_flags(args_envs.parse_args)}
    for f in _parser_flags(legacy._parse_args) | set(re.findall(r"[\"'](--[a-z_]+)[\"']",
                                                                inspect.getsource(legacy._parse_args))):
        found.setdefault(f, "fleet/launch.py (legacy)")
    return found


FLAGS = paddle_flags()


def test_every_paddle_flag_is_classified():
    missing = sorted(set(FLAGS) - set(MEANING))
    assert not missing, f"flags of Paddle {paddle.__version__}'s launchers that ppmulti launch does not know: {missing}"
    # the ones the issue names, on this Paddle
    assert {"--max_restart", "--master", "--nnodes", "--rank", "--elastic_level", "--selected_gpus"} <= set(FLAGS)


@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_each_paddle_flag_accepted_with_its_meaning_or_refused_by_name(flag):
    value = VALUE.get(flag, "1")
    dest = MEANING[flag]
    if dest is None:
        with pytest.raises(UserError) as info:
            split_argv([flag, value, "t.py"])
        message = str(info.value)
        assert message.startswith(f"{flag} is a launcher flag ppmulti launch cannot honour: ") and "\n" not in message
        assert len(message) > len(flag) + 45, message   # a reason follows
        with pytest.raises(UserError):
            split_argv([f"{flag}={value}", "t.py"])
    else:
        for argv in ([flag, value, "t.py"], [f"{flag}={value}", "t.py"]):
            ns = parse_launch_args(argv)
            assert getattr(ns, dest) == value and ns.script == "t.py", (argv, vars(ns))


def test_max_restart_is_ppmultis_restarts_and_rank_the_node_rank():
    plan = build_plan(parse_launch_args(["--max_restart", "2", "--master", "10.0.0.1:29500", "--nnodes", "2",
                                         "--rank", "1", "t.py"]), {}, set(), 0)
    assert (plan.max_restarts, plan.node_rank, plan.master_addr, plan.master_port) == (2, 1, "10.0.0.1", 29500)
    argv, _ = to_paddle(plan)
    assert "--max_restart" not in argv     # restarts stay with ppmulti: Paddle restarts only under etcd


def test_paddles_own_logging_flags_reach_its_launcher():
    plan = build_plan(parse_launch_args(["--log_level", "DEBUG", "--log_overwrite", "true", "--enable_gpu_log",
                                         "false", "--run_mode", "collective", "t.py"]), {}, set(), 0)
    argv, _ = to_paddle(plan)
    i = argv.index("--log_level")
    assert argv[i:i + 6] == ["--log_level", "DEBUG", "--log_overwrite", "true", "--enable_gpu_log", "false"]
    assert "--run_mode" not in argv


@pytest.mark.parametrize("argv, needle", [
    (["--run_mode", "ps", "t.py"], "--run_mode ps: ppmulti trains collectively"),
    (["--master", "etcd://10.0.0.1:2379", "t.py"], "an etcd master (--master) needs --nnodes MIN:MAX"),
    (["--elastic_level", "1", "t.py"], "--elastic_level applies to elastic runs on an etcd master"),
    (["--nnodes", "1:2", "t.py"], "--nnodes 1:2: elastic MIN:MAX node ranges need an etcd master"),
    (["--nproc", "2", "t.py"], "unknown launch flag --nproc (before the script); did you mean --nproc_per_node?"),
])
def test_paddle_values_ppmulti_cannot_honour_are_one_line(argv, needle):
    with pytest.raises(UserError) as info:
        build_plan(parse_launch_args(argv), {}, set(), 0)
    assert str(info.value).startswith(needle) and "\n" not in str(info.value)
