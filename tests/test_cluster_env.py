"""Scheduler variables: SLURM hostlists, a real two-node SLURM on loopback (srun, sbatch), Kubeflow PyTorchJob pods."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DEMO_CONFIG, REPO, demo_overrides, missing_programs, require_system
from ppmulti.common.errors import UserError
from ppmulti.procs.launch.cluster_env import expand_hostlist
from launching import ALLREDUCE, Launches, free_ports, launch_env

HOSTLISTS = [
    ("n[1-2,5]", ["n1", "n2", "n5"]),
    ("n[1-2],m[3-4]", ["n1", "n2", "m3", "m4"]),
    ("x,y,z", ["x", "y", "z"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("n[01-2]", ["n01", "n02"]),
    ("n[5]", ["n5"]),
    ("n[2,1]", ["n2", "n1"]),
    ("r[1-2]n[3-4]", ["r1n3", "r1n4", "r2n3", "r2n4"]),
    ("n10-[1-2]", ["n10-1", "n10-2"]),
    (" n1 , n2", ["n1", "n2"]),
    ("n[1-2] n3", ["n1", "n2", "n3"]),
    ("n1,n1", ["n1", "n1"]),
    ("gpu-a[01-02]", ["gpu-a01", "gpu-a02"]),
]
# Slurm 22.05's scontrol refuses text after the last bracket ("Invalid hostlist"); ppmulti keeps it on every name
SUFFIXED = [("a[01-03]b", ["a01b", "a02b", "a03b"]), ("gpu-a[01-02]-ib,c", ["gpu-a01-ib", "gpu-a02-ib", "c"])]
BAD = ["n[3-1]", "n[1-2", "n[a-b]", "n]1["]


@pytest.mark.parametrize("text, hosts", HOSTLISTS + SUFFIXED, ids=[h[0] for h in HOSTLISTS + SUFFIXED])
def test_expand_hostlist_golden(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", BAD)
def test_expand_hostlist_refuses_a_broken_list_in_one_line(text):
    with pytest.raises(UserError, match=r"^node list .*(unbalanced brackets|rising range)"):
        expand_hostlist(text)


# --- a real SLURM on this machine -------------------------------------------------------------------------
DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "squeue")
ADDRS = ("127.0.0.2", "127.0.0.3")
HOSTS_FILE = Path("/etc/hosts")


class Slurm:
    """A running two-node cluster: its config, node names, and an environment for its client commands."""

    def __init__(self, root: Path, conf: Path, nodes: tuple[str, str]):
        self.root, self.conf, self.nodes = root, conf, nodes

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PADDLE_", "SLURM_", "FLAGS_START_PORT", "POD_IP", "MASTER_", "RANK",
                                    "WORLD_SIZE", "LOCAL_RANK"))}
        env.update(SLURM_CONF=str(self.conf), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **extra)
        return env

    def run(self, argv: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=timeout, **kw)
        except subprocess.TimeoutExpired as exc:
            subprocess.run(["scancel", "--full", "--user", "root"], env=self.env(), capture_output=True)
            pytest.fail(f"{argv[:3]} did not finish in {timeout}s: {exc.stdout!r} {exc.stderr!r}")

    def wait_idle(self, seconds: float = 120) -> None:
        """Until no job is queued or running (a finished sbatch job)."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            queue = self.run(["squeue", "-h", "-o", "%i %T"], timeout=30)
            if queue.returncode == 0 and not queue.stdout.strip():
                return
            time.sleep(0.5)
        pytest.fail(f"jobs still queued after {seconds}s: {queue.stdout}")


def _missing() -> str | None:
    absent = missing_programs(*DAEMONS)
    if absent:
        return f"{', '.join(absent)} not installed"
    if os.geteuid() != 0:
        return "a test SLURM runs its daemons as root (SlurmUser=root) and adds its node names to /etc/hosts"
    return None


def _which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _hosts_lines(nodes: tuple[str, str]) -> list[str]:
    return [f"{addr} {name}  # ppmulti test_slurm\n" for addr, name in zip(ADDRS, nodes)]


