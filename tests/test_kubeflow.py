"""Kubeflow's PyTorchJob (both operator generations) and PaddleJob: the exact variables a pod gets -> the plan.

The variable sets below are what kubeflow/training-operator's source sets, read from its git history:
* PyTorchJob, v1.7.0 and later: pkg/controller.v1/pytorch/envvar.go and master.go at commit 2856aa09d856 (2023-11-20,
  the last change before the v1 controllers were removed): WORLD_SIZE = replicas x nprocPerNode (1 when "auto"),
  RANK = PET_NODE_RANK = the pod's index (Master 0, Worker i -> i + 1), PET_NNODES = replicas, PET_NPROC_PER_NODE =
  nprocPerNode (defaulted to "auto" by pytorch_defaults.go), MASTER_ADDR/PET_MASTER_ADDR = JOB-master-0,
  MASTER_PORT/PET_MASTER_PORT = the "pytorchjob-port" container port (default 23456), PYTHONUNBUFFERED=1.
* PyTorchJob up to v1.6.0 (tag v1.6.0, commit 66aa6353c19d): WORLD_SIZE = replicas (pods), RANK, MASTER_ADDR,
  MASTER_PORT, PYTHONUNBUFFERED=0; no PET_ variables.
* PaddleJob: pkg/controller.v1/paddlepaddle/envvar.go at commit 8d8ddba2c0d8 (2023-07-12, its last change):
  PYTHONUNBUFFERED=1, PADDLE_JOB_ID = the job's name, PADDLE_NNODES = replicas; Worker 0 gets POD_IP_DUMMY (its
  status.podIP) and PADDLE_MASTER=$(POD_IP_DUMMY):PORT, which the kubelet expands to its address; the others
  PADDLE_MASTER = JOB-worker-0:PORT ("master" container port, default 36543). HOSTNAME (the pod's name,
  JOB-worker-i) comes from the container runtime, not the operator.
There is no Kubernetes here: the pods are these environments, run through the same functions as
``ppmulti launch --dry-run`` (and a few through the command itself).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ppmulti.common import envvars as E
from ppmulti.common.errors import UserError
from ppmulti.procs.launch.flags import build_plan, describe, parse_launch_args

REPO = Path(__file__).resolve().parents[1]
# what the cluster's DNS would answer for the pods' names (a headless service per pod)
DNS = {"yolo-master-0": "10.0.0.1", "yolo-worker-0": "10.0.0.2", "yolo-worker-1": "10.0.0.3",
       "ppmulti-yolo-master-0": "10.0.0.1", "ppmulti-yolo-worker-0": "10.0.0.2", "ppmulti-yolo-worker-1": "10.0.0.3"}

# --- the exact variables, per job spec and pod -------------------------------------------------------------
# PyTorchJob "yolo", operator v1.7.0+ (2856aa09d)
PT_1POD_NPROC1_MASTER = {
    "PYTHONUNBUFFERED": "1", "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "MASTER_ADDR": "yolo-master-0",
    "PET_MASTER_ADDR": "yolo-master-0", "WORLD_SIZE": "1", "RANK": "0", "PET_NODE_RANK": "0",
    "PET_NPROC_PER_NODE": "1", "PET_NNODES": "1"}
PT_2POD_NPROC8_MASTER = {
    "PYTHONUNBUFFERED": "1", "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "MASTER_ADDR": "yolo-master-0",
    "PET_MASTER_ADDR": "yolo-master-0", "WORLD_SIZE": "16", "RANK": "0", "PET_NODE_RANK": "0",
    "PET_NPROC_PER_NODE": "8", "PET_NNODES": "2"}
PT_2POD_NPROC8_WORKER = {
    "PYTHONUNBUFFERED": "1", "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "MASTER_ADDR": "yolo-master-0",
    "PET_MASTER_ADDR": "yolo-master-0", "WORLD_SIZE": "16", "RANK": "1", "PET_NODE_RANK": "1",
    "PET_NPROC_PER_NODE": "8", "PET_NNODES": "2"}
PT_2POD_AUTO_WORKER = {   # nprocPerNode not given: defaulted to "auto", counted as 1 in WORLD_SIZE
    "PYTHONUNBUFFERED": "1", "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "MASTER_ADDR": "yolo-master-0",
    "PET_MASTER_ADDR": "yolo-master-0", "WORLD_SIZE": "2", "RANK": "1", "PET_NODE_RANK": "1",
    "PET_NPROC_PER_NODE": "auto", "PET_NNODES": "2"}
# PyTorchJob "yolo", operator up to v1.6.0 (66aa6353c)
PT_OLD_2POD_MASTER = {"PYTHONUNBUFFERED": "0", "MASTER_PORT": "23456", "MASTER_ADDR": "yolo-master-0",
                      "WORLD_SIZE": "2", "RANK": "0"}
PT_OLD_2POD_WORKER = {"PYTHONUNBUFFERED": "0", "MASTER_PORT": "23456", "MASTER_ADDR": "yolo-master-0",
                      "WORLD_SIZE": "2", "RANK": "1"}
# PaddleJob "yolo", Worker replicas only (collective mode), 8d8ddba2c; worker 0's pod address 10.0.0.2
PD_1POD_WORKER0 = {"PYTHONUNBUFFERED": "1", "PADDLE_JOB_ID": "yolo", "PADDLE_NNODES": "1",
                   "POD_IP_DUMMY": "10.0.0.2", "PADDLE_MASTER": "10.0.0.2:36543"}
PD_2POD_WORKER0 = {"PYTHONUNBUFFERED": "1", "PADDLE_JOB_ID": "yolo", "PADDLE_NNODES": "2",
                   "POD_IP_DUMMY": "10.0.0.2", "PADDLE_MASTER": "10.0.0.2:36543"}
PD_2POD_WORKER1 = {"PYTHONUNBUFFERED": "1", "PADDLE_JOB_ID": "yolo", "PADDLE_NNODES": "2",
                   "PADDLE_MASTER": "yolo-worker-0:36543"}


def resolve(name: str) -> str | None:
    """The cluster's DNS: pod names to addresses, addresses to themselves."""
    return name if re.fullmatch(r"[\d.]+", name) else DNS.get(name)


