"""ppmulti launch --nodes: pure per-node mapping and preflight pieces, then real ssh fan-outs through a test sshd."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import missing_programs, require_system
from launching import ALLREDUCE, SLEEPER, free_ports

from ppmulti.common import envvars as E
from ppmulti.common.errors import UserError
from ppmulti.procs.launch import nodes as N


REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
FAILER = str(FIXTURES / "nodes_fail_script.py")


def plan_of(*argv: str, cwd: str = "/srv/run", root: str | None = "/srv/run", job: str = "J") -> N.NodesPlan:
    return N.plan_nodes(list(argv), cwd, "/usr/bin/python3", root, job)


# --- the per-node argv (pure) --------------------------------------------------------------------------
def _node(rank: int, nodes: str, port: int = 29500, log: str = "log") -> list[str]:
    hosts = [h.rsplit("@", 1)[-1] for h in nodes.split(",")]
    return ["--nnodes", str(len(hosts)), "--node_rank", str(rank), "--master_addr", hosts[0], "--master_port",
            str(port), "--host", hosts[rank], "--log_dir", f"{log}/node{rank}"]


# id, argv -> per-node launch argvs
GOLDEN = [
    ("two_nodes_flags_kept", ["--nodes", "10.0.0.1,10.0.0.2", "--nproc_per_node", "2", "train.py", "-c", "y.yml"],
     [[*_node(0, "10.0.0.1,10.0.0.2"), "--nproc_per_node", "2", "train.py", "-c", "y.yml"],
      [*_node(1, "10.0.0.1,10.0.0.2"), "--nproc_per_node", "2", "train.py", "-c", "y.yml"]]),
    ("dashed_equals_port_logdir_user",
     ["--nodes=alice@10.0.0.1,10.0.0.2,10.0.0.3", "--master-port=29400", "--log-dir=runs/l", "--nproc-per-node=1",
      "--rdzv-timeout", "30", "train.py"],
     [[*_node(r, "alice@10.0.0.1,10.0.0.2,10.0.0.3", 29400, "runs/l"), "--nproc-per-node=1", "--rdzv-timeout", "30",
       "train.py"] for r in range(3)]),
    ("matching_nnodes_dropped_ssh_flags_dropped",
     ["--nnodes", "2", "--nodes", "a,b", "--ssh-port", "2222", "--ssh-option", "X=1", "--remote-cwd", "/r",
      "--gpus", "0,1", "t.py"],
     [[*_node(0, "a,b"), "--gpus", "0,1", "t.py"], [*_node(1, "a,b"), "--gpus", "0,1", "t.py"]]),
    ("script_args_untouched", ["--nodes", "a", "t.py", "--nodes", "x", "--nnodes", "9", "--", "-o", "a=b c"],
     [[*_node(0, "a"), "t.py", "--nodes", "x", "--nnodes", "9", "--", "-o", "a=b c"]]),
    ("double_dash_before_script", ["--nodes", "a,b", "--", "t.py", "x"],
     [[*_node(0, "a,b"), "t.py", "x"], [*_node(1, "a,b"), "t.py", "x"]]),
]


@pytest.mark.parametrize("argv, expected", [g[1:] for g in GOLDEN], ids=[g[0] for g in GOLDEN])
def test_per_node_argv_golden(argv, expected):
    plan = plan_of(*argv)
    assert [list(a) for a in plan.launch_argvs] == expected
    assert plan.master_addr == expected[0][5]


ERRORS = [
    (["--nodes", "a,b", "--node_rank", "1", "t.py"], ["--node_rank", "drop --node_rank"]),
    (["--nodes", "a,b", "--master_addr", "a", "t.py"], ["--master_addr", "first of --nodes"]),
    (["--nodes", "a,b", "--master", "a:1", "t.py"], ["--master", "--master_port"]),
    (["--nodes", "a,b", "--ips", "a,b", "t.py"], ["--ips"]),
    (["--nodes", "a,b", "--host", "a", "t.py"], ["--host"]),
    (["--nodes", "a,b", "--standalone", "t.py"], ["--standalone"]),
    (["--nodes", "a,b", "--nnodes", "3", "t.py"], ["--nnodes 3", "2 nodes", "drop --nnodes"]),
    (["--nodes", "a,a", "t.py"], ["listed twice"]),
    (["--nodes", ",", "t.py"], ["e.g. --nodes 10.0.0.1,10.0.0.2"]),
    (["--nodes", "a,b"], ["no training script"]),
    (["--nodes", "a,b", "--ssh-port", "x", "t.py"], ["--ssh-port x", "e.g. --ssh-port 22"]),
    (["--nodes", "a,b", "--ssh-option", "BatchMode", "t.py"], ["--ssh-option", "KEY=VALUE"]),
    (["--nodes", "a,b", "--ssh-timeout", "0", "t.py"], ["--ssh-timeout", "positive"]),
    (["--nodes", "a,b", "--master_port", "65535", "t.py"], ["--master_port 65535"]),
]


@pytest.mark.parametrize("argv, needles", ERRORS, ids=[e[1][0] for e in ERRORS])
def test_bad_fan_out_flags_are_one_line_user_errors(argv, needles):
    with pytest.raises(UserError) as info:
        plan_of(*argv)
    assert "\n" not in str(info.value)
    for needle in needles:
        assert needle in str(info.value)


def test_ssh_command_batchmode_first_user_options_before_defaults():
    plan = plan_of("--nodes", "u@h1,h2", "--ssh-port", "2222", "--ssh-identity", "/k", "--ssh-config", "/c",
                   "--ssh-option", "ServerAliveInterval=5", "--ssh-timeout", "3", "t.py")
    argv = N.node_commands(plan)[1]
    assert argv[:5] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3"]
    assert ["-F", "/c"] == argv[5:7] and ["-i", "/k"] == argv[7:9] and ["-p", "2222"] == argv[9:11]
    # ssh keeps the first value of an option: the user's keep-alive wins over ppmulti's default
    assert argv.index("ServerAliveInterval=5") < argv.index("ServerAliveInterval=15")
    assert argv[-3:-1] == ["-T", "h2"] and "--run J-node1 --token-stdin --" in argv[-1]
    assert "BatchMode=yes" in N.ssh_argv(plan, 0, "true")


def _fake_python(tmp_path: Path) -> Path:
    fake = tmp_path / "bin dir" / "py"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"print(json.dumps({{'argv': sys.argv[1:], 'cwd': os.getcwd(), "
                    f"'pythonpath': os.environ.get('PYTHONPATH'), "
                    f"'unbuffered': os.environ.get('PYTHONUNBUFFERED')}}))\n")
    fake.chmod(0o755)
    return fake


def test_remote_command_quoting_survives_a_real_shell(tmp_path):
    nasty = ["out dir", "it's", 'say "hi"', "$HOME", "`id`", "a;b", "*", "-o", "x=[1, 2]", ""]
    cwd = tmp_path / "my run"
    cwd.mkdir()
    fake = _fake_python(tmp_path)
    plan = N.plan_nodes(["--nodes", "h1,h2", "--remote-python", str(fake), "t.py", *nasty], str(cwd),
                        sys.executable, str(cwd), "J")
    remote = N.node_commands(plan)[1][-1]
    proc = subprocess.run(["sh", "-c", remote], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["argv"] == ["-m", "ppmulti.procs.launch.nodes", "--run", "J-node1", "--token-stdin", "--",
                           *plan.launch_argvs[1]]
    assert seen["argv"][-len(nasty):] == nasty
    assert seen["cwd"] == str(cwd) and seen["pythonpath"] == str(cwd) and seen["unbuffered"] == "1"


def test_remote_cwd_with_tilde_is_expanded_by_the_remote_shell(tmp_path):
    home = tmp_path / "home"
    (home / "a b").mkdir(parents=True)
    fake = _fake_python(tmp_path)
    plan = N.plan_nodes(["--nodes", "h", "--remote-cwd", "~/a b", "--remote-python", str(fake), "t.py"],
                        "/x", sys.executable, None, "J")
    proc = subprocess.run(["sh", "-c", N.node_commands(plan)[0][-1]], capture_output=True, text=True,
                          env={**os.environ, "HOME": str(home)}, timeout=30)
    assert json.loads(proc.stdout)["cwd"] == str(home / "a b") and json.loads(proc.stdout)["pythonpath"] is None


@pytest.mark.parametrize("root, cwd, remote, expected", [
    ("/src/ppm", "/src/ppm", "/r/ppm", "/r/ppm"),                # run from the checkout
    ("/src/ppm", "/src/ppm/tests", "/r/ppm/tests", "/r/ppm"),    # from inside it
    ("/src/ppm", "/src", "/r", "/r/ppm"),                        # from above it
    ("/src/ppm", "/data/run", "/data/run", "/src/ppm"),          # elsewhere: the same absolute path
    (None, "/data/run", "/data/run", None),                      # installed: the nodes' own install
])
def test_remote_pythonpath(root, cwd, remote, expected):
    assert N.remote_pythonpath(root, cwd, remote) == expected


def test_dry_run_and_nodes_only_flags_through_the_cli(capsys):
    from ppmulti.procs.launch.command import main

    assert main(["--nodes", "10.0.0.1,10.0.0.2", "--dry-run", "t.py", "a b"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# node0 10.0.0.1" and lines[2] == "# node1 10.0.0.2"
    assert shlex.split(lines[3])[:3] == ["ssh", "-o", "BatchMode=yes"] and "'\"'\"'a b'\"'\"'" in lines[3]
    assert main(["--ssh-port", "22", "t.py"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --ssh-port only applies to ssh fan-out: add --nodes HOST,HOST "
                                               "or drop --ssh-port")


def test_a_nodes_result_json_is_read_here_only_when_this_run_wrote_it(tmp_path):
    """Node i's launch writes LOG_DIR/node{i}/result.json under --remote-cwd: seen here on one file system."""
    plan = plan_of("--nodes", "10.0.0.1,10.0.0.2", "--log_dir", "logs", "t.py", cwd=str(tmp_path), root=None)
    own = tmp_path / "logs" / "node1" / "result.json"
    own.parent.mkdir(parents=True)
    own.write_text('{"state": "SUCCEEDED", "exit_code": 0}\n')
    written = own.stat().st_mtime
    assert N.node_result(plan, 1, written - 1) == {"state": "SUCCEEDED", "exit_code": 0}
    assert N.node_result(plan, 1, written + 1) is None     # an earlier run's file
    assert N.node_result(plan, 0, 0) is None               # not there: the ssh exit says
    own.write_text('{"state": ')
    assert N.node_result(plan, 1, 0) is None


