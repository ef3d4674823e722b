"""Which optimizers `zero_stage` shards (hvdazure/torch/zero.py `refuse_coupled`): torch.optim's per-element
ones step a slice exactly as the whole tensor; one whose update couples a tensor's elements (LBFGS's line
search, Adafactor's factored moments, Muon's orthogonalized matrices, SparseAdam's sparse rows) is refused
in one line naming it. Horovod is not started here: an optimizer hvdazure does not know (a warning on rank
0) is left to tests/distributed/test_zero.py, as is the refusal on real ranks."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("horovod")

from hvdazure.core.config import ConfigError  # noqa: E402
from hvdazure.torch.zero import refuse_coupled  # noqa: E402

WHY = {"LBFGS": "it runs a line search over all parameters as one vector",
       "Adafactor": "its factored second moments are per row and column of each matrix",
       "Muon": "it orthogonalizes each matrix's update as a whole",
       "SparseAdam": "it takes sparse gradients"}


def params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(4, 3)), torch.nn.Parameter(torch.zeros(3))]


def matrices() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(4, 3))]  # Muon takes 2-d parameters only


@pytest.mark.parametrize("make", [
    lambda: torch.optim.SGD(params(), lr=0.1, momentum=0.9),
    lambda: torch.optim.Adam(params(), lr=0.1),
    lambda: torch.optim.AdamW(params(), lr=0.1, weight_decay=0.01),
    lambda: torch.optim.Adagrad(params(), lr=0.1),
    lambda: torch.optim.RMSprop(params(), lr=0.1),
], ids=["SGD", "Adam", "AdamW", "Adagrad", "RMSprop"])
def test_per_element_optimizers_are_accepted(make):
    refuse_coupled(make())  # returns without asking Horovod anything


def test_a_subclass_of_a_per_element_optimizer_is_accepted():
    class MyAdam(torch.optim.Adam):
        pass

    refuse_coupled(MyAdam(params(), lr=0.1))


@pytest.mark.parametrize(("make", "name"), [
    (lambda: torch.optim.LBFGS(params(), lr=0.1), "LBFGS"),
    (lambda: torch.optim.Adafactor(params(), lr=0.1), "Adafactor"),
    (lambda: torch.optim.Muon(matrices(), lr=0.1), "Muon"),
    (lambda: torch.optim.SparseAdam(params(), lr=0.1), "SparseAdam"),
], ids=["LBFGS", "Adafactor", "Muon", "SparseAdam"])
def test_an_optimizer_that_couples_elements_is_refused_in_one_line_naming_it(make, name):
    with pytest.raises(ConfigError) as refused:
        refuse_coupled(make())
    assert str(refused.value) == (f"config field 'zero_stage': {name} cannot step a slice of the parameters "
                                  f"({WHY[name]}); use zero_stage: 0 with it")


def test_a_subclass_of_a_coupled_optimizer_is_refused_under_its_own_name():
    class Lookahead(torch.optim.LBFGS):
        pass

    with pytest.raises(ConfigError, match=r"^config field 'zero_stage': Lookahead cannot step a slice "):
        refuse_coupled(Lookahead(params(), lr=0.1))


def test_a_horovod_without_the_collectives_sharding_needs_is_refused_naming_the_first_missing() -> None:
    """`refuse_without_collectives` reads the names a horovod.torch has (this one's, and a list without the
    grouped reduce-scatter of 0.27): no Horovod is faked, only the list of its names."""
    import horovod
    import horovod.torch as hvd

    from hvdazure.torch.zero import NEEDED, refuse_without_collectives

    refuse_without_collectives(dir(hvd), horovod.__version__)  # the Horovod built here has them all
    older = [name for name in dir(hvd) if name != "grouped_reducescatter"]
    with pytest.raises(ConfigError) as refused:
        refuse_without_collectives(older, "0.26.1")
    assert str(refused.value) == (
        "config field 'zero_stage': this Horovod (0.26.1) has no grouped_reducescatter, which sharding "
        "needs: build Horovod 0.28.1 (scripts/build_horovod.sh), or use zero_stage: 0")
    assert "grouped_reducescatter" in NEEDED