def pod(env: dict[str, str], name: str) -> dict[str, str]:
    """A pod's environment: the operator's variables and the runtime's HOSTNAME."""
    return {**env, E.HOSTNAME: name}


def plan_in(environ, argv, local=(), gpus=0):
    return build_plan(parse_launch_args(argv), environ, set(local), gpus, resolve=resolve)


def dry_run(environ, argv, local=(), gpus=0) -> str:
    return describe(plan_in(environ, argv, local, gpus), environ)


def paddle_flags(text: str) -> list[str]:
    """The launcher flags of a dry run's command line (before the worker shim)."""
    words = text.splitlines()[0].split()
    return words[words.index("paddle.distributed.launch") + 1:next(i for i, w in enumerate(words)
                                                                   if w.endswith("worker.py"))]


# id, pod environment, ppmulti launch flags, this pod's addresses, GPUs -> Paddle's flags, (nnodes, rank, nproc)
GOLDEN = [
    ("pytorchjob_1pod_nproc1", pod(PT_1POD_NPROC1_MASTER, "yolo-master-0"), [], ("10.0.0.1",), 0,
     ["--nproc_per_node", "1", "--job_id", "yolo"], (1, 0, 1)),
    ("pytorchjob_2pods_nproc8_master_gpu", pod(PT_2POD_NPROC8_MASTER, "yolo-master-0"), [], ("10.0.0.1",), 8,
     ["--devices", "0,1,2,3,4,5,6,7", "--master", "10.0.0.1:23457", "--nnodes", "2", "--rank", "0",
      "--host", "10.0.0.1", "--job_id", "yolo"], (2, 0, 8)),
    ("pytorchjob_2pods_nproc8_worker_gpu", pod(PT_2POD_NPROC8_WORKER, "yolo-worker-0"), [], ("10.0.0.2",), 8,
     ["--devices", "0,1,2,3,4,5,6,7", "--master", "10.0.0.1:23457", "--nnodes", "2", "--rank", "1",
      "--host", "10.0.0.2", "--job_id", "yolo"], (2, 1, 8)),
    ("pytorchjob_2pods_nproc8_worker_cpu", pod(PT_2POD_NPROC8_WORKER, "yolo-worker-0"), [], ("10.0.0.2",), 0,
     ["--nproc_per_node", "8", "--master", "10.0.0.1:23457", "--nnodes", "2", "--rank", "1",
      "--host", "10.0.0.2", "--job_id", "yolo"], (2, 1, 8)),
    ("pytorchjob_2pods_auto_flag_wins", pod(PT_2POD_AUTO_WORKER, "yolo-worker-0"), ["--nproc_per_node", "2"],
     ("10.0.0.2",), 0,
     ["--nproc_per_node", "2", "--master", "10.0.0.1:23457", "--nnodes", "2", "--rank", "1",
      "--host", "10.0.0.2", "--job_id", "yolo"], (2, 1, 2)),
    ("pytorchjob_v1.6_2pods_master", pod(PT_OLD_2POD_MASTER, "yolo-master-0"), ["--nproc_per_node", "8"],
     ("10.0.0.1",), 0,
     ["--nproc_per_node", "8", "--master", "10.0.0.1:23457", "--nnodes", "2", "--rank", "0",
      "--host", "10.0.0.1", "--job_id", "yolo"], (2, 0, 8)),
    ("pytorchjob_v1.6_2pods_worker", pod(PT_OLD_2POD_WORKER, "yolo-worker-0"), ["--nproc_per_node", "8"],
     ("10.0.0.2",), 0,
     ["--nproc_per_node", "8", "--master", "10.0.0.1:23457", "--nnodes", "2", "--rank", "1", "--job_id", "yolo"],
     (2, 1, 8)),
    ("paddlejob_1pod", pod(PD_1POD_WORKER0, "yolo-worker-0"), [], ("10.0.0.2",), 0,
     ["--nproc_per_node", "1", "--job_id", "yolo"], (1, 0, 1)),
    ("paddlejob_2pods_worker0_nproc8", pod(PD_2POD_WORKER0, "yolo-worker-0"), ["--nproc_per_node", "8"],
     ("10.0.0.2",), 8,
     ["--devices", "0,1,2,3,4,5,6,7", "--master", "10.0.0.2:36544", "--nnodes", "2", "--rank", "0",
      "--host", "10.0.0.2", "--job_id", "yolo"], (2, 0, 8)),
    ("paddlejob_2pods_worker1", pod(PD_2POD_WORKER1, "yolo-worker-1"), [], ("10.0.0.3",), 0,
     ["--nproc_per_node", "1", "--master", "10.0.0.2:36544", "--nnodes", "2", "--rank", "1",
      "--host", "10.0.0.3", "--job_id", "yolo"], (2, 1, 1)),
]


