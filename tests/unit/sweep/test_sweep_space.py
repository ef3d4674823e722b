"""The sweep's search space file (Azure ML's shape) and options: what is accepted, and the one-line errors."""

import math

import pytest
import yaml

from hvdazure.sweep.options import SweepOptions
from hvdazure.sweep.space import SearchSpace, SpaceError, overrides


def space(**parameters):
    return SearchSpace.from_dict({k.replace("__", "."): v for k, v in parameters.items()})


def test_distributions_sample_what_azure_ml_samples():
    s = space(lr={"type": "loguniform", "min_value": math.log(1e-4), "max_value": math.log(1e-1)},
              batch_size={"type": "choice", "values": [16, 32]},
              extra__hidden={"type": "randint", "upper": 4},
              max_steps={"type": "quniform", "min_value": 10, "max_value": 50, "q": 10},
              warmup_epochs={"type": "uniform", "min_value": 0, "max_value": 2})
    d = s.optuna_distributions()
    assert d["lr"].log and d["lr"].low == pytest.approx(1e-4) and d["lr"].high == pytest.approx(0.1)
    assert d["batch_size"].choices == (16, 32)
    assert (d["extra.hidden"].low, d["extra.hidden"].high) == (0, 3)  # randint(upper): 0 .. upper-1
    assert (d["max_steps"].low, d["max_steps"].high, d["max_steps"].step) == (10, 50, 10)
    assert (d["warmup_epochs"].low, d["warmup_epochs"].high) == (0, 2)


def test_a_search_space_key_of_an_azure_job_is_accepted(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({"search_space": {"lr": {"type": "uniform", "min_value": 0.01,
                                                            "max_value": 0.1}}}))
    assert SearchSpace.from_yaml(path).names == ["lr"]


def test_grid_is_every_choice_and_randint_value():
    s = space(lr={"type": "choice", "values": [0.1, 0.01]}, extra__layers={"type": "randint", "upper": 3})
    assert s.grid() == {"lr": [0.1, 0.01], "extra.layers": [0, 1, 2]}
    assert s.grid_size() == 6


def test_trial_parameters_become_config_changes_with_extra_gathered():
    assert overrides({"lr": 0.1, "extra.hidden": 64, "extra.depth": 2}) == {
        "lr": 0.1, "extra": {"hidden": 64, "depth": 2}}


@pytest.mark.parametrize(("parameters", "message"), [
    ({"lrr": {"type": "uniform", "min_value": 0, "max_value": 1}},
     "'lrr': is not a TrainConfig field (nor extra.NAME); did you mean 'lr'?"),
    ({"batch_size": {"type": "uniform", "min_value": 8, "max_value": 64}},
     "'batch_size': uniform gives fractional values, but the field is an integer"),
    ({"batch_size": {"type": "choice", "values": [16, 32.5]}}, "choice value 32.5 is not an integer"),
    ({"precision": {"type": "choice", "values": ["fp32", "fp64"]}}, "choice value 'fp64' is not one of"),
    ({"schedule": {"type": "uniform", "min_value": 0, "max_value": 1}}, "uniform gives numbers, but the"),
    ({"lr": {"type": "gaussian", "mu": 0, "sigma": 1}}, "unknown distribution type 'gaussian'"),
    ({"lr": {"type": "uniform", "min_value": 0.1}}, "uniform takes min_value, max_value; missing max_value"),
    ({"lr": {"type": "uniform", "min_value": 0.1, "max_value": 0.01}}, "min_value 0.1 must be below"),
    ({"lr": {"type": "choice", "values": []}}, "choice values must be a non-empty list"),
    ({"lr": 0.1}, "0.1 is not a distribution"),
    ({"output_dir": {"type": "choice", "values": ["a"]}}, "is set by the sweep for each trial"),
    ({"lr": {"type": "normal", "mu": 0.1, "sigma": 0.01}}, "not available in a local sweep"),
])
def test_a_bad_space_is_one_line_naming_the_parameter(parameters, message):
    with pytest.raises(SpaceError) as error:
        SearchSpace.from_dict(parameters).optuna_distributions()
    assert message in str(error.value) and "\n" not in str(error.value)


def test_grid_needs_finitely_many_values():
    with pytest.raises(SpaceError, match=r"'lr': uniform.*no finite set of values for a grid search"):
        space(lr={"type": "uniform", "min_value": 0.01, "max_value": 0.1}).grid()


def options(tmp_path, **changes):
    script = tmp_path / "train.py"
    script.write_text("")
    space_file = tmp_path / "space.yaml"
    space_file.write_text("lr: {type: uniform, min_value: 0.01, max_value: 0.1}\n")
    return SweepOptions(**{"script": str(script), "space": str(space_file), "metric": "eval_loss",
                           "output": str(tmp_path / "out"), **changes})


@pytest.mark.parametrize(("changes", "world", "message"), [
    ({"ranks_per_trial": 2}, 3, "-np 3 is not a multiple of --ranks-per-trial 2"),
    ({"trials": 0}, 2, "--trials must be at least 1, got 0"),
    ({"script": "missing.py"}, 2, "script not found: missing.py"),
    ({"sampler": "grid"}, 2, "no finite set of values for a grid search"),
])
def test_bad_options_are_one_line(tmp_path, changes, world, message):
    with pytest.raises(SpaceError, match=message):
        options(tmp_path, **changes).check(world)


def test_a_restart_must_search_the_same_space_and_objective(tmp_path):
    first = options(tmp_path)
    first.save(first.check(2))
    first.check_same_as_saved()  # the same: fine
    options(tmp_path, trials=20).check_same_as_saved()  # more trials: fine
    with pytest.raises(SpaceError, match="holds a sweep with metric 'eval_loss', not 'train_loss'"):
        options(tmp_path, metric="train_loss").check_same_as_saved()
    (tmp_path / "space.yaml").write_text("lr: {type: uniform, min_value: 0.01, max_value: 0.2}\n")
    with pytest.raises(SpaceError, match="holds a sweep of another search space"):
        first.check_same_as_saved()


@pytest.mark.parametrize(("args", "message"), [
    (["-np", "3", "--ranks-per-trial", "2"], "-np 3 is not a multiple of --ranks-per-trial 2"),
    (["-np", "2", "--sampler", "grid"], "no finite set of values for a grid search"),
])
def test_the_cli_refuses_bad_input_in_one_line_before_starting_anything(tmp_path, capsys, args, message):
    from hvdazure.cli import main

    o = options(tmp_path)
    code = main(["sweep", *args, o.script, "--space", o.space, "--metric", "eval_loss", "--output", o.output])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()
