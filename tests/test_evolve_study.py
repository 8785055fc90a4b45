"""Evolution's Optuna study: YOLOv5's mutation as a sampler (held against evolve.breed), the study per project,
storage URLs (bad ones, missing drivers, passwords never shown), the samplers offered."""

from __future__ import annotations

import threading

import numpy as np
import optuna
import pytest

from ppmulti.common.errors import UserError
from ppmulti.procs.runs import evolve
from ppmulti.procs.runs import evolve_study as S
from ppmulti.procs.runs.evolve_run import mutated_bounds

BASE = {"lr0": 0.01, "lrf": 0.01, "momentum": 0.937, "weight_decay": 0.0005, "box": 0.05, "cls": 0.5,
        "hsv_h": 0.015, "mosaic": 1.0, "iou_t": 0.2, "fliplr": 0.5}


def _study(seed=0, name="s", sampler=None):
    storage = S.open_storage("sqlite:///:memory:", heartbeat=60)   # the engine's own storage, in memory: fast
    sampler = sampler or S.YOLOv5Sampler(BASE, mutated_bounds(), seed)
    return storage, S.open_study(storage, name, sampler, BASE, "test")


def _finish(study, hyps_and_maps):
    """Finished trials as the engine tells them: params = hyps, value = fitness, mAPs as user attributes."""
    dists = S.distributions(BASE, mutated_bounds())
    for hyp, (m50, m5095) in hyps_and_maps:
        study.add_trial(optuna.trial.create_trial(
            params=hyp, distributions=dists, value=evolve.fitness({"mAP50": m50, "mAP50_95": m5095}),
            user_attrs={"mAP50": m50, "mAP50_95": m5095}))


def _ask(study, storage):
    trial = S.next_trial(study, storage, 100, threading.Event(), 0.1)
    hyp = {k: trial.suggest_float(k, d.low, d.high) for k, d in S.distributions(BASE, mutated_bounds()).items()}
    return trial, hyp


def test_trial_0_is_the_base_hyp_even_when_another_process_finished_first():
    """Trial 0 made, then trial 1 (another process's) made and finished before trial 0 draws its hyps: trial 0 still
    trains the --hyp as given (CI saw trial 0 bred once three processes raced)."""
    storage, study = _study(seed=3)
    trial0 = storage.get_trial(storage.create_new_trial(study._study_id))
    _finish(study, [({**BASE, "lr0": 0.02}, (0.5, 0.3))])
    sampler = S.YOLOv5Sampler(BASE, mutated_bounds(), 3)
    space = sampler.infer_relative_search_space(study, trial0)
    assert trial0.number == 0 and sampler.sample_relative(study, trial0, space) == {k: BASE[k] for k in space}


def test_first_trial_is_the_base_hyp_then_yolov5_mutation_draws_as_breed():
    storage, study = _study(seed=7)
    first, hyp = _ask(study, storage)
    assert first.number == 0 and hyp == BASE     # YOLOv5 trains the --hyp as given first
    study.tell(first, state=optuna.trial.TrialState.FAIL)
    bounds = mutated_bounds()
    rng = np.random.RandomState(1)
    finished = [({**BASE, **{k: v for k, v in evolve.mutate(BASE, rng, bounds).items()}}, (0.1 * i, 0.05 * i))
                for i in range(8)]
    _finish(study, finished)
    rows = [evolve.make_row({"mAP50": m[0], "mAP50_95": m[1]}, h) for h, m in finished]
    for _ in range(3):
        trial, hyp = _ask(study, storage)
        parent, child = evolve.breed(rows, BASE, np.random.RandomState([7, trial.number]), bounds)
        assert hyp == child                       # the sampler's draws are breed's, from (seed, trial number)
        frozen = storage.get_trial(trial._trial_id)
        assert frozen.system_attrs[S.PARENT_ATTR] == parent
        assert parent in [h for h, _ in sorted(finished, key=lambda f: -evolve.fitness(
            {"mAP50": f[1][0], "mAP50_95": f[1][1]}))[:5]]   # a parent among the best 5
        assert hyp["iou_t"] == BASE["iou_t"] and hyp["fliplr"] == BASE["fliplr"]   # gain 0: never mutated
        study.tell(trial, state=optuna.trial.TrialState.FAIL)


def test_candidate_k_is_reproducible_from_seed_and_k():
    drawn = []
    storage = S.open_storage("sqlite:///:memory:")
    for seed, name in ((3, "a"), (3, "b"), (4, "c")):
        study = S.open_study(storage, name, S.YOLOv5Sampler(BASE, mutated_bounds(), seed), BASE, "test")
        _finish(study, [({**BASE, "lr0": 0.02}, (0.5, 0.3)), ({**BASE, "box": 0.1}, (0.4, 0.2))])
        _ask(study, storage)                      # trial 0: the base hyps
        drawn.append(_ask(study, storage)[1])
    assert drawn[0] == drawn[1] and drawn[0] != drawn[2]