@pytest.mark.parametrize("environ, flags, local, gpus, paddle, shape", [g[1:] for g in GOLDEN],
                         ids=[g[0] for g in GOLDEN])
def test_operator_variables_golden_dry_run(environ, flags, local, gpus, paddle, shape):
    plan = plan_in(environ, [*flags, "train.py"], local, gpus)
    assert (plan.nnodes, plan.node_rank, plan.nproc_per_node) == shape
    text = dry_run(environ, [*flags, "train.py"], local, gpus)
    assert paddle_flags(text) == paddle
    # the operator's variables never reach Paddle's launcher (it would read PADDLE_MASTER etc. itself)
    for name in environ:
        if name.startswith(("PADDLE_", "MASTER_", "RANK", "WORLD_SIZE")):
            assert f"unset {name}" in text.splitlines()


def test_node_count_is_pet_nnodes_never_a_process_count():
    """The issue's case: 2 pods x 8 processes; WORLD_SIZE=16 is not the node count."""
    text = dry_run(pod(PT_2POD_NPROC8_WORKER, "yolo-worker-0"), ["--device", "cpu", "train.py"], ("10.0.0.2",))
    assert "# --nnodes 2 from PET_NNODES" in text and "--nnodes 16" not in text
    assert "# --nproc_per_node 8 from PET_NPROC_PER_NODE" in text


