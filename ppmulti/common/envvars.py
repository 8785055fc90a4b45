"""Every environment variable ppmulti reads or writes, in one table, and small pure readers of them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, MutableMapping

# --- What Paddle's launcher gives each worker (paddle/distributed/launch/controllers/collective.py) ---
PADDLE_TRAINER_ID = "PADDLE_TRAINER_ID"                # global rank; also overrides the launcher's --rank
PADDLE_TRAINERS_NUM = "PADDLE_TRAINERS_NUM"            # world size
PADDLE_TRAINER_ENDPOINTS = "PADDLE_TRAINER_ENDPOINTS"  # ip:port of every rank; forces master mode if inherited
PADDLE_CURRENT_ENDPOINT = "PADDLE_CURRENT_ENDPOINT"
PADDLE_GLOBAL_RANK = "PADDLE_GLOBAL_RANK"
PADDLE_GLOBAL_SIZE = "PADDLE_GLOBAL_SIZE"
PADDLE_LOCAL_RANK = "PADDLE_LOCAL_RANK"
PADDLE_LOCAL_SIZE = "PADDLE_LOCAL_SIZE"
PADDLE_RANK_IN_NODE = "PADDLE_RANK_IN_NODE"
PADDLE_NNODES = "PADDLE_NNODES"
# The TCP store of rank 0: Paddle 2.6 gives it in master mode only, Paddle 3.x under --ips too (the first
# trainer endpoint, the same store master_endpoint() derives without it).
PADDLE_MASTER = "PADDLE_MASTER"
PADDLE_LOG_DIR = "PADDLE_LOG_DIR"
PADDLE_DISTRI_BACKEND = "PADDLE_DISTRI_BACKEND"        # "gloo" on CPU
PADDLE_BACKUP_ENV_PATH = "PADDLE_BACKUP_ENV_PATH"
FLAGS_SELECTED_GPUS = "FLAGS_selected_gpus"
FLAGS_SELECTED_CPUS = "FLAGS_selected_cpus"
COLLECTIVE_MASTER_IP = "COLLECTIVE_MASTER_IP"          # the launcher writes it into its own os.environ
POD_NAME = "POD_NAME"
# Paddle 3.x only: its --auto_cluster_config ("0"/"1"), given to every worker and read back as an override
# of that flag by a launcher that inherits it (context/args_envs.py), so it is launch state.
PADDLE_AUTO_CLUSTER = "PADDLE_AUTO_CLUSTER"
# Paddle 3.x's launcher moves the proxies out of its workers' way (context/args_envs.py fetch_envs) and keeps
# them here; Paddle 2.6 silently dropped them. Launch state: a nested launch must not treat them as the user's.
HTTP_PROXY_ORIGINAL = "http_proxy_original"
HTTPS_PROXY_ORIGINAL = "https_proxy_original"

# --- What Paddle's launcher reads as overrides of its flags (context/args_envs.py: env_args_mapping) ---
POD_IP = "POD_IP"                                      # overrides --host
PADDLE_START_PORT = "PADDLE_START_PORT"                # overrides --start_port
PADDLE_DEVICES = "PADDLE_DEVICES"
PADDLE_RANK = "PADDLE_RANK"
PADDLE_IPS = "PADDLE_IPS"
PADDLE_NPROC_PER_NODE = "PADDLE_NPROC_PER_NODE"
PADDLE_JOB_ID = "PADDLE_JOB_ID"
PADDLE_RUN_MODE = "PADDLE_RUN_MODE"
PADDLE_LOG_LEVEL = "PADDLE_LOG_LEVEL"
PADDLE_LOG_OVERWRITE = "PADDLE_LOG_OVERWRITE"
PADDLE_SORT_IP = "PADDLE_SORT_IP"
PADDLE_MAX_RESTART = "PADDLE_MAX_RESTART"
PADDLE_ELASTIC_LEVEL = "PADDLE_ELASTIC_LEVEL"
PADDLE_ELASTIC_TIMEOUT = "PADDLE_ELASTIC_TIMEOUT"
PADDLE_SERVER_NUM = "PADDLE_SERVER_NUM"
PADDLE_TRAINER_NUM = "PADDLE_TRAINER_NUM"
PADDLE_SERVERS_ENDPOINTS = "PADDLE_SERVERS_ENDPOINTS"
PADDLE_TRAINERS_ENDPOINTS = "PADDLE_TRAINERS_ENDPOINTS"
PADDLE_GLOO_PORT = "PADDLE_GLOO_PORT"
PADDLE_WITH_GLOO = "PADDLE_WITH_GLOO"
PADDLE_AUTO_PARALLEL_CONFIG = "PADDLE_AUTO_PARALLEL_CONFIG"

# --- Settings that are the user's to keep (tuning, not launch state) ---
PADDLE_PG_TIMEOUT = "PADDLE_PG_TIMEOUT"
PADDLE_XCCL_BACKEND = "PADDLE_XCCL_BACKEND"
PADDLE_ENV_LIMIT_LEN = "PADDLE_ENV_LIMIT_LEN"
PADDLE_SOT_SWITCH = "ENABLE_FALL_BACK"                  # Paddle 2.6's to_static SOT switch (paddle/jit/api.py)

# --- The socket interface gloo's and NCCL's transports use (ppmulti/procs/launch/netcheck.py sets them from the
# route to node 0 unless the user did) ---
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"

# --- Read by older launchers / users, ignored by Paddle 2.6's new launcher ---
FLAGS_START_PORT = "FLAGS_START_PORT"                  # the legacy fleetrun's --start_port
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
# --- CUDA settings ppmulti gives every GPU rank unless the user set them (see set_device_order) ---
CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"                # PCI_BUS_ID: GPU ids as nvidia-smi numbers them
CUBLAS_WORKSPACE_CONFIG = "CUBLAS_WORKSPACE_CONFIG"    # :4096:8 makes cuBLAS deterministic (--deterministic)
# --- Read by Paddle 3.x's launcher only (a user knob, kept: not launch state) ---
# In master mode its worker ports become FLAGS_FIXED_PORT + node_rank + i instead of random free ports
# (context/node.py get_free_ports), so two nodes on one host overlap by all but one port.
FLAGS_FIXED_PORT = "FLAGS_FIXED_PORT"
# Paddle 3.x prints a failed container's environment only when this is "true"/"1" (job/container.py).
FLAGS_PRINT_LAUNCHER_ENV = "FLAGS_print_launcher_env"

# --- torchrun's worker variables, which ppmulti's worker shim adds for scripts written for torch ---
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"

# --- What a cluster scheduler tells each node (read by ppmulti/procs/launch/cluster_env.py, never written) ---
# SLURM (srun's and sbatch's output environment). In an srun step the STEP_ variables describe the step, which
# may use fewer nodes than the job; the batch script and an salloc shell have no SLURM_STEP_ID.
SLURM_JOB_ID = "SLURM_JOB_ID"
SLURM_STEP_ID = "SLURM_STEP_ID"
SLURM_NNODES = "SLURM_NNODES"
SLURM_STEP_NUM_NODES = "SLURM_STEP_NUM_NODES"
SLURM_STEP_NUM_TASKS = "SLURM_STEP_NUM_TASKS"
SLURM_NODEID = "SLURM_NODEID"                          # this node's index in the step's node list
SLURM_JOB_NODELIST = "SLURM_JOB_NODELIST"              # compressed, e.g. n[1-2,5]
SLURM_STEP_NODELIST = "SLURM_STEP_NODELIST"
SLURMD_NODENAME = "SLURMD_NODENAME"                    # this node's name
SLURM_GPUS_ON_NODE = "SLURM_GPUS_ON_NODE"
# Kubeflow's training operator (pkg/controller.v1/{pytorch,paddlepaddle}/envvar.go). A PyTorchJob pod gets the
# torchrun names above (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK), read as node facts only outside a launcher's
# worker (no LOCAL_RANK, no Paddle ids); since v1.7.0 also torchrun's PET_ flag variables, with WORLD_SIZE then a
# count of processes (pods x nproc). A PaddleJob pod gets PADDLE_MASTER, PADDLE_NNODES and PADDLE_JOB_ID (above),
# and node 0's pod POD_IP_DUMMY (its own address, which its PADDLE_MASTER names).
PET_NNODES = "PET_NNODES"                              # pods, or MIN:MAX under an elasticPolicy
PET_NODE_RANK = "PET_NODE_RANK"
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"              # the job's nprocPerNode: a number or "auto"
PET_MASTER_ADDR = "PET_MASTER_ADDR"
PET_MASTER_PORT = "PET_MASTER_PORT"
PET_RDZV_ENDPOINT = "PET_RDZV_ENDPOINT"                # elasticPolicy only
POD_IP_DUMMY = "POD_IP_DUMMY"
HOSTNAME = "HOSTNAME"                                  # a pod's name (JOB-worker-N), set by the container runtime
# --- MLflow's, as its users set them (read by ppmulti/rank/engine/hooks/mlflow_log.py; the URI is never printed
# with its credentials) ---
MLFLOW_TRACKING_URI = "MLFLOW_TRACKING_URI"
MLFLOW_EXPERIMENT_NAME = "MLFLOW_EXPERIMENT_NAME"
# ppmulti's node rendezvous secret (ppmulti/procs/launch/rendezvous.py); never printed, never given to the ranks
PPMULTI_RDZV_TOKEN = "PPMULTI_RDZV_TOKEN"

# --- ppmulti's own ---
PPMULTI_NODE_RANK = "PPMULTI_NODE_RANK"
PPMULTI_READY_FILE = "PPMULTI_READY_FILE"              # worker.py creates it: the runner knows ranks started
# The RunPlan ppmulti launch resolved from the train script's flags (JSON, with those flags): every rank trains it
# instead of parsing argv again (ppmulti/rank/entry.py plan_from_environ)
PPMULTI_RUN_PLAN = "PPMULTI_RUN_PLAN"
# `ppmulti yolo train` / YOLO.train(): ultralytics' keys as resolved (JSON), carried in the RunPlan; rank 0 writes
# them as the run's args.yaml with its name and save_dir (ppmulti/rank/entry.py plan_of)
PPMULTI_ULTRA_ARGS = "PPMULTI_ULTRA_ARGS"
# `ppmulti yolo val|predict|export`: the mode and the keys of the line (JSON) that the tool it execs says its errors
# in (`conf=2`, not `--conf-thres 2`: ppmulti/common/errors.py as_typed)
PPMULTI_ULTRA_DIALECT = "PPMULTI_ULTRA_DIALECT"
# The ssh fan-out's tag on every process it starts on a node (launcher, Paddle, ranks): the node is cleaned
# up by finding it in /proc/*/environ. Deliberately not launch state: a launch nested in a rank keeps it.
PPMULTI_NODES_JOB = "PPMULTI_NODES_JOB"
PPMULTI_CPU_THREADS = "PPMULTI_CPU_THREADS"          # CPU threads per rank, overriding cores // local ranks
PPMULTI_CPU_CONV = "PPMULTI_CPU_CONV"                # CPU convs and SiLUs: "onednn" (default, rank/ops) or "paddle"
# --- CPU threads (ppmulti/rank/dist.py) ---
OMP_NUM_THREADS = "OMP_NUM_THREADS"    # paddle's import sets it to "1" when unset (paddle/base/__init__.py)
KMP_BLOCKTIME = "KMP_BLOCKTIME"        # Intel OpenMP: ms an idle thread spins before sleeping (default 200)
PPMULTI_BENCH_KEEP = "PPMULTI_BENCH_KEEP"  # ppmulti bench keeps its probes' logs and records (a temp dir)
# --- end CPU threads ---
# A launch's own directory, kept across its restarts: ranks mark themselves started / failed there, and
# rank 0 of a training records its run directory so that a restarted launch resumes the same run.
PPMULTI_LAUNCH_DIR = "PPMULTI_LAUNCH_DIR"
PPMULTI_RESTART = "PPMULTI_RESTART"                  # 0 on the first start, k on the k-th restart
# --- the hang watchdog (ppmulti/rank/heartbeat.py writes, ppmulti/procs/launch/watchdog.py reads) ---
PPMULTI_HEARTBEAT = "PPMULTI_HEARTBEAT"              # "0": ranks keep no progress record (ppmulti bench compares)
# RANK:PHASE:STEP:SECONDS (or :stop): that rank sleeps (or SIGSTOPs itself) entering PHASE at STEP (tests, demos)
PPMULTI_STALL = "PPMULTI_STALL"
# --- end hang watchdog ---
# --- console bars under a launch (ppmulti/rank/engine/progress.py) ---
# The terminal ppmulti launch's stdout is (its /dev/pts path), set only when it is one: rank 0's stdout is
# Paddle's workerlog file, so rank 0 draws its progress bars on this terminal instead. Launch state.
PPMULTI_CONSOLE_TTY = "PPMULTI_CONSOLE_TTY"
# --- end console bars ---
# "1": ppmulti launch shows all of Paddle's launcher output on the console (as --verbose does), and ranks print
# what ppmulti otherwise keeps in their log files only (pycocotools' notices). Set by --verbose for the ranks.
PPMULTI_VERBOSE = "PPMULTI_VERBOSE"
PYTHONPATH = "PYTHONPATH"
XDG_CACHE_HOME = "XDG_CACHE_HOME"                      # the user cache dir (ppmulti/common/shm.py)
PYTHONUNBUFFERED = "PYTHONUNBUFFERED"                  # node output is streamed line by line through ssh
# --- detached runs and evolution (ppmulti/procs/runs/detach.py, evolve_run.py) ---
PPMULTI_HOME = "PPMULTI_HOME"                        # where detached runs are recorded (default ~/.ppmulti)
# A detached run's tag on every process it starts (wrapper, launcher, Paddle, ranks, evolve candidates):
# Paddle puts each worker in its own session, so `ppmulti stop` finds them by this in /proc/*/environ.
PPMULTI_RUN_ID = "PPMULTI_RUN_ID"
# --- pretrained weights (ppmulti/common/download.py) ---
# A base URL that serves weight files by name: downloads of YOLOv5's release assets and of PaddleDetection's
# pretrain_weights URLs fetch MIRROR/<file name> instead (an offline cluster's own HTTP server).
PPMULTI_WEIGHTS_MIRROR = "PPMULTI_WEIGHTS_MIRROR"
# --- OpenCV's FFmpeg (ppmulti/rank/compat.py quiet_opencv, for detect's videos and streams) ---
# Its av_log level, read when a capture opens: -8 (quiet) keeps FFmpeg's own lines about an unreachable stream off
# stderr, where detect prints one line of its own instead.
OPENCV_FFMPEG_LOGLEVEL = "OPENCV_FFMPEG_LOGLEVEL"

# Everything a launcher or a worker leaves behind that would steer a *new* launch started from inside
# a worker (evolution, a re-exec): Paddle's launcher lets these override its flags or its mode.
_LAUNCH_STATE = frozenset({
    PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ENDPOINTS, PADDLE_CURRENT_ENDPOINT,
    PADDLE_GLOBAL_RANK, PADDLE_GLOBAL_SIZE, PADDLE_LOCAL_RANK, PADDLE_LOCAL_SIZE, PADDLE_RANK_IN_NODE,
    PADDLE_NNODES, PADDLE_MASTER, PADDLE_LOG_DIR, PADDLE_DISTRI_BACKEND, PADDLE_BACKUP_ENV_PATH,
    FLAGS_SELECTED_GPUS, FLAGS_SELECTED_CPUS, COLLECTIVE_MASTER_IP, POD_NAME, POD_IP,
    PADDLE_START_PORT, PADDLE_DEVICES, PADDLE_RANK, PADDLE_IPS, PADDLE_NPROC_PER_NODE, PADDLE_JOB_ID,
    PADDLE_RUN_MODE, PADDLE_LOG_LEVEL, PADDLE_LOG_OVERWRITE, PADDLE_SORT_IP, PADDLE_MAX_RESTART,
    PADDLE_ELASTIC_LEVEL, PADDLE_ELASTIC_TIMEOUT, PADDLE_SERVER_NUM, PADDLE_TRAINER_NUM,
    PADDLE_SERVERS_ENDPOINTS, PADDLE_TRAINERS_ENDPOINTS, PADDLE_GLOO_PORT, PADDLE_WITH_GLOO,
    PADDLE_AUTO_PARALLEL_CONFIG, PADDLE_AUTO_CLUSTER, HTTP_PROXY_ORIGINAL, HTTPS_PROXY_ORIGINAL,
    RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
    PPMULTI_NODE_RANK, PPMULTI_READY_FILE, PPMULTI_LAUNCH_DIR, PPMULTI_RESTART,
    PPMULTI_CONSOLE_TTY,
})
_PADDLE_PREFIX = "PADDLE_"
_USER_PADDLE_SETTINGS = frozenset({PADDLE_PG_TIMEOUT, PADDLE_XCCL_BACKEND, PADDLE_ENV_LIMIT_LEN})


@dataclass(frozen=True)
class WorkerInfo:
    """Where this process sits in a launch; a lone process is rank 0 of a world of 1."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_size: int = 1
    node_rank: int = 0
    nnodes: int = 1


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(environ.get(name, ""))
    except ValueError:
        return default


