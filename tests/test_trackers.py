"""--logger: its spellings and refusals, the missing-package line, and one real training logged to VisualDL,
TensorBoard and a real MLflow tracking server on loopback, read back through each one's own reader."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import DEMO_CONFIG, REPO, clean_env, require_system

PASSWORD = "pw-9c4e1f7b2d"   # in the tracking URI: no output and no file of the run may hold it


@pytest.mark.parametrize("given,expected", [
    (None, None),                                              # not given: VisualDL unless use_vdl is false
    (["visualdl"], ("visualdl",)),
    (["tb"], ("tensorboard",)),                                # YOLOv5's spelling
    (["mlflow,TensorBoard"], ("tensorboard", "mlflow")),       # comma-separated, any case, fixed order
    (["vdl", "mlflow", "tensorboard"], ("visualdl", "tensorboard", "mlflow")),
    (["csv,tb"], ("tensorboard",)),                            # YOLOv5's csv: results.csv is always written
    (["none"], ()),
])
def test_logger_spellings(given, expected):
    from ppmulti.common import trackers

    assert trackers.parse(given) == expected


@pytest.mark.parametrize("given,needle", [
    (["wandb"], "--logger wandb: ppmulti does not log to Weights & Biases"),
    (["tensorbored"], "--logger tensorbored: unknown tracker"),
    (["none,tb"], "give it alone"),
    ([","], "give one or more of visualdl, tensorboard, mlflow"),
])
def test_logger_refusals_name_the_flag(given, needle):
    from ppmulti.common import trackers
    from ppmulti.common.errors import UserError

    with pytest.raises(UserError, match="--logger") as err:
        trackers.parse(given)
    assert needle in str(err.value)


def test_logger_flag_reaches_the_options(tmp_path):
    from ppmulti.common import train_flags
    from ppmulti.rank import entry

    args = train_flags.parse(["-c", str(DEMO_CONFIG), "--logger", "tb", "--logger", "mlflow,visualdl"])
    assert args.logger == ["tb", "mlflow,visualdl"]
    assert entry.resolve(args).loggers == ("visualdl", "tensorboard", "mlflow")
    assert entry.resolve(train_flags.parse(["-c", str(DEMO_CONFIG)])).loggers is None


@pytest.mark.parametrize("module,line", [
    ("mlflow", 'error: --logger mlflow: MLflow is not installed; pip install "ppmulti[mlflow]"'),
    ("tensorboard", 'error: --logger tensorboard: TensorBoard is not installed; pip install "ppmulti[tensorboard]"'),
])
def test_a_missing_tracker_package_is_one_line_before_training(tmp_path, monkeypatch, capsys, module, line):
    from ppmulti.procs import train_command

    monkeypatch.setitem(sys.modules, module, None)   # what an environment without the package finds
    monkeypatch.chdir(tmp_path)
    code = train_command.main(["-c", str(DEMO_CONFIG), "--logger", f"visualdl,{module}", "--device", "cpu",
                               "--output", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 2 and err.strip() == line and "Traceback" not in err
    assert not (tmp_path / "run").exists()   # nothing was built


def test_tracking_uri_is_printed_without_credentials():
    from ppmulti.common.trackers import display_uri

    assert display_uri("http://alice:s3cr3t@mlflow.example:5000/x") == "http://***@mlflow.example:5000/x"
    assert display_uri("https://tok3n@host") == "https://***@host"
    assert display_uri("postgresql://u:p@db/mlflow?sslmode=require&password=x") == "postgresql://***@db/mlflow?***"
    assert display_uri("sqlite:////srv/mlflow.db") == "sqlite:////srv/mlflow.db"


# ----------------------------------------------------------------------------- a real training, real trackers
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(root: Path):
    """``mlflow server`` started on 127.0.0.1 and a free port, SQLite and artifacts under ``root``; yields
    (its URL, a function that waits until /health answers); the server's process group is stopped on the way out."""
    port = _free_port()
    log = open(root / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                             "--artifacts-destination", str(root / "artifacts"), "--workers", "1"],
                            cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            # no job runner: it needs none here, and its queue is a /dev/shm directory that MLflow's
                            # server leaves behind when it stops
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # loopback: never through a proxy

    def healthy() -> None:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
            try:
                with opener.open(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            assert time.time() < deadline, (root / "server.log").read_text()[-3000:]
            time.sleep(0.3)

    try:
        yield f"http://127.0.0.1:{port}", healthy
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _tensorboard(run: Path) -> tuple[dict, list, dict]:
    """(scalars {tag: {step: value}}, image tags, hparams) of the run's event files, read by TensorBoard's reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = {t: {e.step: e.value for e in acc.Scalars(t)} for t in tags["scalars"]}
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    hparams = {k: v.number_value if v.HasField("number_value") else v.string_value for k, v in start.hparams.items()}
    return scalars, sorted(tags["images"]), hparams


def _visualdl(logdir: Path) -> dict:
    from visualdl import LogReader

    out: dict = {}
    for name in os.listdir(logdir):
        reader = LogReader(file_path=str(logdir / name))
        for tag in reader.get_tags().get("scalar", []):
            out.setdefault(tag, {}).update({r.id: r.value for r in reader.get_data("scalar", tag)})
    return out


@pytest.mark.slow
def test_one_training_logs_the_same_to_visualdl_tensorboard_and_an_mlflow_server(small_demo, tmp_path):
    pytest.importorskip("tensorboard", reason='pip install "ppmulti[tensorboard]"')
    if subprocess.run([sys.executable, "-c", "import mlflow"], capture_output=True).returncode:
        require_system("mlflow is not installed", 'pip install "ppmulti[mlflow]"')
    import yaml
    from mlflow.tracking import MlflowClient

    (tmp_path / "server").mkdir()
    with mlflow_server(tmp_path / "server") as (url, healthy):
        uri = url.replace("http://", f"http://alice:{PASSWORD}@")   # credentials a user may put in the URI
        env = {**clean_env(), "MLFLOW_TRACKING_URI": uri}
        # started beside the server: the training reaches the server after its imports and build (MLflow's client
        # retries a refused connection meanwhile)
        train = subprocess.Popen(
            [sys.executable, str(REPO / "tools/train.py"), "--data", str(small_demo / "data.yaml"), "--cfg", "yolov5n",
             "--weights", "", "--img", "64", "--epochs", "1", "--batch", "8", "--device", "cpu", "--workers", "0",
             "--hyp", str(REPO / "configs/hyps/hyp.demo.yaml"), "--project", "runs", "--name", "exp",
             "--logger", "visualdl,tensorboard,mlflow"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            healthy()
            stdout, stderr = train.communicate(timeout=600)
        finally:
            if train.poll() is None:
                train.kill()
                train.communicate()
        assert train.returncode == 0, stdout[-3000:] + stderr[-3000:]
        run = tmp_path / "runs" / "exp"
        client = MlflowClient(tracking_uri=url)
        experiment = client.get_experiment_by_name("runs")             # --project
        (found,) = client.search_runs([experiment.experiment_id])
        artifacts = {a.path for a in client.list_artifacts(found.info.run_id)}
        history = {key: {m.step: m.value for m in client.get_metric_history(found.info.run_id, key)}
                   for key in found.data.metrics}

    output = stdout + stderr
    assert PASSWORD not in output and "alice" not in output
    assert f"MLflow: run exp ({found.info.run_id}) in experiment 'runs' at http://***@127.0.0.1:" in output
    assert "TensorBoard: tensorboard --logdir runs" in output
    for path in run.rglob("*"):
        assert not path.is_file() or PASSWORD.encode() not in path.read_bytes(), path

    metrics = json.loads((run / "metrics.json").read_text())
    hyp = yaml.safe_load((REPO / "configs/hyps/hyp.demo.yaml").read_text())
    # MLflow: the run named after --name, finished, with the options, the hyp values and every scalar
    assert found.info.run_name == "exp" and found.info.status == "FINISHED"
    params = found.data.params
    assert params["opt/epochs"] == "1" and params["opt/imgsz"] == "64" and params["opt/logger"].startswith("visualdl")
    assert params["world_size"] == "1" and float(params["hyp/lr0"]) == hyp["lr0"]
    assert history["eval/mAP50"] == {1: pytest.approx(metrics["mAP50"], abs=1e-6)}
    assert {"results.png", "PR_curve.png", "results.csv", "opt.yaml", "config.yml"} <= artifacts
    assert {p.name for p in run.glob("*.png")} | {p.name for p in run.glob("*.jpg")} <= artifacts

    # TensorBoard: event files in the run directory itself (YOLOv5's layout), the same scalars, pictures, hparams
    tb, images, hparams = _tensorboard(run)
    vdl = _visualdl(run / "vdl")
    assert set(tb) == set(vdl) == set(history) and {"eval/mAP50", "epoch/loss", "epoch/lr"} <= set(tb)
    for tag, series in history.items():
        assert tb[tag] == pytest.approx(series, rel=1e-6) and vdl[tag] == pytest.approx(series, rel=1e-6), tag
    assert {"results", "PR_curve"} <= set(images)
    assert images == sorted(p.stem for p in [*run.glob("*.png"), *run.glob("*.jpg")])
    assert hparams["hyp/lr0"] == pytest.approx(hyp["lr0"]) and hparams["opt/epochs"] == 1


# ----------------------------------------------------------------------------- toy runs (engine parts, no ppdet)
@pytest.mark.slow
def test_logger_wins_over_use_vdl_and_tensorboard_writes_into_the_run_directory(tmp_path):
    from toys import toy_trainer

    from ppmulti.rank.engine.hooks import TrackersHook

    for name, loggers in (("default", None), ("tb", ("tensorboard",)), ("both", ("visualdl", "tensorboard"))):
        run = tmp_path / name
        toy_trainer(epochs=2, steps=2, run_dir=run, hooks=[TrackersHook()], cfg={"use_vdl": False},
                    loggers=loggers).train()
        assert (run / "vdl").exists() == (name == "both"), name
        assert bool(list(run.glob("events.out.tfevents.*"))) == (name != "default"), name
    scalars, _, hparams = _tensorboard(tmp_path / "tb")
    assert set(scalars["epoch/lr"]) == {1, 2} and set(scalars["train/loss"]) == {2, 4}   # log_iter 2, 2 steps
    assert hparams["opt/config"] == "toy.yml" and hparams["world_size"] == 1
    assert set(_visualdl(tmp_path / "both" / "vdl")) == set(_tensorboard(tmp_path / "both")[0])


@pytest.mark.slow
def test_a_resumed_run_continues_its_mlflow_run_and_a_failed_one_says_so(tmp_path, monkeypatch, caplog):
    pytest.importorskip("mlflow", reason='pip install "ppmulti[mlflow]"')
    from mlflow.tracking import MlflowClient
    from toys import toy_trainer

    from ppmulti.rank.engine.hooks import CheckpointHook, Hook, ResumeHook, TrackersHook
    from ppmulti.rank.engine.trainer import RunPlan

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "proj" / "exp"
    toy_trainer(epochs=2, steps=2, run_dir=run, hooks=[CheckpointHook(), TrackersHook()], loggers=("mlflow",)).train()
    toy_trainer(epochs=3, steps=2, run_dir=run, loggers=("mlflow",), resume=str(run), hooks=[
        ResumeHook(RunPlan(config="toy.yml", resume=str(run))), CheckpointHook(), TrackersHook()]).train()

    class Boom(Hook):
        def after_epoch(self, trainer, stats):
            raise RuntimeError("a failure in the middle of training")

    with pytest.raises(RuntimeError):
        toy_trainer(epochs=2, steps=2, run_dir=tmp_path / "proj" / "exp2", hooks=[TrackersHook(), Boom()],
                    loggers=("mlflow",)).train()
    client = MlflowClient(tracking_uri=uri)

    class DeleteRun(Hook):   # the MLflow run deleted from the server after epoch 1: the training goes on
        priority = 85

        def after_epoch(self, trainer, stats):
            if stats.epoch == 0:
                hook = next(h for h in trainer.hooks if isinstance(h, TrackersHook))
                client.delete_run(hook.mlflow_run_id)

    caplog.clear()   # the runs above logged their INFO lines where an earlier test left ppmulti's logger at INFO
    with caplog.at_level(logging.WARNING, logger="ppmulti"):
        gone = toy_trainer(epochs=2, steps=2, run_dir=tmp_path / "proj" / "exp3", loggers=("mlflow",),
                           hooks=[TrackersHook(), DeleteRun()])
        gone.train()
    assert gone.state.epoch == 2
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.getMessage().startswith("MLflow:")]
    assert len(warnings) == 1 and "MLflow: flush failed (MlflowException: " in warnings[0], warnings
    assert "the rest of the run is not logged there" in warnings[0]

    experiment = client.get_experiment_by_name("proj")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert sorted(runs) == ["exp", "exp2"]                       # the resume added no run of its own (exp3: deleted)
    resumed = runs["exp"]
    assert resumed.info.status == "FINISHED" and runs["exp2"].info.status == "FAILED"
    assert set(m.step for m in client.get_metric_history(resumed.info.run_id, "epoch/lr")) == {1, 2, 3}
    assert resumed.data.params["opt/resume"] == str(run)          # a key the resume brought is added
    assert resumed.data.params["opt/config"] == "toy.yml"