def _remove_hosts_lines(lines: list[str]) -> None:
    # rewritten in place: /etc/hosts may be a bind mount that a rename would not replace
    kept = [line for line in HOSTS_FILE.read_text().splitlines(keepends=True) if line not in lines]
    HOSTS_FILE.write_text("".join(kept))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """munged (its own key and socket), slurmctld and two slurmd (nodes at 127.0.0.2 and .3), all in the
    foreground as this test's children; the node names go into /etc/hosts (they must resolve: ppmulti launch
    resolves node 0's name as every node would on a real cluster) and come out again at the end."""
    require_system(_missing(), "apt-get install slurmd slurmctld slurm-client munge")
    root = tmp_path_factory.mktemp("slurm")
    for d in ("state", "spool"):
        (root / d).mkdir()
    (root / "munge.key").write_bytes(os.urandom(128))
    (root / "munge.key").chmod(0o600)
    tag = f"ppm{os.getpid()}n"
    nodes = (f"{tag}1", f"{tag}2")
    ctl, slurmd_port, port1, port2 = (free_ports(1) for _ in range(4))
    conf = root / "slurm.conf"
    conf.write_text(
        f"ClusterName=ppm\nSlurmctldHost={socket.gethostname()}(127.0.0.1)\nSlurmctldPort={ctl}\n"
        f"SlurmdPort={slurmd_port}\nAuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={root}/munge.sock\n"
        f"StateSaveLocation={root}/state\nSlurmdSpoolDir={root}/spool/%n\nSlurmctldPidFile={root}/slurmctld.pid\n"
        f"SlurmdPidFile={root}/slurmd.%n.pid\nSlurmctldLogFile={root}/slurmctld.log\nSlurmdLogFile={root}/slurmd.%n.log\n"
        "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSwitchType=switch/none\nMpiDefault=none\n"
        "ReturnToService=2\nSchedulerType=sched/builtin\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
        "SlurmUser=root\nSlurmdUser=root\nJobAcctGatherType=jobacct_gather/none\n"
        "AccountingStorageType=accounting_storage/none\nKillWait=5\n"
        f"NodeName={nodes[0]} NodeHostname={socket.gethostname()} NodeAddr={ADDRS[0]} Port={port1} "
        "CPUs=1 State=UNKNOWN\n"
        f"NodeName={nodes[1]} NodeHostname={socket.gethostname()} NodeAddr={ADDRS[1]} Port={port2} "
        "CPUs=1 State=UNKNOWN\n"
        f"PartitionName=p Nodes={nodes[0]},{nodes[1]} Default=YES MaxTime=INFINITE State=UP\n")
    for node in nodes:
        (root / "spool" / node).mkdir()
    cluster = Slurm(root, conf, nodes)
    lines = _hosts_lines(nodes)
    procs: list[subprocess.Popen] = []
    logs = []

    def start(name: str, *args: str) -> None:
        log = (root / f"{name}.{len(procs)}.out").open("w")
        logs.append(log)
        procs.append(subprocess.Popen([_which(name), *args], env=cluster.env(), stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True))

    try:
        with HOSTS_FILE.open("a") as hosts:
            hosts.writelines(lines)
        start("munged", "-F", "--force", f"--socket={root}/munge.sock", f"--key-file={root}/munge.key",
              f"--pid-file={root}/munged.pid", f"--seed-file={root}/munged.seed", f"--log-file={root}/munged.log")
        _wait(lambda: (root / "munge.sock").exists(), 20, "munged", root, procs)
        start("slurmctld", "-D", "-f", str(conf))
        for node in nodes:
            start("slurmd", "-D", "-f", str(conf), "-N", node)
        _wait(lambda: cluster.run(["sinfo", "-h", "-o", "%T %D"], timeout=30).stdout.split() == ["idle", "2"],
              60, "two idle nodes", root, procs)
        yield cluster
    finally:
        subprocess.run(["scancel", "--full", "--user", "root"], env=cluster.env(), capture_output=True, timeout=30)
        subprocess.run(["scontrol", "shutdown"], env=cluster.env(), capture_output=True, timeout=30)
        for proc in reversed(procs):    # the slurm daemons stop on shutdown; munged (last started) is stopped here
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for log in logs:
            log.close()
        _remove_hosts_lines(lines)


def _wait(ready, seconds: float, what: str, root: Path, procs: list[subprocess.Popen]) -> None:
    deadline = time.time() + seconds
    while not ready():
        if time.time() > deadline or any(p.poll() is not None for p in procs):
            logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                             for p in sorted(root.glob("*.log")) if p.is_file())
            pytest.fail(f"test SLURM: no {what} within {seconds}s\n{logs}")
        time.sleep(0.3)


LAUNCH = [sys.executable, "-m", "ppmulti.cli", "launch"]


@pytest.mark.slow   # a real SLURM: munged, slurmctld and two slurmd
def test_scontrol_expands_as_ppmulti_does(slurm):
    for text, hosts in HOSTLISTS:
        shown = slurm.run(["scontrol", "show", "hostnames", text], timeout=30)
        assert shown.stdout.split() == hosts, (text, shown.stderr)


@pytest.mark.slow   # a real SLURM: munged, slurmctld and two slurmd
def test_srun_two_nodes_plan_from_slurms_variables(slurm, tmp_path):
    """Each node's dry run under srun -N2: node count, rank, node 0's resolved address, its own, the job id."""
    proc = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "--chdir", str(tmp_path), "-l", *LAUNCH, "--dry-run",
                      "t.py"], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {int(line.split(":", 1)[0]): line.split(": ", 1)[1] for line in proc.stdout.splitlines()
             if " -m paddle.distributed.launch " in line}
    for rank, addr in enumerate(ADDRS):
        assert f"--master {ADDRS[0]}:29501 --nnodes 2 --rank {rank} --host {addr} --job_id slurm-" in lines[rank]
    assert f"# --master_addr {ADDRS[0]}: {slurm.nodes[0]} from SLURM_STEP_NODELIST" in proc.stdout


