"""The sweep's coordinator (a real Optuna study in a journal file, no MPI) and its per-trial callback on the
real training loop (the thread-ranks test double of a backend, tests/fakes/fake_backend.py)."""

import math

import pytest
from fakes.fake_backend import FakeTrainer, LinearProblem, ThreadWorld

from hvdazure.core.config import TrainConfig
from hvdazure.core.run_context import RunContext, active
from hvdazure.sweep.coordinator import Coordinator
from hvdazure.sweep.options import SweepOptions
from hvdazure.sweep.results import collect, write_results
from hvdazure.sweep.study import make_study, total_trials
from hvdazure.sweep.worker import SweepMetricError, TrialReporter, _summary

pytest.importorskip("optuna")


def coordinator(tmp_path, space_text, said=None, **changes):
    script = tmp_path / "train.py"
    script.write_text("")
    (tmp_path / "space.yaml").write_text(space_text)
    options = SweepOptions(**{"script": str(script), "space": str(tmp_path / "space.yaml"),
                              "metric": "eval_loss", "output": str(tmp_path / "out"), **changes})
    space = options.check(2)
    study = make_study(options, space)
    lines = said if said is not None else []
    return Coordinator(options, space, study, total_trials(options, space), lines.append), space


def finish(c, number, state="complete", best=1.0, **extra):
    return c.handle({"op": "finish", "trial": number, "state": state, "best": best, "final": best,
                     "epochs": 3, **extra})


GRID = "lr: {type: choice, values: [0.1, 0.01, 0.001]}\nextra.h: {type: choice, values: [8, 16]}\n"


def test_a_grid_is_handed_out_exactly_once_and_then_no_more_trials(tmp_path):
    c, _ = coordinator(tmp_path, GRID, sampler="grid", trials=100)
    assert c.total == 6
    handed = [c.handle({"op": "next", "ranks": [0, 1]}) for _ in range(6)]
    assert len({(a["params"]["lr"], a["params"]["extra.h"]) for a in handed}) == 6
    assert c.handle({"op": "next", "ranks": [0, 1]}) == {"trial": None}
    for a in handed:
        finish(c, a["trial"], best=a["params"]["lr"])
    assert collect(c.options, c.study).best["params"]["lr"] == 0.001


def test_each_trial_has_its_own_folder_and_seed(tmp_path):
    c, _ = coordinator(tmp_path, GRID, seed=100)
    a, b = c.handle({"op": "next", "ranks": [0]}), c.handle({"op": "next", "ranks": [1]})
    assert (a["seed"], b["seed"]) == (100, 101)
    assert a["dir"].endswith("trials/trial-0000") and b["dir"].endswith("trials/trial-0001")


def test_trials_left_running_by_a_stopped_sweep_are_resumed_first_and_finished_ones_kept(tmp_path):
    c, _ = coordinator(tmp_path, GRID)
    first, second = c.handle({"op": "next", "ranks": [0]}), c.handle({"op": "next", "ranks": [1]})
    finish(c, first["trial"], best=0.5)
    finish(c, second["trial"], interrupted=True)  # stopped by SIGTERM: stays RUNNING
    assert c.handle({"op": "next", "ranks": [0]}) == {"trial": None}  # a stopping sweep starts nothing

    again, _ = coordinator(tmp_path, GRID)  # the sweep started again on the same output folder
    resumed = again.handle({"op": "next", "ranks": [0]})
    assert resumed["resumed"] and resumed["trial"] == second["trial"]
    assert resumed["params"] == second["params"] and resumed["dir"] == second["dir"]
    fresh = again.handle({"op": "next", "ranks": [1]})
    assert not fresh["resumed"] and fresh["trial"] == 2
    states = {t.number: t.state.name for t in again.study.trials}
    assert states[first["trial"]] == "COMPLETE"


def test_the_median_pruner_prunes_a_trial_worse_than_finished_ones_from_its_second_epoch(tmp_path):
    c, _ = coordinator(tmp_path, GRID, pruner="median")
    good = c.handle({"op": "next", "ranks": [0]})
    for epoch, value in enumerate([1.0, 0.5, 0.25]):
        reply = c.handle({"op": "report", "trial": good["trial"], "step": epoch, "value": value})
        assert reply == {"prune": False}
    finish(c, good["trial"], best=0.25)
    bad = c.handle({"op": "next", "ranks": [0]})
    assert c.handle({"op": "report", "trial": bad["trial"], "step": 0, "value": 5.0}) == {"prune": False}
    # after its last epoch a trial is never pruned: it trained to its end
    assert c.handle({"op": "report", "trial": bad["trial"], "step": 1, "value": 5.0, "last": True}) == {
        "prune": False}
    assert c.handle({"op": "report", "trial": bad["trial"], "step": 2, "value": 5.0}) == {"prune": True}
    finish(c, bad["trial"], state="pruned")
    assert c.study.trials[bad["trial"]].state.name == "PRUNED"