# --- preflight pieces (pure or local) --------------------------------------------------------------------
def test_script_data_args():
    assert N.script_data_args(["-c", "a.yml", "--eval", "-o", "x=1", "y=2", "--data=d.yaml"]) == \
        ("a.yml", ["x=1", "y=2"], "d.yaml")
    assert N.script_data_args(["--config=b.yml", "--opt", "TrainDataset.dataset_dir=/d"]) == \
        ("b.yml", ["TrainDataset.dataset_dir=/d"], None)
    assert N.script_data_args(["out", "--", "x"]) == (None, [], None)


def _site(root: Path) -> Path:
    """A run directory: a config over two _BASE_ levels (one with a ppdet tag) and a small dataset."""
    (root / "configs" / "_base_").mkdir(parents=True)
    (root / "configs" / "_base_" / "data.yml").write_text(
        "TrainDataset:\n  !COCODataSet\n  dataset_dir: data/ds\n  image_dir: images\n"
        "EvalDataset: {dataset_dir: data/ds}\n")
    (root / "configs" / "_base_" / "model.yml").write_text("_BASE_: ['data.yml']\nepoch: 3\n")
    (root / "configs" / "run.yml").write_text("_BASE_: ['./_base_/model.yml']\nepoch: 1\n"
                                              "EvalDataset: {dataset_dir: data/val}\n")
    for rel, size in (("ds/a.jpg", 10), ("ds/sub/b.jpg", 20), ("val/c.jpg", 5)):
        path = root / "data" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
    (root / "train.py").write_text("print('train')\n")
    return root