@pytest.mark.parametrize("environ, needle", [
    ({**PT_2POD_NPROC8_WORKER, "WORLD_SIZE": "2"},
     "error: WORLD_SIZE=2 disagrees with PET_NNODES=2 x PET_NPROC_PER_NODE=8 = 16 processes"),
    ({**PT_2POD_AUTO_WORKER, "WORLD_SIZE": "16"},
     "error: WORLD_SIZE=16 disagrees with PET_NNODES=2 x PET_NPROC_PER_NODE=auto = 2 processes"),
    ({**PT_2POD_NPROC8_WORKER, "RANK": "0"}, "error: RANK=0 and PET_NODE_RANK=1 disagree"),
    ({**PT_2POD_NPROC8_WORKER, "PET_NNODES": "1:4", "WORLD_SIZE": "8"},
     "error: PET_NNODES=1:4: an elastic PyTorchJob"),
    ({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto", "PYTHONUNBUFFERED": "1"},
     "error: PET_NNODES=2 but no PET_NODE_RANK or RANK: a PyTorchJob without a Master replica"),
    ({**PD_2POD_WORKER1, "PADDLE_TRAINER_NUM": "1"}, "error: this PaddleJob has a Master replica"),
    ({**PD_2POD_WORKER1, E.HOSTNAME: "somewhere-else"},
     "error: Kubeflow PaddleJob of 2 pods: this pod's index is unknown (HOSTNAME=somewhere-else is not "
     "yolo-worker-N); pass --node_rank"),
    ({**PT_2POD_NPROC8_WORKER, E.HOSTNAME: "yolo-worker-0"}, "error: --nnodes 3 disagrees with PET_NNODES=2"),
])
def test_inconsistent_pod_variables_are_refused_by_name(environ, needle):
    flags = ["--nnodes", "3"] if "--nnodes 3" in needle else []
    with pytest.raises(UserError) as info:
        plan_in(environ, [*flags, "train.py"], ("10.0.0.2",))
    assert f"error: {info.value}".startswith(needle), str(info.value)
    assert "\n" not in str(info.value)


def test_elastic_min_equal_max_is_a_fixed_count():
    environ = pod({**PT_2POD_NPROC8_WORKER, "PET_NNODES": "2:2"}, "yolo-worker-0")
    assert plan_in(environ, ["train.py"], ("10.0.0.2",)).nnodes == 2


def test_flags_win_over_the_pods_defaults_and_the_paddlejob_index_flag():
    plan = plan_in(pod(PD_2POD_WORKER1, "not-a-pod-name"), ["--node_rank", "1", "--job_id", "mine",
                                                              "--master_port", "29600", "train.py"], ("10.0.0.3",))
    assert (plan.node_rank, plan.job_id, plan.master_port) == (1, "mine", 29600)


# --- through the command itself ----------------------------------------------------------------------------
def _cli(environ: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **environ}
    return subprocess.run([sys.executable, "-m", "ppmulti.cli", "launch", "--dry-run", *argv], env=env,
                          capture_output=True, text=True, timeout=60)


def _by_address(environ: dict[str, str]) -> dict[str, str]:
    """The pod's variables with the pods' names as DNS would answer them here (loopback), for the real command."""
    loop = {"yolo-master-0": "localhost", "yolo-worker-0": "localhost"}
    return {k: loop.get(v.split(":")[0], v.split(":")[0]) + (":" + v.split(":")[1] if ":" in v else "")
            if k in ("MASTER_ADDR", "PET_MASTER_ADDR", "PADDLE_MASTER") else v for k, v in environ.items()}


def test_pytorchjob_worker_pod_through_ppmulti_launch_dry_run():
    proc = _cli(pod(_by_address(PT_2POD_NPROC8_WORKER), "yolo-worker-0"), "--device", "cpu", "train.py")
    assert proc.returncode == 0, proc.stderr
    assert "--nproc_per_node 8 --master 127.0.0.1:23457 --nnodes 2 --rank 1" in proc.stdout
    assert "# --nnodes 2 from PET_NNODES" in proc.stdout


def test_paddlejob_worker_pod_through_ppmulti_launch_dry_run():
    proc = _cli(pod(_by_address(PD_2POD_WORKER1), "yolo-worker-1"), "train.py")
    assert proc.returncode == 0, proc.stderr
    assert "--master 127.0.0.1:36544 --nnodes 2 --rank 1" in proc.stdout and "--job_id yolo" in proc.stdout
    assert "unset PADDLE_MASTER" in proc.stdout    # read, then kept from Paddle's launcher


def test_bad_pod_variables_through_the_command_are_one_line():
    proc = _cli({**PT_2POD_NPROC8_WORKER, "WORLD_SIZE": "2"}, "train.py")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "error: WORLD_SIZE=2 disagrees with PET_NNODES=2 x PET_NPROC_PER_NODE=8 = 16 processes, as Kubeflow's "
        "training operator sets them; fix or unset WORLD_SIZE"]


