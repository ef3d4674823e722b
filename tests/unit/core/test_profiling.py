"""Profiler traces (core/profiling.py): the step range parsed and refused in one line (config field, the
environment `hvdazure run --profile` sets, the option itself), and the policy on simulated ranks
(tests/fakes/fake_backend.py, whose RecordingProfiler is a test double of a framework's profiler): only
rank 0 records, exactly the steps asked for, each step spanned from before its callbacks to after them, the
refusals on every rank before the first step, and nothing at all when no trace was asked for. The real
profilers on real ranks: tests/distributed/test_torch_loggers.py and test_tf_trainer.py."""

import json
import logging
import subprocess
from pathlib import Path

import pytest
from fakes.fake_backend import FakeTrainer, LinearProblem, RecordingProfiler, ThreadWorld

from hvdazure import Callback, TrainConfig
from hvdazure.cli import main
from hvdazure.core.config import ConfigError, parse_step_range
from hvdazure.core.profiling import PROFILE_ENV, ProfiledSteps, steps_to_profile, with_profile_from
from hvdazure.core.rank_logging import logger
from hvdazure.core.trainer import loop_of

PROBLEM = LinearProblem.make(num_samples=48, num_eval=12, dim=3, seed=1)  # 6 steps per epoch at 2 x 4


# --- the range ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "steps"), [("5-8", range(5, 9)), (5, range(5, 6)), ("5", range(5, 6)),
                                              (" 3 - 4 ", range(3, 5)), ("1-1", range(1, 2))])
def test_a_step_range_is_first_to_last_both_included_counted_from_1(value, steps):
    assert parse_step_range(value) == steps
    assert TrainConfig(profile_steps=value).profile_range == steps


@pytest.mark.parametrize(("value", "says"), [
    ("8-5", "'8-5' is backwards: give FIRST-LAST with FIRST <= LAST, e.g. '5-8'"),
    ("0-3", "'0-3': steps are counted from 1"),
    (0, "0: steps are counted from 1"),
    ("", "'' is not a step range: give FIRST-LAST (e.g. '5-8') or one step ('5')"),
    ("5-", "'5-' is not a step range"),
    ("-3", "'-3' is not a step range"),
    ("all", "'all' is not a step range"),
    ("1-2-3", "'1-2-3' is not a step range"),
])
def test_a_range_that_is_empty_backwards_or_not_one_is_a_one_line_config_error(value, says):
    with pytest.raises(ConfigError) as raised:
        TrainConfig(profile_steps=value)
    assert str(raised.value).startswith(f"config field 'profile_steps': {says}")
    assert "\n" not in str(raised.value)


def test_by_default_nothing_is_profiled():
    assert TrainConfig().profile_steps is None and TrainConfig().profile_range is None


def test_the_environment_hvdazure_run_sets_wins_over_the_config_and_is_named_when_bad():
    config = TrainConfig(profile_steps="2-3")
    assert with_profile_from({}, config) is config
    assert with_profile_from({PROFILE_ENV: "5-8"}, config).profile_range == range(5, 9)
    with pytest.raises(ConfigError, match=rf"^{PROFILE_ENV}='8-5' \(hvdazure run --profile\): config field "
                                          r"'profile_steps': '8-5' is backwards"):
        with_profile_from({PROFILE_ENV: "8-5"}, config)


# --- hvdazure run --profile ------------------------------------------------------------------------------
def test_run_profile_sets_the_steps_for_every_rank(monkeypatch):
    seen = {}

    def run_job(spec, timeout_s, grace_s, verbose):  # the launcher itself: tests/distributed
        seen["spec"] = spec
        return type("Result", (), {"exit_code": 0})()

    monkeypatch.setattr("hvdazure.launch.supervisor.run_job", run_job)
    assert main(["run", "-np", "2", "--profile", "3-5", "--", "python", "-c", "pass"]) == 0
    assert seen["spec"].extra_env == {PROFILE_ENV: "3-5"}
    assert main(["run", "-np", "2", "--", "python", "-c", "pass"]) == 0
    assert PROFILE_ENV not in seen["spec"].extra_env


