"""hvdazure.core.config: TrainConfig's types, validation, and loading from dicts, YAML files and the CLI."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from hvdazure.core.config import ConfigError, TrainConfig

NAN, INF = float("nan"), float("inf")


def _error(**fields: Any) -> str:
    with pytest.raises(ConfigError) as exc_info:
        TrainConfig(**fields)
    return str(exc_info.value)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


# --- types --------------------------------------------------------------------------------------------------
def test_defaults_are_valid() -> None:
    assert TrainConfig().batch_size == 32


@pytest.mark.parametrize("name", ["lr", "warmup_epochs", "min_lr", "step_gamma", "early_stopping_min_delta"])
def test_an_int_is_accepted_for_a_float_field_and_stored_as_float(name: str) -> None:
    value = getattr(TrainConfig(**{"lr": 2.0, name: 1}), name)
    assert value == 1.0
    assert type(value) is float


@pytest.mark.parametrize(("name", "value"), [
    ("batch_size", "8"), ("batch_size", 8.0), ("batch_size", None), ("epochs", True), ("epochs", "2"),
    ("lr", "fast"), ("lr", True), ("lr", None), ("lr", [0.1]), ("max_steps", "5"), ("max_steps", False),
    ("grad_clip_norm", True), ("warmup_epochs", False), ("warmup_steps", 1.5), ("seed", 0.0),
    ("lr_scaling", "cubic"), ("lr_scaling", None), ("schedule", "linear"), ("precision", "fp8"),
    ("compression", True), ("reduce_op", "mean"), ("monitor_mode", "minimum"), ("tensorboard", 1),
    ("progress_bar", "yes"), ("sync_batchnorm", "yes"), ("sync_batchnorm", 1), ("monitor", 3),
    ("output_dir", None), ("mlflow_tracking_uri", 5),
    ("extra", [1]), ("extra", None),
])
def test_a_value_of_the_wrong_type_names_the_field_and_the_value(name: str, value: Any) -> None:
    message = _error(**{name: value})
    assert f"'{name}'" in message
    assert repr(value) in message


def test_a_type_error_says_what_was_expected() -> None:
    assert "is not one of 'none', 'linear', 'sqrt'" in _error(lr_scaling="cubic")


def test_a_compile_mode_torch_compile_does_not_have_is_one_line_naming_it() -> None:
    assert _error(compile_mode="fast") == ("config field 'compile_mode': 'fast' is not one of 'default', "
                                           "'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs'")
    assert "'compile': 'yes' is not true or false" in _error(compile="yes")


def test_optional_fields_accept_null() -> None:
    config = TrainConfig(max_steps=None, base_batch_size=None, grad_clip_norm=None, mlflow_tracking_uri=None)
    assert config.max_steps is None


# --- values -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "value"), [
    ("epochs", 0), ("epochs", -3), ("max_steps", 0), ("batch_size", 0), ("batch_size", -8),
    ("grad_accum_steps", 0), ("lr", 0), ("lr", -0.1), ("lr", NAN), ("lr", INF), ("base_batch_size", 0),
    ("warmup_epochs", -0.5), ("warmup_epochs", NAN), ("warmup_steps", -1), ("min_lr", -1e-6),
    ("min_lr", 0.5), ("min_lr", NAN), ("step_size_epochs", 0), ("step_gamma", 0), ("step_gamma", 1.5),
    ("step_gamma", NAN), ("gradient_predivide_factor", 0), ("gradient_predivide_factor", -1.0),
    ("gradient_predivide_factor", NAN), ("grad_clip_norm", 0), ("grad_clip_norm", -1.0),
    ("num_workers", -1), ("log_every", 0), ("eval_every", 0), ("monitor", ""),
    ("early_stopping_patience", 0), ("early_stopping_min_delta", -0.1), ("early_stopping_min_delta", NAN),
    ("warmup_epochs", INF), ("grad_clip_norm", INF), ("gradient_predivide_factor", INF),
])
def test_a_value_out_of_range_names_the_field_and_the_value(name: str, value: Any) -> None:
    message = _error(**{name: value})
    assert f"'{name}'" in message
    assert repr(value) in message


@pytest.mark.parametrize("fields", [{"min_lr": 1e-3, "lr": 1e-3}, {"step_gamma": 1}, {"warmup_epochs": 0.5},
                                    {"max_steps": 1}, {"early_stopping_patience": 1}, {"num_workers": 0}])
def test_values_on_the_boundary_are_accepted(fields: dict[str, Any]) -> None:
    TrainConfig(**fields)


def test_min_lr_above_lr_names_the_lr() -> None:
    assert "between 0 and lr (0.001)" in _error(lr=1e-3, min_lr=0.01)


def test_warmup_epochs_and_warmup_steps_are_mutually_exclusive() -> None:
    message = _error(warmup_epochs=1, warmup_steps=100)
    assert "'warmup_epochs' (1.0)" in message
    assert "'warmup_steps' (100)" in message


def test_adasum_requires_no_gradient_predivision() -> None:
    assert "'gradient_predivide_factor'" in _error(reduce_op="adasum", gradient_predivide_factor=2.0)


def test_adasum_cannot_be_allreduced_after_backward() -> None:
    message = _error(reduce_op="adasum", grad_allreduce="after_backward")
    assert "'grad_allreduce': 'after_backward'" in message and "'adasum'" in message


def test_adasum_with_gradient_predivision_names_the_value() -> None:
    assert "2.0" in _error(reduce_op="adasum", gradient_predivide_factor=2.0)


def test_zero_stage_is_0_1_or_2_and_refuses_what_sharding_cannot_do_naming_the_value() -> None:
    assert TrainConfig(zero_stage=2, compression="fp16").zero_stage == 2
    assert _error(zero_stage=3) == "config field 'zero_stage': 3 must be 0, 1 or 2"
    assert "'zero_stage': True is not an integer" in _error(zero_stage=True)
    assert _error(zero_stage=1, reduce_op="adasum").startswith(
        "config field 'zero_stage': 1 cannot be used with reduce_op 'adasum'")
    assert _error(zero_stage=2, grad_allreduce="overlap").startswith(
        "config field 'grad_allreduce': 'overlap' cannot be used with zero_stage 2")
    assert _error(zero_bucket_mb=0) == "config field 'zero_bucket_mb': 0.0 must be positive"


def test_resume_from_goes_with_resume_auto_only() -> None:
    assert TrainConfig(resume="auto", resume_from="abfs://c/job-1/latest").resume_from == "abfs://c/job-1/latest"
    for resume in (None, "runs/a/step-00000004"):
        with pytest.raises(ConfigError, match=r"^config field 'resume_from': 'runs/a/latest' goes with "
                                              rf"resume: auto .*, not resume: {resume!r}$"):
            TrainConfig(resume=resume, resume_from="runs/a/latest")


def test_replace_validates_the_new_values() -> None:
    with pytest.raises(ConfigError, match="'epochs'"):
        TrainConfig().replace(epochs=0)


def test_a_config_cannot_be_changed_in_place() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        TrainConfig().epochs = 3  # type: ignore[misc]


# --- derived values -----------------------------------------------------------------------------------------
def test_global_batch_size_is_batch_size_times_world_size_times_accumulation() -> None:
    assert TrainConfig(batch_size=8, grad_accum_steps=3).global_batch_size(4) == 96


def test_effective_base_batch_size_defaults_to_batch_size() -> None:
    assert TrainConfig(batch_size=24).effective_base_batch_size == 24


def test_effective_base_batch_size_is_base_batch_size_when_given() -> None:
    assert TrainConfig(batch_size=24, base_batch_size=256).effective_base_batch_size == 256


# --- from_dict / from_yaml ----------------------------------------------------------------------------------
def test_from_dict_builds_the_config() -> None:
    assert TrainConfig.from_dict({"epochs": 3, "extra": {"hidden": 64}}) == TrainConfig(epochs=3,
                                                                                    extra={"hidden": 64})


def test_from_dict_rejects_an_unknown_field() -> None:
    with pytest.raises(ConfigError, match="unknown config field 'epoch'"):
        TrainConfig.from_dict({"epoch": 3})


def test_yaml_round_trip_gives_an_equal_config(tmp_path: Path) -> None:
    config = TrainConfig(epochs=4, max_steps=None, lr=2.5e-5, lr_scaling="sqrt", warmup_epochs=0.5,
                         schedule="cosine", min_lr=1e-6, grad_clip_norm=1.0, precision="bf16",
                         tensorboard=True, extra={"hidden": 64, "layers": [1, 2], "name": "mlp"})
    path = _write(tmp_path, yaml.safe_dump(config.to_dict()))
    assert TrainConfig.from_yaml(path) == config


def test_an_empty_yaml_file_gives_the_defaults(tmp_path: Path) -> None:
    assert TrainConfig.from_yaml(_write(tmp_path, "")) == TrainConfig()


def test_a_yaml_file_with_an_unknown_field_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown config field 'batchsize'"):
        TrainConfig.from_yaml(_write(tmp_path, "batchsize: 8\n"))


# One check of field names, wherever they come from: keywords, replace(), a mapping, a YAML file, --set.
def _unknown_field_errors(tmp_path: Path, name: str) -> list[str]:
    def error(build: Any) -> str:
        with pytest.raises(ConfigError) as exc_info:
            build()
        return str(exc_info.value)

    path = _write(tmp_path, f"{name}: 3\n")
    return [error(lambda: TrainConfig(**{name: 3})), error(lambda: TrainConfig().replace(**{name: 3})),
            error(lambda: TrainConfig.from_dict({name: 3})), error(lambda: TrainConfig.from_yaml(path)),
            error(lambda: TrainConfig._from_cli(["--set", f"{name}=3"], {}))]


@pytest.mark.parametrize(("name", "hint"), [
    ("epoch", "did you mean 'epochs'?"),
    ("warmup", "did you mean 'warmup_epochs' or 'warmup_steps'?"),
    ("patience", "did you mean 'early_stopping_patience'?"),
    ("extras.hidden", "did you mean 'extra.hidden'?"),
])
def test_an_unknown_field_names_the_field_it_likely_means_not_every_field(tmp_path: Path, name: str,
                                                                         hint: str) -> None:
    for message in _unknown_field_errors(tmp_path, name):
        assert message == f"unknown config field {name!r}; {hint}"


def test_an_unknown_field_like_no_known_one_lists_the_known_fields(tmp_path: Path) -> None:
    for message in _unknown_field_errors(tmp_path, "zzz"):
        assert message.startswith("unknown config field 'zzz'; known: base_batch_size, batch_size, ")
        assert len(message.split(", ")) == len(dataclasses.fields(TrainConfig))


def test_extra_dotted_in_a_mapping_says_how_to_write_it() -> None:
    with pytest.raises(ConfigError, match=r"'extra.hidden'; `extra.NAME` is --set's form: in a mapping or "
                                          r"YAML file write extra: \{hidden: ...\}"):
        TrainConfig.from_dict({"extra.hidden": 64})


def test_invalid_yaml_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "epochs: [1\n")
    with pytest.raises(ConfigError, match=f"config file {path} is not valid YAML"):
        TrainConfig.from_yaml(path)


@pytest.mark.parametrize("text", ["- epochs\n- 3\n", "3\n", "just words\n"])
def test_yaml_that_is_not_a_mapping_is_rejected(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match="must hold a mapping"):
        TrainConfig.from_yaml(_write(tmp_path, text))


def test_a_missing_yaml_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        TrainConfig.from_yaml(tmp_path / "absent.yaml")


def test_a_yaml_file_can_write_the_lr_in_exponent_notation(tmp_path: Path) -> None:
    assert TrainConfig.from_yaml(_write(tmp_path, "lr: 1e-3\n")).lr == 0.001


# --- from_cli -----------------------------------------------------------------------------------------------
def test_from_cli_without_arguments_gives_the_defaults() -> None:
    assert TrainConfig.from_cli([]) == TrainConfig()


def test_from_cli_applies_the_scripts_defaults() -> None:
    assert TrainConfig.from_cli([], epochs=7, batch_size=16) == TrainConfig(epochs=7, batch_size=16)


def test_config_file_overrides_the_scripts_defaults(tmp_path: Path) -> None:
    path = _write(tmp_path, "epochs: 3\n")
    config = TrainConfig.from_cli(["--config", str(path)], epochs=7, batch_size=16)
    assert (config.epochs, config.batch_size) == (3, 16)


def test_set_overrides_the_config_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "epochs: 3\nbatch_size: 4\n")
    config = TrainConfig.from_cli(["--config", str(path), "--set", "epochs=5"], epochs=7)
    assert (config.epochs, config.batch_size) == (5, 4)


def test_the_last_set_of_a_field_wins() -> None:
    assert TrainConfig.from_cli(["--set", "epochs=2", "--set", "epochs=9"]).epochs == 9


@pytest.mark.parametrize(("item", "name", "value"), [
    ("epochs=5", "epochs", 5), ("lr=0.5", "lr", 0.5), ("max_steps=null", "max_steps", None),
    ("tensorboard=true", "tensorboard", True), ("schedule=cosine", "schedule", "cosine"),
    ("monitor=eval_acc", "monitor", "eval_acc"),
])
def test_set_values_are_read_as_yaml(item: str, name: str, value: Any) -> None:
    assert getattr(TrainConfig.from_cli(["--set", item]), name) == value


def test_set_extra_key_goes_into_extra() -> None:
    assert TrainConfig.from_cli(["--set", "extra.hidden=64"]).extra == {"hidden": 64}


def test_set_extra_key_keeps_the_other_extra_settings(tmp_path: Path) -> None:
    path = _write(tmp_path, "extra:\n  hidden: 32\n  layers: 2\n")
    config = TrainConfig.from_cli(["--config", str(path), "--set", "extra.hidden=64"])
    assert config.extra == {"hidden": 64, "layers": 2}


def _cli_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """from_cli's exit status must be 2; returns what it wrote to stderr."""
    with pytest.raises(SystemExit) as exc_info:
        TrainConfig.from_cli(argv)
    assert exc_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["--set", "epochs=0"], ["--set", "batch_size=eight"], ["--set", "epoch=3"], ["--set", "epochs"],
    ["--set", "=3"], ["--config", "/nonexistent/hvdazure.yaml"],
])
def test_from_cli_exits_2_with_one_error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    err = _cli_error(capsys, argv)
    assert err.startswith("hvdazure: error: ")
    assert err.count("\n") == 1
    assert err.endswith("\n")


def test_from_cli_error_names_the_field_and_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    expected = "hvdazure: error: config field 'epochs': 0 must be at least 1\n"
    assert _cli_error(capsys, ["--set", "epochs=0"]) == expected


def test_from_cli_reports_a_bad_config_file_in_one_line(capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    path = _write(tmp_path, "epochs: [1\nlr: 2\n")
    err = _cli_error(capsys, ["--config", str(path)])
    assert err.startswith(f"hvdazure: error: config file {path} is not valid YAML")
    assert err.count("\n") == 1


def test_set_accepts_the_lr_in_exponent_notation() -> None:
    assert TrainConfig.from_cli(["--set", "lr=1e-3"]).lr == 0.001


def test_set_with_a_malformed_value_exits_2_with_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    err = _cli_error(capsys, ["--set", "extra.sizes=[1, 2"])
    assert err.startswith("hvdazure: error: ")
    assert err.count("\n") == 1


def test_set_extra_key_over_a_non_mapping_extra_exits_2(capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    path = _write(tmp_path, "extra:\n")
    err = _cli_error(capsys, ["--config", str(path), "--set", "extra.hidden=64"])
    assert "'extra'" in err