# --- the manifests in docs/clusters.md ------------------------------------------------------------------------
def operator_env(job: dict, rtype: str, index: int, pod_ip: str) -> dict[str, str]:
    """The variables the training operator (v1.7.0+, the commits above) gives the pod ``rtype``-``index`` of
    ``job``, as its envvar.go computes them, with the kubelet's expansion of $(POD_IP_DUMMY)."""
    name = job["metadata"]["name"]
    if job["kind"] == "PyTorchJob":
        specs = job["spec"]["pytorchReplicaSpecs"]
        pods = sum(s.get("replicas", 1) for s in specs.values())
        nproc = str(job["spec"].get("nprocPerNode", "auto"))
        port = _port(specs["Master"], "pytorch", "pytorchjob-port", 23456)
        rank = index + 1 if rtype == "Worker" else index
        return {"PYTHONUNBUFFERED": "1", "MASTER_PORT": str(port), "PET_MASTER_PORT": str(port),
                "MASTER_ADDR": f"{name}-master-0", "PET_MASTER_ADDR": f"{name}-master-0",
                "WORLD_SIZE": str(pods * (int(nproc) if nproc.isdigit() else 1)), "RANK": str(rank),
                "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": nproc, "PET_NNODES": str(pods)}
    specs = job["spec"]["paddleReplicaSpecs"]
    assert "Master" not in specs, "the docs' PaddleJob is collective: Worker replicas only"
    port = _port(specs["Worker"], "paddle", "master", 36543)
    env = {"PYTHONUNBUFFERED": "1", "PADDLE_JOB_ID": name,
           "PADDLE_NNODES": str(sum(s.get("replicas", 1) for s in specs.values()))}
    if index == 0:
        env.update(POD_IP_DUMMY=pod_ip, PADDLE_MASTER=f"{pod_ip}:{port}")
    else:
        env["PADDLE_MASTER"] = f"{name}-worker-0:{port}"
    return env


def _port(spec: dict, container: str, port_name: str, default: int) -> int:
    for c in spec["template"]["spec"]["containers"]:
        if c["name"] == container:
            for p in c.get("ports", []):
                if p.get("name") == port_name:
                    return int(p["containerPort"])
    return default


def test_operator_model_reproduces_the_golden_sets():
    """The model used for the docs' manifests gives exactly the literal sets above for the same specs."""
    def job(kind, nproc, workers):
        container = {"name": "pytorch" if kind == "PyTorchJob" else "paddle"}
        template = {"template": {"spec": {"containers": [container]}}}
        if kind == "PyTorchJob":
            spec = {"pytorchReplicaSpecs": {"Master": {"replicas": 1, **template}}}
            if workers:
                spec["pytorchReplicaSpecs"]["Worker"] = {"replicas": workers, **template}
            if nproc:
                spec["nprocPerNode"] = nproc
        else:
            spec = {"paddleReplicaSpecs": {"Worker": {"replicas": workers, **template}}}
        return {"kind": kind, "metadata": {"name": "yolo"}, "spec": spec}

    assert operator_env(job("PyTorchJob", "1", 0), "Master", 0, "") == PT_1POD_NPROC1_MASTER
    assert operator_env(job("PyTorchJob", "8", 1), "Master", 0, "") == PT_2POD_NPROC8_MASTER
    assert operator_env(job("PyTorchJob", "8", 1), "Worker", 0, "") == PT_2POD_NPROC8_WORKER
    assert operator_env(job("PyTorchJob", None, 1), "Worker", 0, "") == PT_2POD_AUTO_WORKER
    assert operator_env(job("PaddleJob", None, 1), "Worker", 0, "10.0.0.2") == PD_1POD_WORKER0
    assert operator_env(job("PaddleJob", None, 2), "Worker", 0, "10.0.0.2") == PD_2POD_WORKER0
    assert operator_env(job("PaddleJob", None, 2), "Worker", 1, "10.0.0.3") == PD_2POD_WORKER1


