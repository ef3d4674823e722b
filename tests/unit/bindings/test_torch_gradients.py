"""When the PyTorch binding allreduces gradients (TrainConfig.grad_allreduce): overlapped with backward on
CUDA devices and for Adasum, after backward on CPUs, or as the user says. On one rank there is nothing to
allreduce. The equality of both paths on real ranks: tests/distributed/test_torch_trainer.py."""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("horovod")

from hvdazure.torch.gradients import overlaps_backward  # noqa: E402

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize(("setting", "reduce_op", "device", "overlaps"), [
    ("auto", "average", CPU, False),
    ("auto", "average", CUDA, True),
    ("auto", "adasum", CPU, True),
    ("overlap", "average", CPU, True),
    ("after_backward", "sum", CUDA, False),
])
def test_auto_overlaps_on_gpus_and_for_adasum_and_an_explicit_choice_is_kept(setting, reduce_op, device,
                                                                             overlaps):
    assert overlaps_backward(setting, reduce_op, device) is overlaps


ONE_RANK = """
import horovod.torch as hvd, torch
from hvdazure.torch.gradients import GradientsAfterBackward
hvd.init()
layer = torch.nn.Linear(3, 1)
layer(torch.ones(2, 3)).sum().backward()
before = layer.weight.grad.clone()
frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
GradientsAfterBackward([*layer.parameters(), frozen], "average", "fp16", 1.0)()
print(torch.equal(layer.weight.grad, before), frozen.grad is None)
"""


def test_one_rank_leaves_the_gradients_as_they_are():
    # in a process of its own: Horovod started in the test process crashes it at exit (with TensorFlow loaded)
    done = subprocess.run([sys.executable, "-c", ONE_RANK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True"]
