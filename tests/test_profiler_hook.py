"""PaddleDetection's --profiler_options (-o profiler_options=...): its option string, and paddle.profiler over the
steps it names on a toy run: a Chrome trace, the summary on stderr, the training stopped after the range."""

import json

import pytest
from toys import Recorder, toy_trainer

from ppmulti.common.errors import UserError
from ppmulti.rank.engine.hooks.profiler import ProfilerHook, ProfilerOptions, parse_options, trace_path


def test_the_option_string_is_read_as_paddledetection_documents_it():
    assert parse_options("") == ProfilerOptions()
    opts = parse_options("batch_range=[2, 5]; state=CPU; sorted_key=ave; tracer_option=OpDetail; "
                         "profile_path=out/p.json; exit_on_finished=false")
    assert opts == ProfilerOptions((2, 5), "CPU", "ave", "OpDetail", "out/p.json", False)
    for bad, says in (("batch_range=[5,2]", "need 0 <= START < END"), ("batch_range=ten", r"\[START,END\]"),
                      ("state=TPU", "use one of CPU, GPU, All"), ("sorted_key=calls", "sorts its summary by time"),
                      ("colour=red", "unknown key 'colour'"), ("batch_range", "key=value pairs")):
        with pytest.raises(UserError, match=says):
            parse_options(bad)


def test_each_rank_writes_its_own_trace(tmp_path):
    opts = ProfilerOptions()
    assert trace_path(opts, tmp_path, 0) == tmp_path / "profile.json"
    assert trace_path(ProfilerOptions(profile_path=str(tmp_path / "p.json")), None, 1) == tmp_path / "p.rank1.json"


def test_profiler_options_record_the_range_and_stop_the_training(tmp_path, capsys):
    steps_seen = Recorder()
    hook = ProfilerHook(parse_options("batch_range=[1,3];state=All;tracer_option=OpDetail"))
    trainer = toy_trainer(epochs=3, steps=4, hooks=[hook, steps_seen], run_dir=tmp_path)
    trainer.train()
    trace = json.loads((tmp_path / "profile.json").read_text())
    assert trace["traceEvents"], "an empty trace"
    assert any(e.get("name", "").startswith("matmul") for e in trace["traceEvents"]), "no operator in the trace"
    # exit_on_finished (the default): the run stops after step 3 of its first epoch, as PaddleDetection's exits
    assert [c for c in steps_seen.calls if c[0] == "after_step"] == [("after_step", 0, s) for s in range(3)]
    out, err = capsys.readouterr()
    assert "Operator Summary" in err and "Operator Summary" not in out   # stdout keeps the run's JSON line


def test_a_run_shorter_than_the_range_ends_cleanly(tmp_path):
    hook = ProfilerHook(parse_options("batch_range=[10,20]"))
    toy_trainer(epochs=1, steps=2, hooks=[hook], run_dir=tmp_path).train()
    assert hook._prof is None