@pytest.mark.slow   # a real SLURM: munged, slurmctld and two slurmd
def test_batch_script_without_srun_is_refused_in_one_line(slurm, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\n#SBATCH -N2\n{shlex.join(LAUNCH)} --dry-run t.py\necho rc=$?\n")
    proc = slurm.run(["sbatch", "--parsable", "-o", str(tmp_path / "out.txt"), "--chdir", str(tmp_path), str(script)],
                     timeout=60)
    assert proc.returncode == 0, proc.stderr
    slurm.wait_idle()
    out = (tmp_path / "out.txt").read_text()
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "srun --ntasks-per-node=1 ppmulti launch" in errors[0], out
    assert "rc=2" in out


@pytest.mark.slow   # a real SLURM: munged, slurmctld and two slurmd
def test_evolution_candidates_under_srun_train_on_their_node_alone(slurm, tmp_path):
    """Under srun -N2 (one evolution worker per node) SLURM says "2 nodes", but the environment a candidate gets
    holds no node count from SLURM: a candidate that launches several devices plans its own node alone."""
    code = ("import os; from ppmulti.procs.launch.cluster_env import cluster_of; "
            "from ppmulti.procs.runs.evolve_run import Slot, candidate_env; "
            "print('step', cluster_of(os.environ).nnodes, cluster_of(candidate_env(os.environ, Slot('cpu#0', ()))))")
    proc = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "--chdir", str(tmp_path), "-l", sys.executable, "-c", code],
                     timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(line.split(": ", 1)[1] for line in proc.stdout.splitlines()) == ["step 2 None"] * 2, proc.stdout


def _train(data: Path, out: Path) -> list[str]:
    return [str(REPO / "tools" / "train.py"), "-c", str(DEMO_CONFIG), "-o", *demo_overrides(data),
            "--batch", "8", "--epochs", "1", "--output", str(out)]


def _one_run(out: Path) -> None:
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["global_batch"] == 8
    assert (out / "logs" / "rank1.log").is_file()
    assert "world size 2, global batch 8 (4 per rank)" in (out / "train.log").read_text()


@pytest.mark.slow
@pytest.mark.multiproc
def test_srun_two_nodes_train_together(slurm, small_demo, tmp_path):
    out = tmp_path / "run"
    proc = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "--chdir", str(tmp_path), *LAUNCH,
                      "--master_port", str(free_ports(2)), "--rdzv-timeout", "120", *_train(small_demo, out)],
                     timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _one_run(out)


@pytest.mark.slow
@pytest.mark.multiproc
def test_sbatch_two_nodes_train_together(slurm, small_demo, tmp_path):
    """README's sbatch script: srun starts one launch per node; the port comes from MASTER_PORT."""
    out = tmp_path / "run"
    script = tmp_path / "train.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
                      f"export MASTER_PORT={free_ports(2)}\n"
                      f"srun {shlex.join([*LAUNCH, '--rdzv-timeout', '120', *_train(small_demo, out)])}\n")
    proc = slurm.run(["sbatch", "--parsable", "-o", str(tmp_path / "job.out"), "--chdir", str(tmp_path), str(script)],
                     timeout=60)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    slurm.wait_idle(600)
    log = (tmp_path / "job.out").read_text(errors="replace")
    state = slurm.run(["scontrol", "show", "job", job], timeout=30).stdout   # kept MinJobAge (300 s) after the end
    assert "JobState=COMPLETED" in state, state + log[-3000:]
    _one_run(out)


@pytest.mark.slow
@pytest.mark.multiproc
def test_pytorchjob_variables_two_pods_all_reduce(tmp_path):
    """Two "pods" on this machine with only Kubeflow's variables (WORLD_SIZE=2 pods, RANK, MASTER_ADDR as a name
    to resolve, MASTER_PORT): one world of 2."""
    out, port = tmp_path / "out", free_ports(2)
    launches = Launches(tmp_path)
    try:
        procs = [launches.start("--log_dir", str(tmp_path / f"log{rank}"), ALLREDUCE, str(out),
                                env=launch_env(WORLD_SIZE="2", RANK=str(rank), MASTER_ADDR="localhost",
                                               MASTER_PORT=str(port)))
                 for rank in range(2)]
        codes = [launches.wait(p, timeout=300) for p in procs]
        assert codes == [0, 0], [launches.output(p)[-2000:] for p in procs]
    finally:
        launches.close()
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world_size"], r["sum"]) for r in records] == [(0, 2, 1.0), (1, 2, 1.0)]
    assert [r["env"]["GROUP_RANK"] for r in records] == ["0", "1"]
