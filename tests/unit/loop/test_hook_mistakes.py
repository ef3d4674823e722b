"""The common mistakes in a user's training_step and validation_step, on the real bindings (1 rank, one
process per framework: hook_mistakes_job.py): each is one line naming the hook, the metric and its shape,
the same in PyTorch and TensorFlow, and a broken validation_step is found before training (the sanity
check), which itself changes nothing that training does.

What both refuse: a loss or metric of more than one value per sample (softmax probabilities), no dict from
validation_step, nothing from training_step. Where they differ, each by its documented contract: PyTorch's
training_step returns the mean loss (a per-sample loss is refused, as backward would), TensorFlow's may
return Keras's per-sample values, which the binding averages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

JOB = Path(__file__).with_name("hook_mistakes_job.py")
QUIET = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
SANITY_NOTE = ("hvdazure: raised while checking validation_step on one evaluation batch before training "
               "(config field sanity_check: false skips this check)")
MEAN = "it must be the mean over the batch (one number)"
OR_PER_SAMPLE = f"{MEAN} or one value per sample (shape (batch,)), which hvdazure averages"


def _cases(framework: str) -> dict[str, Any]:
    pytest.importorskip("horovod")
    pytest.importorskip(framework)
    job = subprocess.run([sys.executable, str(JOB), framework], capture_output=True, text=True, env=QUIET,
                         timeout=300)
    assert job.returncode == 0, job.stderr[-3000:]
    return json.loads(job.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def torch_cases() -> dict[str, Any]:
    return _cases("torch")


@pytest.fixture(scope="module")
def tf_cases() -> dict[str, Any]:
    return _cases("tensorflow")


@pytest.fixture(params=["torch", "tensorflow"])
def cases(request: pytest.FixtureRequest) -> dict[str, Any]:
    return request.getfixturevalue("torch_cases" if request.param == "torch" else "tf_cases")


def test_a_pytorch_per_sample_loss_names_training_step_its_shape_and_the_mean_it_must_return(torch_cases):
    case = torch_cases["per_sample_loss"]

    assert (case["error"], case["message"]) == (
        "HookReturnError", f"training_step returned a loss of shape (8,): {MEAN}")
    assert case["training_steps"] == 1  # before backward's `grad can be implicitly created only for ...`


def test_a_tensorflow_loss_of_more_than_one_value_per_sample_is_refused_as_in_pytorch(tf_cases):
    case = tf_cases["per_element_loss"]

    assert (case["error"], case["message"]) == (
        "HookReturnError", f"training_step returned a loss of shape (None, 2): {OR_PER_SAMPLE}")


def test_a_training_metric_of_one_value_per_sample_is_refused_in_pytorch_averaged_in_tensorflow(cases):
    case = cases["metric_per_sample"]

    if "history" in case:  # TensorFlow: Keras's sparse_categorical_accuracy, per sample
        assert 0 <= case["history"][0]["train_accuracy"] <= 1
    else:
        assert (case["error"], case["message"]) == (
            "HookReturnError", f"training_step returned metric 'correct' of shape (8,): {MEAN}")


def test_a_tensorflow_training_metric_of_more_than_one_value_per_sample_is_refused(tf_cases):
    case = tf_cases["metric_per_element"]

    assert (case["error"], case["message"]) == (
        "HookReturnError", f"training_step returned metric 'probs' of shape (None, 2): {OR_PER_SAMPLE}")


def test_a_tensorflow_step_xla_cannot_compile_is_one_line_naming_the_operation_and_compile(tf_cases):
    # compile: true compiles the forward and backward pass with XLA (jit_compile) at the first step
    case = tf_cases["not_compilable"]

    assert (case["error"], case["message"]) == (
        "ConfigError", "config field 'compile': true, but XLA cannot compile training_step's EagerPyFunc "
        "operation (jit_compile of the forward and backward pass): use operations XLA supports (no "
        "tf.py_function) or compile: false")


def test_validation_probabilities_are_refused_before_training_in_both_bindings(torch_cases, tf_cases):
    torch_case, tf_case = torch_cases["probabilities"], tf_cases["probabilities"]

    assert (torch_case["error"], torch_case["message"]) == (
        "HookReturnError", f"validation_step returned metric 'probs' of shape (8, 2): {MEAN}")
    assert (tf_case["error"], tf_case["message"]) == (
        "HookReturnError", f"validation_step returned metric 'probs' of shape (None, 2): {OR_PER_SAMPLE}")
    assert torch_case["training_steps"] == tf_case["training_steps"] == 0


def test_a_training_step_returning_nothing_is_one_line(cases):
    case = cases["no_return"]

    assert (case["error"], case["message"]) == (
        "HookReturnError", "training_step must return a loss tensor or a dict with 'loss', got NoneType")


def test_an_error_in_validation_step_comes_before_training_with_the_users_frame_and_a_note(cases):
    case = cases["broken_validation"]

    assert case["error"] == "TypeError" and "indices must be integers or slices" in case["message"]
    assert "validation_step" in case["frames"] or "in validation_step" in case["message"]  # TF: AutoGraph's
    assert case["notes"] == [SANITY_NOTE]
    assert case["training_steps"] == 0


def test_an_empty_evaluation_set_is_refused_before_training(cases):
    case = cases["empty_eval_set"]

    assert (case["error"], case["message"]) == (
        "DataError", "eval_dataset() holds no samples: return None for no evaluation")
    assert case["training_steps"] == 0


def test_the_sanity_check_changes_no_weight_and_no_metric(cases):
    # validation_step draws from the rank's RNG (a dropout left on), and the model has BatchNorm and Dropout
    checked, unchecked = cases["checked"], cases["unchecked"]

    assert checked["weights"] == unchecked["weights"]
    assert checked["history"] == unchecked["history"]


def test_the_sanity_check_traces_validation_step_once_for_all_evaluations(tf_cases):
    assert tf_cases["checked"]["traces"] == {"validation_step": 1}


def test_the_sanity_check_leaves_each_module_in_the_mode_the_user_gave_it(torch_cases):
    # build_model returns a BatchNorm layer in eval mode inside a model in training mode
    checked, unchecked = torch_cases["frozen_batchnorm_checked"], torch_cases["frozen_batchnorm_unchecked"]

    assert checked["weights"] == unchecked["weights"]
    assert checked["history"] == unchecked["history"]