def _doc_manifests() -> dict[str, dict]:
    text = (REPO / "docs" / "clusters.md").read_text()
    found = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    return {m["kind"]: m for m in found if isinstance(m, dict) and m.get("apiVersion") == "kubeflow.org/v1"}


@pytest.mark.parametrize("kind", ["PyTorchJob", "PaddleJob"])
def test_docs_manifest_pods_plan_one_run(kind):
    job = _doc_manifests()[kind]
    name = job["metadata"]["name"]
    specs = job["spec"]["pytorchReplicaSpecs" if kind == "PyTorchJob" else "paddleReplicaSpecs"]
    pods = [(rtype, i) for rtype in ("Master", "Worker") if rtype in specs for i in range(specs[rtype]["replicas"])]
    assert len(pods) == 2
    plans = []
    for n, (rtype, i) in enumerate(pods):
        ip = DNS[f"{name}-{rtype.lower()}-{i}"]
        environ = pod(operator_env(job, rtype, i, ip), f"{name}-{rtype.lower()}-{i}")
        container = specs[rtype]["template"]["spec"]["containers"][0]
        argv = container["command"] + container.get("args", [])
        assert argv[:2] == ["ppmulti", "launch"], argv
        plans.append(plan_in(environ, argv[2:], (ip,), gpus=8))
        assert "gpu" in str(container["resources"]["limits"])
    assert [(p.nnodes, p.node_rank, p.nproc_per_node, p.device) for p in plans] == [(2, 0, 8, "gpu"), (2, 1, 8, "gpu")]
    assert len({(p.master_addr, p.master_port, p.job_id) for p in plans}) == 1
    assert plans[0].master_addr == plans[0].host    # node 0 serves the rendezvous on its own address


# --- two "pods" on this machine, each given only its operator's variables ------------------------------------
@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("kind", ["pytorchjob_v1.7", "paddlejob"])
def test_two_pods_with_only_the_operators_variables_train_as_one_world(kind, tmp_path):
    """PET_ variables with WORLD_SIZE a process count (2 pods x 1), or a PaddleJob's; a shared rendezvous token as
    a Kubernetes Secret would give it. One world of 2 all-reduces."""
    import json

    from launching import ALLREDUCE, Launches, free_ports, launch_env

    out, port = tmp_path / "out", free_ports(2)
    if kind == "paddlejob":
        pods = [{"PADDLE_JOB_ID": "yolo", "PADDLE_NNODES": "2", "POD_IP_DUMMY": "127.0.0.1",
                 "PADDLE_MASTER": f"127.0.0.1:{port}", "HOSTNAME": "yolo-worker-0"},
                {"PADDLE_JOB_ID": "yolo", "PADDLE_NNODES": "2", "PADDLE_MASTER": f"localhost:{port}",
                 "HOSTNAME": "yolo-worker-1"}]
    else:
        pods = [{"PET_NNODES": "2", "PET_NODE_RANK": str(r), "RANK": str(r), "PET_NPROC_PER_NODE": "1",
                 "WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "PET_MASTER_ADDR": "localhost",
                 "MASTER_PORT": str(port), "PET_MASTER_PORT": str(port), "HOSTNAME": f"yolo-pod-{r}"}
                for r in range(2)]
    launches = Launches(tmp_path)
    try:
        procs = [launches.start("--log_dir", str(tmp_path / f"log{r}"), ALLREDUCE, str(out),
                                env=launch_env(PYTHONUNBUFFERED="1", PPMULTI_RDZV_TOKEN="a-secret-for-both-pods",
                                               **pods[r]))
                 for r in range(2)]
        codes = [launches.wait(p, timeout=300) for p in procs]
        assert codes == [0, 0], [launches.output(p)[-2000:] for p in procs]
        assert all("a-secret-for-both-pods" not in launches.output(p) for p in procs)
    finally:
        launches.close()
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world_size"], r["sum"]) for r in records] == [(0, 2, 1.0), (1, 2, 1.0)]
