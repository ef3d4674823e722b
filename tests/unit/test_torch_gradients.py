"""When the PyTorch binding allreduces gradients (TrainConfig.grad_allreduce): overlapped with backward on
CUDA devices and for Adasum, after backward on CPUs, or as the user says. On one rank there is nothing to
allreduce. The equality of both paths on real ranks: tests/distributed/test_torch_trainer.py."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("horovod")

from hvdazure.torch.gradients import GradientsAfterBackward, overlaps_backward  # noqa: E402

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


def test_one_rank_leaves_the_gradients_as_they_are():
    import horovod.torch as hvd

    hvd.init()
    layer = torch.nn.Linear(3, 1)
    layer(torch.ones(2, 3)).sum().backward()
    before = layer.weight.grad.clone()
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    GradientsAfterBackward([*layer.parameters(), frozen], "average", "fp16", 1.0)()
    assert torch.equal(layer.weight.grad, before) and frozen.grad is None