def worker_info(environ: Mapping[str, str] | None = None) -> WorkerInfo:
    """This worker's rank and sizes from Paddle's launcher variables (a single process when there are none)."""
    env = os.environ if environ is None else environ
    if not in_paddle_worker(env):
        return WorkerInfo()
    rank = _int(env, PADDLE_TRAINER_ID, _int(env, PADDLE_GLOBAL_RANK, 0))
    world = _int(env, PADDLE_TRAINERS_NUM, _int(env, PADDLE_GLOBAL_SIZE, 1))
    local_rank = _int(env, PADDLE_LOCAL_RANK, _int(env, PADDLE_RANK_IN_NODE, 0))
    local_size = _int(env, PADDLE_LOCAL_SIZE, 1)
    nnodes = _int(env, PADDLE_NNODES, max(1, world // max(1, local_size)))
    # Paddle lays ranks out node by node with the same count on each node (collective.py rank_offset)
    node_rank = _int(env, PPMULTI_NODE_RANK, rank // max(1, local_size))
    return WorkerInfo(rank=rank, world_size=world, local_rank=local_rank, local_size=local_size,
                      node_rank=node_rank, nnodes=nnodes)


@dataclass(frozen=True)
class LaunchRecord:
    """The launch this worker belongs to: its directory (None outside ``ppmulti launch``) and restart count."""

    directory: str | None = None
    restart: int = 0


def launch_record(environ: Mapping[str, str] | None = None) -> LaunchRecord:
    env = os.environ if environ is None else environ
    return LaunchRecord(env.get(PPMULTI_LAUNCH_DIR) or None, max(0, _int(env, PPMULTI_RESTART, 0)))


def in_paddle_worker(environ: Mapping[str, str] | None = None) -> bool:
    """True inside a process started by Paddle's launcher (it always sets the trainer id and count)."""
    env = os.environ if environ is None else environ
    return PADDLE_TRAINER_ID in env and PADDLE_TRAINERS_NUM in env


def master_endpoint(environ: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """Rank 0's TCP store as Paddle 2.6 and 3.x pick it: PADDLE_MASTER, else the first trainer endpoint
    (the same address: 3.x also sets PADDLE_MASTER under --ips, 2.6 only in master mode).

    (``init_parallel_env`` reads MASTER_ADDR/MASTER_PORT but its C++ store takes PADDLE_MASTER.)
    """
    env = os.environ if environ is None else environ
    for endpoint in (env.get(PADDLE_MASTER),
                     (env.get(PADDLE_TRAINER_ENDPOINTS) or "").split(",")[0]):
        if endpoint and ":" in endpoint:
            host, _, port = endpoint.rpartition(":")
            if port.isdigit():
                return host, int(port)
    return None


def torch_worker_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """torchrun's worker variables (RANK, LOCAL_RANK, WORLD_SIZE, ...) derived from Paddle's ones.

    MASTER_ADDR/MASTER_PORT name the store Paddle really uses (they never move it: Paddle's store
    reads PADDLE_MASTER), so a torch-style script that reads them sees the truth.
    """
    env = os.environ if environ is None else environ
    info = worker_info(env)
    out = {RANK: str(info.rank), LOCAL_RANK: str(info.local_rank), WORLD_SIZE: str(info.world_size),
           LOCAL_WORLD_SIZE: str(info.local_size), GROUP_RANK: str(info.node_rank)}
    master = master_endpoint(env)
    if master is not None:
        out[MASTER_ADDR], out[MASTER_PORT] = master[0], str(master[1])
    return out


def clean_launcher_env(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``environ`` without the launch state a previous launcher or worker left behind.

    Paddle 2.6's launcher lets an inherited PADDLE_TRAINER_ID override ``--rank``, an inherited
    PADDLE_TRAINER_ENDPOINTS force master mode, POD_IP override ``--host``, and so on; a launch started
    from inside a worker would silently join the wrong world. User tuning knobs (PADDLE_PG_TIMEOUT, ...)
    are kept.
    """
    return {k: v for k, v in environ.items()
            if k not in _LAUNCH_STATE
            and not (k.startswith(_PADDLE_PREFIX) and k not in _USER_PADDLE_SETTINGS)}


def set_device_order(environ: MutableMapping[str, str] | None = None) -> None:
    """GPU ids in nvidia-smi's order (CUDA's default puts the fastest GPU first), unless the user chose an order;
    CUDA reads it once, when it starts: set it before anything asks for the GPU count."""
    env = os.environ if environ is None else environ
    env.setdefault(CUDA_DEVICE_ORDER, "PCI_BUS_ID")


def set_visible_gpu(gpu_id: int, environ: MutableMapping[str, str] | None = None) -> None:
    """Make a lone process use GPU ``gpu_id``: Paddle's plain "gpu" device reads FLAGS_selected_gpus."""
    env = os.environ if environ is None else environ
    set_device_order(env)
    env[FLAGS_SELECTED_GPUS] = str(int(gpu_id))