def test_config_chain_and_dataset_dirs(tmp_path):
    site = _site(tmp_path)
    cfg, files = N.load_config_chain(site / "configs" / "run.yml")
    assert [f.name for f in files] == ["run.yml", "model.yml", "data.yml"]
    assert cfg["epoch"] == 1 and cfg["TrainDataset"]["image_dir"] == "images"
    assert N.dataset_dirs(cfg, [], None) == [("EvalDataset.dataset_dir", "data/val"),
                                             ("TrainDataset.dataset_dir", "data/ds")]
    assert N.dataset_dirs(cfg, ["TrainDataset.dataset_dir=/big/coco", "epoch=2"], {"path": "y"}) == [
        ("--data path", "y"), ("EvalDataset.dataset_dir", "data/val"), ("TrainDataset.dataset_dir", "/big/coco")]


def test_dir_manifest_sees_count_names_and_sizes(tmp_path):
    site = _site(tmp_path)
    count, digest = N.dir_manifest(site / "data" / "ds")
    assert count == 2
    (site / "data" / "ds" / "a.jpg").write_bytes(b"y" * 10)       # same size: same manifest (no content read)
    assert N.dir_manifest(site / "data" / "ds") == (2, digest)
    (site / "data" / "ds" / "a.jpg").write_bytes(b"y" * 11)
    assert N.dir_manifest(site / "data" / "ds")[1] != digest