def test_failed_and_diverged_trials_are_failures_and_a_missing_metric_stops_the_sweep(tmp_path):
    said = []
    c, space = coordinator(tmp_path, GRID, said=said)
    for _ in range(3):
        c.handle({"op": "next", "ranks": [0]})
    finish(c, 0, state="failed", best=None, error="ValueError: boom", error_kind="error")
    finish(c, 1, state="diverged", best=None, error="diverged: ...")
    assert c.handle({"op": "next", "ranks": [0]})["trial"] == 3  # failures do not stop the sweep
    finish(c, 2, state="failed", best=None, error="--metric 'eval_los' is not ...", error_kind="sweep")
    assert c.handle({"op": "next", "ranks": [0]}) == {"trial": None}
    assert c.aborted.startswith("--metric 'eval_los'")
    rows = {r["trial"]: r for r in collect(c.options, c.study).rows}
    assert (rows[0]["state"], rows[0]["error"]) == ("failed", "ValueError: boom")
    assert rows[1]["state"] == "diverged" and c.study.trials[1].state.name == "FAIL"
    assert any("trial 0 failed" in line and "ValueError: boom" in line for line in said)
    results = write_results(c.options, c.study, space)
    assert results.best is None and "best: none" in results.table()


def test_a_trial_outcome_names_the_rank_that_failed_not_the_one_released_by_horovod():
    lead = {"error": "HorovodInternalError: Horovod has been shut down. This was caused by ...",
            "error_kind": "horovod", "interrupted": False, "values": [1.0], "best": 1.0, "epochs": 1,
            "diverged": False, "pruned": False}
    member = {**lead, "error": "ValueError: trial asked to fail on rank 1", "error_kind": "error"}
    summary = _summary(4, [lead, member])
    assert (summary["state"], summary["error"]) == ("failed", "ValueError: trial asked to fail on rank 1")


# --- the per-trial callback on the real loop -----------------------------------------------------------
def train_one_rank(config: TrainConfig, reporter: TrialReporter, changes=None):
    context = RunContext(config_overrides=changes or {}, callbacks=[reporter])
    with active(context):
        trainer = FakeTrainer(ThreadWorld(1), 0, LinearProblem.make(40, num_eval=10), config)
    trainer.world.run([trainer.fit])
    return trainer


def test_a_run_context_applies_the_trial_over_the_script_config_and_reports_each_epoch():
    reported = []
    reporter = TrialReporter("eval_loss", "min",
                             lambda epoch, value, last: reported.append((epoch, value, last)) or False)
    config = TrainConfig(epochs=3, lr=0.05, batch_size=4, progress_bar=False, extra={"a": 1, "b": 2})
    trainer = train_one_rank(config, reporter, {"lr": 0.02, "extra": {"b": 3}})
    assert trainer.config.lr == 0.02 and trainer.config.extra == {"a": 1, "b": 3}
    assert [(epoch, last) for epoch, _, last in reported] == [(0, False), (1, False), (2, True)]
    assert reporter.values() == [value for _, value, _ in reported] and reporter.ended
    assert reporter.best() == min(reporter.values())


def test_pruning_stops_training_at_the_end_of_the_epoch():
    reporter = TrialReporter("eval_loss", "min", lambda epoch, value, last: epoch == 1)
    trainer = train_one_rank(TrainConfig(epochs=5, lr=0.05, batch_size=4, progress_bar=False), reporter)
    assert reporter.pruned and len(trainer.state.history) == 2


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
def test_a_non_finite_metric_stops_the_trial_as_diverged():
    reporter = TrialReporter("eval_loss", "min", None)
    trainer = train_one_rank(TrainConfig(epochs=5, lr=1e6, batch_size=4, progress_bar=False), reporter)
    assert reporter.diverged and len(trainer.state.history) < 5
    assert not math.isfinite(reporter.values()[-1])


def test_a_metric_the_trial_does_not_have_is_a_sweep_error():
    reporter = TrialReporter("eval_accuracy", "max", None)
    with pytest.raises(SweepMetricError, match="--metric 'eval_accuracy' is not in the trial's history; its "
                                               "metrics are eval_loss, train_loss"):
        train_one_rank(TrainConfig(epochs=2, lr=0.05, batch_size=4, progress_bar=False), reporter)
