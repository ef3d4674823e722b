"""The training benchmarks' models (hvdazure/bench/models*.py) are the same in both frameworks, and each
framework's synthetic trainer trains the whole schedule it is given (TensorFlow's trained one step, on the
64 distinct samples alone, until its data came through the binding as CycledArrays)."""

import os
import subprocess
import sys
import textwrap

import pytest

from hvdazure.bench.models import MODELS, channels_last

torch = pytest.importorskip("torch")
QUIET = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def test_both_frameworks_build_the_same_layers_with_the_same_parameter_count():
    from hvdazure.bench import models_torch

    torch_params = {m: sum(p.numel() for p in models_torch.build_model(m).parameters())
                    for m in ("mlp", "cnn")}
    keras = subprocess.run(  # in a process of its own: TensorFlow's start-up stays out of this one
        [sys.executable, "-c", "from hvdazure.bench import models_tf; "
                               "print(*(models_tf.build_model(m).count_params() for m in ('mlp', 'cnn')))"],
        capture_output=True, text=True, check=True, env=QUIET)
    assert dict(zip(("mlp", "cnn"), map(int, keras.stdout.split()[-2:]), strict=True)) == torch_params
    assert torch_params == {"mlp": 1_585_162, "cnn": 94_538}


def test_synthetic_data_cycle_through_the_distinct_samples_at_any_length():
    from hvdazure.bench.models_torch import SyntheticData

    data = SyntheticData("cnn", length=200)
    assert len(data) == 200 and data[0][0].shape == MODELS["cnn"].input_shape
    assert torch.equal(data[3][0], data[3 + 64][0]) and not torch.equal(data[3][0], data[4][0])
    assert channels_last((3, 32, 32)) == (32, 32, 3) and channels_last((512,)) == (512,)


TRAIN_A_SCHEDULE = textwrap.dedent("""
    import sys
    from hvdazure import Callback
    from hvdazure.bench.throughput_workload import BatchSchedule, train_config
    side = __import__("hvdazure.bench.throughput_" + sys.argv[1], fromlist=["SyntheticTrainer"])

    class Steps(Callback):
        count = 0

        def on_step_end(self, trainer):
            Steps.count += 1

    schedule = BatchSchedule(warmup=2, batches=3, steps_per_batch=2)
    side.SyntheticTrainer(train_config(8, schedule), "mlp", schedule.steps * 8, Steps()).fit()
    print("steps", Steps.count, schedule.steps)
""")


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_a_synthetic_trainer_trains_every_step_of_its_schedule(framework):
    pytest.importorskip("horovod")
    if framework == "tf":
        pytest.importorskip("tensorflow")
    out = subprocess.run([sys.executable, "-c", TRAIN_A_SCHEDULE, framework], capture_output=True, text=True,
                         env=QUIET, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["steps", "8", "8"]