def test_fingerprint_locally_and_compare(tmp_path):
    site = _site(tmp_path)
    argv = ["--nnodes", "2", "--node_rank", "1", "--master_addr", "10.9.9.9", "--master_port", "29500",
            "train.py", "-c", "configs/run.yml", "-o", "EvalDataset.dataset_dir=data/ds"]
    fp = N.fingerprint(argv, str(site))
    assert fp["errors"] == [] and fp["script"] and fp["config"] and fp["code"] == N.code_hash(REPO / "ppmulti")
    assert sorted(fp["datasets"]) == ["EvalDataset.dataset_dir", "TrainDataset.dataset_dir"]
    assert fp["datasets"]["TrainDataset.dataset_dir"]["files"] == 2
    assert N.compare(["node0 a", "node1 b"], [fp, dict(fp)]) == []
    other = json.loads(json.dumps(fp))
    other["code"] = "0" * 64
    other["datasets"]["TrainDataset.dataset_dir"]["files"] = 3
    problems = N.compare(["node0 a", "node1 b"], [fp, other, None])
    assert len(problems) == 2 and all(p.startswith("node1 b: ") for p in problems)
    assert "ppmulti code" in problems[0] and "node0 a's" in problems[0]
    assert "dataset TrainDataset.dataset_dir data/ds" in problems[1] and "3 files" in problems[1]
    shutil.rmtree(site / "data" / "ds")
    missing = N.fingerprint([*argv[:-5], "nope.py", "-c", "configs/none.yml"], str(site))
    assert any("script nope.py not found" in e for e in missing["errors"])
    assert any("config configs/none.yml" in e for e in missing["errors"])


# --- a real test host: sshd on loopback addresses --------------------------------------------------------
ADDRS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
OTHER_MACHINE = "127.0.0.4"     # its sshd rewrites SITES/a to SITES/b: a node whose files differ


class SshHosts:
    def __init__(self, root: Path, port: int, key: Path, config: Path, sites: Path):
        self.root, self.port, self.key, self.config, self.sites = root, port, key, config, sites