def test_study_of_other_hyps_is_refused_and_same_one_resumes():
    storage, study = _study()
    _ask(study, storage)
    again = S.open_study(storage, "s", None, BASE, "here")
    assert again._study_id == study._study_id and len(again.trials) == 1   # resumed
    with pytest.raises(UserError, match="evolves other hyperparameters") as exc:
        S.open_study(storage, "s", None, {"lr0": 0.01}, "here")
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("url, needle", [
    ("nonsense", "not a database URL"),
    ("mysql://u:pw-secret-123@127.0.0.1:9/db", "driver is not installed"),
    ("postgresql://u:pw-secret-123@127.0.0.1:9/db", "cannot use the database"),
])
def test_bad_storage_is_one_line_without_the_password(url, needle):
    with pytest.raises(UserError, match=needle) as exc:
        S.open_storage(url)
    text = str(exc.value)
    assert "\n" not in text and "pw-secret-123" not in text
    if "://" in url:
        assert "u:***@127.0.0.1" in text


def test_shown_hides_the_password():
    assert S.shown("postgresql://evo:s3cret-pw@db.lan:5432/optuna") == "postgresql://evo:***@db.lan:5432/optuna"
    assert S.shown("sqlite:////tmp/x/evolve.db") == "sqlite:////tmp/x/evolve.db"
    assert S.password("postgresql://evo@db.lan/optuna") is None
    assert S.with_driver("sqlite:///x.db") == "sqlite:///x.db"
    assert S.with_driver("postgresql://evo:pw@db/o").startswith("postgresql+psycopg")   # the driver installed


def test_tpe_sampler_asks_within_the_bounds():
    storage, study = _study(sampler=S.make_sampler("tpe", BASE, mutated_bounds(), 0))
    assert _ask(study, storage)[1] == BASE        # other samplers: the base hyps queued first
    _, hyp = _ask(study, storage)
    assert hyp != BASE and hyp["iou_t"] == BASE["iou_t"]
    for k, (_, lo, hi) in mutated_bounds().items():
        if k in BASE:
            assert min(lo, BASE[k]) <= hyp[k] <= max(hi, BASE[k])


def test_cmaes_sampler_asks_within_the_bounds():
    storage, study = _study(sampler=S.make_sampler("cmaes", BASE, mutated_bounds(), 0))
    assert _ask(study, storage)[1] == BASE        # the base hyps queued first, as for tpe
    for i in range(4):                            # CMA-ES proposes jointly once a trial has finished
        trial, hyp = _ask(study, storage)
        study.tell(trial, 0.1 * i)
        for k, (_, lo, hi) in mutated_bounds().items():
            if k in BASE:
                assert min(lo, BASE[k]) <= hyp[k] <= max(hi, BASE[k])


def test_a_new_study_starts_from_an_evolve_csv_written_before_it(tmp_path):
    from optuna.trial import TrialState

    csv = tmp_path / "evolve.csv"     # as ppmulti's file-based evolution wrote it
    csv.write_text("fitness,mAP50,mAP50_95," + ",".join(BASE) + "\n"
                   + "".join(",".join(map(repr, [evolve.fitness({"mAP50": m, "mAP50_95": m / 2}), m, m / 2,
                                                 *{**BASE, "lr0": m}.values()])) + "\n" for m in (0.02, 0.05)))
    rows = evolve.EvolveStore(csv).rows()
    storage = S.open_storage("sqlite:///:memory:")
    study = S.open_study(storage, "s", S.YOLOv5Sampler(BASE, mutated_bounds(), 0), BASE, "test", rows,
                         mutated_bounds())
    assert [(t.state, t.params["lr0"]) for t in study.trials] == [(TrialState.COMPLETE, 0.02),
                                                                   (TrialState.COMPLETE, 0.05)]
    assert S.study_rows(study, list(BASE)) == rows
    trial, _ = _ask(study, storage)
    assert trial.number == 2 and storage.get_trial(trial._trial_id).system_attrs[S.PARENT_ATTR]["lr0"] in (0.02, 0.05)
    with pytest.raises(UserError, match="evolve.csv already in --project evolves other hyperparameters"):
        S.open_study(storage, "t", None, {"lr0": 0.01}, "test", rows, mutated_bounds())
    assert "t" not in [s.study_name for s in optuna.get_all_study_summaries(storage)]


def test_storage_without_evolve_is_one_line(capsys):
    from ppmulti.procs.train_command import main

    assert main(["--data", "coco128.yaml", "--storage", "sqlite:///evolve.db"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--storage" in err and "--evolve N" in err