def test_run_profile_refuses_a_bad_range_in_one_line_before_any_rank_starts(capsys, monkeypatch):
    def must_not_start(*args, **kwargs):
        raise AssertionError("started a process")

    monkeypatch.setattr(subprocess, "Popen", must_not_start)
    with pytest.raises(SystemExit) as exited:
        main(["run", "-np", "2", "--profile", "8-5", "train.py"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --profile: '8-5' is backwards" in err and err.count("\n") == 1


# --- the policy, on simulated ranks ------------------------------------------------------------------------
class Notes(Callback):
    """Notes each step's callbacks in the rank's event list, beside the profiler's calls."""

    def on_step_begin(self, trainer):
        trainer.backend.events.append(f"on_step_begin {trainer.state.step + 1}")

    def on_step_end(self, trainer):
        trainer.backend.events.append(f"on_step_end {trainer.state.step}")


def _trainers(world_size, tmp_path, callbacks=(), trainer_class=FakeTrainer, **fields):
    config = TrainConfig(**{"epochs": 1, "batch_size": 4, "lr": 0.05, "progress_bar": False, "log_every": 2,
                            "output_dir": str(tmp_path / "outputs"), **fields})
    world = ThreadWorld(world_size)
    return world, [trainer_class(world, rank, PROBLEM, config, [Notes(), *callbacks])
                   for rank in range(world_size)]


def _fit(world_size, tmp_path, **fields):
    world, trainers = _trainers(world_size, tmp_path, **fields)
    world.run([t.fit for t in trainers])
    return trainers


def _errors(world, trainers):
    """Each rank's ConfigError from fit()."""
    errors = {}

    def fit(trainer):
        try:
            trainer.fit()
        except ConfigError as exc:
            errors[trainer.rank] = str(exc)

    world.run([lambda t=t: fit(t) for t in trainers])
    return errors


def test_rank_0_alone_records_the_steps_asked_for_each_spanning_its_callbacks(tmp_path):
    trainers = _fit(2, tmp_path, profile_steps="3-4")

    events = trainers[0].backend.events
    at = events.index("profiler start")
    assert events[at - 1:at + 11] == [
        "on_step_end 2", "profiler start", "profiler begin_step 3", "on_step_begin 3", "on_step_end 3",
        "profiler end_step", "profiler begin_step 4", "on_step_begin 4", "on_step_end 4", "profiler end_step",
        "profiler stop", "on_step_begin 5"]
    assert sum(e.startswith("profiler") for e in events) == 6  # no other call, before or after
    assert trainers[0].backend.profilers[0].calls[0] == ("start", tmp_path / "outputs" / "profile",
                                                         "steps-3-4-rank0")
    trace = loop_of(trainers[0])._profile.trace
    assert trace is not None and json.loads(Path(trace.path).read_text()) == [3, 4]
    # rank 1 was asked whether its framework has a profiler, and started none
    assert [p.calls for p in trainers[1].backend.profilers] == [[]]
    assert not any(e.startswith("profiler") for e in trainers[1].backend.events)
    assert sorted(p.name for p in (tmp_path / "outputs" / "profile").iterdir()) == ["steps-3-4-rank0.json"]


def test_without_profile_steps_no_profiler_is_asked_for_or_started_on_any_rank(tmp_path):
    # the guard against profiling that was not asked for: it would slow every step of every run
    trainers = _fit(2, tmp_path)

    assert [t.backend.profilers for t in trainers] == [[], []]
    assert not (tmp_path / "outputs" / "profile").exists()


def test_one_step_is_recorded_alone(tmp_path):
    trainers = _fit(1, tmp_path, profile_steps=6, batch_size=8)

    calls = trainers[0].backend.profilers[0].calls
    assert [c[0] for c in calls] == ["start", "begin_step", "end_step", "stop"]
    assert calls[1] == ("begin_step", 6)


@pytest.mark.parametrize(("fields", "says"), [
    ({"profile_steps": "5-8"}, "'5-8' goes past the end of training, at step 6 (epochs 1 of 6 steps at this "
                               "world size): profile steps up to 6"),
    ({"profile_steps": "9", "epochs": 3, "max_steps": 8}, "'9' goes past the end of training, at step 8 "
                                                         "(max_steps 8): profile steps up to 8"),
])
def test_a_range_past_the_end_of_training_is_refused_on_every_rank_before_the_first_step(
        tmp_path, fields, says):
    world, trainers = _trainers(2, tmp_path, **fields)

    errors = _errors(world, trainers)
    assert errors == {0: f"config field 'profile_steps': {says}", 1: f"config field 'profile_steps': {says}"}
    assert [t.steps for t in trainers] == [[], []]


def test_an_output_dir_that_cannot_be_written_is_refused_on_every_rank_before_the_first_step(tmp_path):
    (tmp_path / "outputs").write_text("a file where the output directory should be")
    world, trainers = _trainers(2, tmp_path, profile_steps="2-3")

    errors = _errors(world, trainers)
    assert sorted(errors) == [0, 1] and errors[0] == errors[1]
    assert errors[0].startswith(f"config field 'output_dir': cannot write the profiler trace into "
                                f"{tmp_path / 'outputs' / 'profile'} (")
    assert [t.steps for t in trainers] == [[], []]


class StopAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, trainer):
        if trainer.state.step == self.step:
            trainer.state.request_stop("enough")


def test_training_that_stops_inside_the_range_writes_the_steps_it_recorded(tmp_path):
    world, trainers = _trainers(2, tmp_path, callbacks=[StopAt(3)], profile_steps="2-5", log_every=1)
    world.run([t.fit for t in trainers])

    assert trainers[0].state.step == 4  # the stop asked for after step 3 is agreed on in step 4
    assert [c[0] for c in trainers[0].backend.profilers[0].calls][-1] == "stop"
    trace = loop_of(trainers[0])._profile.trace
    assert json.loads(Path(trace.path).read_text()) == [2, 3, 4]


def test_a_second_fit_may_profile_steps_of_its_own_and_skips_those_trained_before(tmp_path):
    world, trainers = _trainers(1, tmp_path, batch_size=8, profile_steps="2-3")

    def twice(trainer):
        trainer.fit()
        trainer.config = trainer.config.replace(epochs=2, profile_steps="5-8")  # 6 steps per epoch
        trainer.fit()

    world.run([lambda: twice(trainers[0])])
    started = [p.calls for p in trainers[0].backend.profilers if p.calls]
    assert [[c[1] for c in calls if c[0] == "begin_step"] for calls in started] == [[2, 3], [7, 8]]


@pytest.fixture
def lines():
    """What the hvdazure logger says (rank 0's lines), in this thread."""
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.INFO
    yield said
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_steps_trained_before_this_fit_are_left_out_with_a_line_not_refused(lines):
    # a resumed run (a job restarted after a preemption, same config) or a second fit() goes on
    assert steps_to_profile(range(5, 9), range(7, 13), "epochs 2") == range(7, 9)
    assert steps_to_profile(range(5, 7), range(7, 13), "epochs 2") == range(0)
    assert steps_to_profile(range(5, 6), range(101, 101), "epochs 2") == range(0)  # a finished run
    assert lines == ["profile_steps: steps 5-6 trained before this fit() began, at step 7: not in the trace",
                     "profile_steps: steps 5-6 trained before this fit() began, at step 7: no trace",
                     "profile_steps: step 5 trained before this fit() began, at step 101: no trace"]


def test_the_line_says_where_the_trace_is_and_how_to_open_it(tmp_path, lines):
    profile = ProfiledSteps(RecordingProfiler([]), range(3, 6), tmp_path, rank=0)
    for step in range(1, 7):
        profile.step_begins(step)
        profile.step_ended(step)
    early = ProfiledSteps(RecordingProfiler([]), range(3, 6), tmp_path, rank=0)
    early.step_begins(3)
    early.step_ended(3)
    early.finish(3)

    assert lines == [
        "recording a profiler trace of steps 3-5 (rank 0)",
        f"profiler trace of steps 3-5 (rank 0) written to {tmp_path}/steps-3-5-rank0.json; open it in "
        "https://ui.perfetto.dev or chrome://tracing",
        "recording a profiler trace of steps 3-5 (rank 0)",
        f"profiler trace of step 3, of steps 3-5, as training ended (rank 0) written to "
        f"{tmp_path}/steps-3-5-rank0.json; open it in https://ui.perfetto.dev or chrome://tracing",
    ]