@pytest.fixture(scope="module")
def ssh_hosts(tmp_path_factory):
    absent = missing_programs("sshd", "ssh", "ssh-keygen")
    require_system(f"{', '.join(absent)} not installed" if absent else None,
                   "apt-get install openssh-server openssh-client")
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    root = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)], check=True)
    shutil.copy(root / "user_key.pub", root / "authorized_keys")
    sites = root / "sites"
    (sites / "a").mkdir(parents=True)
    rewrite = root / "other_machine.sh"
    rewrite.write_text("#!/bin/sh\n# this 'machine' keeps at SITES/a what the others keep at SITES/b\n"
                       f"exec /bin/sh -c \"$(printf '%s' \"$SSH_ORIGINAL_COMMAND\" | "
                       f"sed 's|{sites}/a|{sites}/b|g')\"\n")
    rewrite.chmod(0o755)
    port = free_ports(1, tuple(ADDRS))
    (root / "sshd_config").write_text(
        "".join(f"ListenAddress {a}:{port}\n" for a in ADDRS) +
        f"HostKey {root}/host_key\nAuthorizedKeysFile {root}/authorized_keys\nPidFile {root}/sshd.pid\n"
        "UsePAM no\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\nLogLevel ERROR\nMaxStartups 50\n"
        f"Match LocalAddress {OTHER_MACHINE}\n    ForceCommand {rewrite}\n")
    (root / "ssh_config").write_text(
        f"Host 127.0.0.*\n    Port {port}\n    IdentityFile {root}/user_key\n    IdentitiesOnly yes\n"
        "    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n    LogLevel ERROR\n")
    try:
        os.makedirs("/run/sshd", exist_ok=True)     # sshd's privilege separation directory
    except OSError:
        pass
    log = (root / "sshd.log").open("w")
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(root / "sshd_config")], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 15
        while True:
            probe = subprocess.run(["ssh", "-F", str(root / "ssh_config"), "-o", "BatchMode=yes", ADDRS[0], "true"],
                                   capture_output=True, text=True, stdin=subprocess.DEVNULL)
            if probe.returncode == 0:
                break
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"test sshd did not come up: {probe.stderr}\n{(root / 'sshd.log').read_text()}")
            time.sleep(0.2)
        yield SshHosts(root, port, root / "user_key", root / "ssh_config", sites)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def tagged(job: str) -> list[int]:
    """Live processes of a fan-out job: tagged in their environment, or a node supervisor for it."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if f"{E.PPMULTI_NODES_JOB}={job}".encode() in environ or job.encode() in cmdline:
            found.append(int(entry))
    return found


def wait_gone(job: str, seconds: float) -> list[int]:
    deadline = time.time() + seconds
    while (left := tagged(job)) and time.time() < deadline:
        time.sleep(0.2)
    return left


class FanOut:
    """``ppmulti launch --nodes ...`` processes; anything of theirs left at teardown is killed."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.runs: list[tuple[subprocess.Popen, Path, Path]] = []

    def start(self, *args: str, cwd: Path | None = None, pythonpath: Path = REPO) -> subprocess.Popen:
        n = len(self.runs)
        out, err = self.tmp / f"fan{n}.out", self.tmp / f"fan{n}.err"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "FLAGS_START_PORT"))}
        env["PYTHONPATH"] = str(pythonpath)
        proc = subprocess.Popen([sys.executable, "-m", "ppmulti.cli", "launch", *args], cwd=cwd or self.tmp, env=env,
                                stdout=out.open("w"), stderr=err.open("w"), start_new_session=True)
        self.runs.append((proc, out, err))
        return proc

    def texts(self, proc: subprocess.Popen) -> tuple[str, str]:
        _, out, err = next(r for r in self.runs if r[0] is proc)
        return out.read_text(errors="replace"), err.read_text(errors="replace")

    def wait(self, proc: subprocess.Popen, timeout: float) -> int:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            out, err = self.texts(proc)
            pytest.fail(f"fan-out did not finish in {timeout}s:\n{out[-2000:]}\n{err[-2000:]}")

    def job(self, proc: subprocess.Popen, timeout: float = 30) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            match = re.search(r"job (ppm\S+): starting", self.texts(proc)[1])
            if match:
                return match.group(1)
            time.sleep(0.1)
        pytest.fail(f"no job line:\n{self.texts(proc)}")

    def close(self) -> None:
        for proc, _, err in self.runs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            match = re.search(r"job (ppm\S+): starting", err.read_text(errors="replace"))
            for pid in tagged(match.group(1)) if match else []:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture
def fan(tmp_path):
    runs = FanOut(tmp_path)
    try:
        yield runs
    finally:
        runs.close()


def _wait_files(paths: list[Path], proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.time() + seconds
    while not all(p.exists() for p in paths) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_nodes_over_ssh_all_reduce_prefixed_output_and_node_logs(ssh_hosts, fan, tmp_path):
    out, port = tmp_path / "out", free_ports(2, ("127.0.0.1", ""))
    t = time.time()
    proc = fan.start("--nodes", "127.0.0.2,127.0.0.3", "--nproc_per_node", "1", "--ssh-config", str(ssh_hosts.config),
                     "--master_port", str(port), "--rdzv-timeout", "60", ALLREDUCE, str(out))
    code = fan.wait(proc, 150)
    console, messages = fan.texts(proc)
    assert code == 0, messages[-3000:] + console[-3000:]
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world_size"], r["sum"]) for r in records] == [(0, 2, 1.0), (1, 2, 1.0)]
    assert [r["env"]["GROUP_RANK"] for r in records] == ["0", "1"]
    assert records[1]["env"]["PADDLE_CURRENT_ENDPOINT"].startswith("127.0.0.3:")
    # node 0 on the console, node 1 in its log file, with one line saying where
    assert "[node0 127.0.0.2] " in console and "[node1" not in console
    assert "node1 127.0.0.3: output in log/nodes/node1.log" in messages
    node1 = (tmp_path / "log" / "nodes" / "node1.log").read_text().splitlines()
    assert node1 and all(line.startswith("[node1 127.0.0.3] ") for line in node1)
    assert any("node 1: all 2 nodes joined" in line for line in node1)
    assert (tmp_path / "log" / "node1" / "workerlog.0").exists()      # Paddle's own logs, one folder per node
    # the fan-out's combined result beside them, each node's read from its own result.json (one file system here)
    combined = json.loads((tmp_path / "log" / "result.json").read_text())
    assert (combined["state"], combined["exit_code"], combined["cause"]) == ("SUCCEEDED", 0, None), combined
    assert [(n["node"], n["state"], n["exit_code"], n["source"]) for n in combined["nodes"]] == [
        ("node0 127.0.0.2", "SUCCEEDED", 0, "result.json"), ("node1 127.0.0.3", "SUCCEEDED", 0, "result.json")]
    assert 0 < max(n["duration"] for n in combined["nodes"]) <= combined["duration"]
    assert time.time() - t < 120


def _make_sites(sites: Path, differ: str) -> None:
    """SITES/a: a checkout (ppmulti, setup.py) with a run config and dataset; SITES/b: the same but ``differ``."""
    a, b = sites / "a", sites / "b"
    for d in (a, b):
        shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(REPO / "ppmulti", a / "ppmulti", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "setup.py", a / "setup.py")
    _site(a)
    shutil.copytree(a, b)
    if differ == "code":
        with (b / "ppmulti" / "procs" / "launch" / "plan.py").open("a") as fh:
            fh.write("# a local edit on one node\n")
    elif differ == "config":
        with (b / "configs" / "_base_" / "data.yml").open("a") as fh:
            fh.write("worker_num: 8\n")
    elif differ == "dataset":
        (b / "data" / "ds" / "extra.jpg").write_bytes(b"z")
    elif differ == "dataset_missing":
        shutil.rmtree(b / "data" / "val")


@pytest.mark.parametrize("differ, needle", [
    ("code", "ppmulti code (hash of its .py files) differs from node0 127.0.0.2's"),
    ("config", "config with its _BASE_ files (sha256) differs from node0 127.0.0.2's"),
    ("dataset", "dataset TrainDataset.dataset_dir data/ds differs from node0 127.0.0.2's: 3 files"),
    ("dataset_missing", "EvalDataset.dataset_dir data/val: no such directory"),
], ids=["code", "config", "dataset", "dataset_missing"])
@pytest.mark.slow
@pytest.mark.multiproc
def test_preflight_mismatch_starts_nothing_and_names_node_and_difference(ssh_hosts, fan, differ, needle):
    _make_sites(ssh_hosts.sites, differ)
    site = ssh_hosts.sites / "a"
    t = time.time()
    proc = fan.start("--nodes", f"127.0.0.2,{OTHER_MACHINE}", "--ssh-config", str(ssh_hosts.config), "train.py",
                     "-c", "configs/run.yml", "-o", "log_iter=5", cwd=site, pythonpath=site)
    code = fan.wait(proc, 60)
    console, messages = fan.texts(proc)
    errors = [ln for ln in messages.splitlines() if ln.startswith("error:")]
    assert code == 1 and time.time() - t < 30, messages
    assert errors == [f"error: preflight: node1 {OTHER_MACHINE}: {needle}" + errors[0].split(needle, 1)[-1]], messages
    assert "nothing started" in messages and "starting" not in messages and not (site / "log").exists()


@pytest.mark.slow
@pytest.mark.multiproc
def test_unreachable_node_is_named_within_seconds(ssh_hosts, fan):
    dead = "127.0.0.5"
    t = time.time()
    proc = fan.start("--nodes", f"127.0.0.2,{dead}", "--ssh-port", str(ssh_hosts.port), "--ssh-identity",
                     str(ssh_hosts.key), "--ssh-option", "StrictHostKeyChecking=no", "--ssh-option",
                     "UserKnownHostsFile=/dev/null", "--ssh-option", "LogLevel=ERROR", "--ssh-timeout", "5",
                     ALLREDUCE, "out")
    code = fan.wait(proc, 60)
    _, messages = fan.texts(proc)
    errors = [ln for ln in messages.splitlines() if ln.startswith("error:")]
    assert code == 1 and time.time() - t < 25, messages   # --ssh-timeout 5, not ssh's own minutes; margin for load
    assert len(errors) == 1 and errors[0].startswith(f"error: preflight: node1 {dead}: not reachable by ssh"), messages
    assert "nothing started" in messages


@pytest.mark.slow
@pytest.mark.multiproc
def test_missing_remote_directory_is_a_preflight_problem(ssh_hosts, fan, tmp_path):
    proc = fan.start("--nodes", "127.0.0.2,127.0.0.3", "--ssh-config", str(ssh_hosts.config), "--remote-cwd",
                     str(tmp_path / "not there"), ALLREDUCE, "out")
    assert fan.wait(proc, 60) == 1
    errors = [ln for ln in fan.texts(proc)[1].splitlines() if ln.startswith("error:")]
    assert [e.split(":")[1:3] for e in errors] == [[" preflight", " node0 127.0.0.2"],
                                                   [" preflight", " node1 127.0.0.3"]], errors
    assert all("the preflight did not run there" in e and "--remote-cwd" in e for e in errors), errors


def test_node_side_never_imports_paddle():
    code = ("import sys, ppmulti.procs.launch.nodes as n; n.fingerprint(['t.py', '-c', 'none.yml']); "
            "print('paddle' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_failing_node_stops_the_others_and_is_named(ssh_hosts, fan, tmp_path):
    out = tmp_path / "out"
    proc = fan.start("--nodes", "127.0.0.2,127.0.0.3", "--ssh-config", str(ssh_hosts.config), "--master_port",
                     str(free_ports(2, ("127.0.0.1", ""))), FAILER, str(out))
    job = fan.job(proc)
    code = fan.wait(proc, 120)
    console, messages = fan.texts(proc)
    assert code != 0, messages
    errors = [ln for ln in messages.splitlines() if ln.startswith("error:")]
    assert errors and errors[0].startswith("error: node1 127.0.0.3 exited with code "), messages
    assert "stopping the other nodes" in errors[0] and "[node1 127.0.0.3] node 1 fails on purpose" in messages
    pid0 = int((out / "pid0").read_text())
    assert wait_gone(job, 10) == [], f"processes of {job} outlived the fan-out"
    combined = json.loads((tmp_path / "log" / "result.json").read_text())
    assert (combined["state"], combined["exit_code"], combined["job"]) == ("FAILED", code, job), combined
    node0, node1 = combined["nodes"]
    assert (node1["state"], node1["exit_code"], node1["source"]) == ("FAILED", code, "result.json"), combined
    assert combined["cause"] == f"node1 127.0.0.3: {node1['cause']}" and "exited with code 3" in node1["cause"]
    assert node0["state"] == "INTERRUPTED" and node0["ssh_exit"] != 0, combined   # stopped by the fan-out
    assert not Path(f"/proc/{pid0}/cmdline").exists() or not Path(f"/proc/{pid0}/cmdline").read_bytes()


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_stopping_the_fan_out_leaves_nothing_on_any_node(ssh_hosts, fan, tmp_path, how):
    """SIGINT: the fan-out stops every node itself. SIGKILL: the ssh sessions' EOF still stops them."""
    out = tmp_path / "out"
    proc = fan.start("--nodes", "127.0.0.2,127.0.0.3", "--ssh-config", str(ssh_hosts.config), "--master_port",
                     str(free_ports(2, ("127.0.0.1", ""))), SLEEPER, str(out))
    job = fan.job(proc)
    _wait_files([out / "pid0", out / "pid1"], proc, 90)
    assert (out / "pid0").exists() and (out / "pid1").exists(), fan.texts(proc)
    running = tagged(job)
    assert len(running) >= 6, running   # per node: supervisor, ppmulti launch, Paddle's launcher, the rank
    t = time.time()
    if how == "SIGINT":
        proc.send_signal(signal.SIGINT)   # to the fan-out only, as a terminal's Ctrl-C would reach it
        assert fan.wait(proc, 40) == 130
        assert "SIGINT: stopping every node" in fan.texts(proc)[1]
        combined = json.loads((tmp_path / "log" / "result.json").read_text())
        assert (combined["state"], combined["exit_code"], combined["signal"]) == ("INTERRUPTED", 130, "SIGINT")
        assert [n["state"] for n in combined["nodes"]] == ["INTERRUPTED", "INTERRUPTED"], combined
    else:
        proc.kill()
        proc.wait()
    left = wait_gone(job, 10)
    assert left == [], f"{how}: processes of {job} still alive after {time.time() - t:.1f}s: {left}"
    assert time.time() - t < 25
