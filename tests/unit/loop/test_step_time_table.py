"""The step-time table is shown once, at the end of fit() (early only when the first interval is abnormal),
and its advice is true to the run: nothing about Gloo on MPI, nor about machines on one machine."""

import logging

import pytest
from fakes.fake_backend import FakeTrainer, LinearProblem, ThreadWorld

from hvdazure import TrainConfig
from hvdazure.core.step_times import EARLY_DATA_WAIT_SHARE, PHASES, Breakdown, RunFacts, advice

EXCHANGE_BOUND = {"data": 0.02, "compute": 0.2, "exchange": 0.7, "other": 0.08}
PROBLEM = LinearProblem.make(num_samples=48, num_eval=12, dim=3, seed=1)


def _exchange_advice(**facts) -> str:
    (line,) = advice(EXCHANGE_BOUND, RunFacts(**facts))
    return line


def test_on_mpi_the_advice_never_suggests_mpi_instead_of_gloo():
    line = _exchange_advice(controller="mpi")
    assert line.startswith("allreduce wait 70%: the gradient exchange dominates: a larger batch_size")
    assert "MPI" not in line and "Gloo" not in line


def test_on_gloo_on_one_machine_the_advice_names_mpi_for_one_machine_not_across_machines():
    line = _exchange_advice(controller="gloo", nodes=1)
    assert ("the MPI controller (hvdazure run --mpi), which exchanges through shared memory on one machine "
            "faster than Gloo") in line
    assert "across machines" not in line


def test_on_gloo_across_machines_the_advice_says_across_machines():
    assert "exchanges across machines faster than Gloo" in _exchange_advice(controller="gloo", nodes=2)


def test_overlap_is_suggested_only_on_accelerators_where_the_exchange_waits_for_backward():
    assert "grad_allreduce" not in _exchange_advice(controller="mpi", grad_allreduce="after_backward")
    assert "grad_allreduce" not in _exchange_advice(controller="mpi", accelerator=True)  # auto: overlaps
    assert "grad_allreduce overlap" in _exchange_advice(controller="mpi", accelerator=True,
                                                        grad_allreduce="after_backward")


def test_checkpoint_async_is_suggested_only_when_it_is_off():
    shares = {"checkpoint": 0.4, "compute": 0.6}
    assert "checkpoint_async" not in advice(shares, RunFacts(checkpoint_async=True))[0]
    assert "checkpoint_async true" in advice(shares, RunFacts(checkpoint_async=False))[0]


def test_the_table_knows_from_its_device_columns_whether_the_ranks_have_accelerators():
    row = [2.0, 0.0, 10.0, 80.0, 0.0, 0.2, 1.6, 0.1, *[0.0] * (len(PHASES) - 4)]  # wall, startup, steps,
    # samples, phases
    on_cpu, on_gpu = Breakdown(), Breakdown()
    on_cpu.add_rows([[*row, float("nan"), float("nan"), float("nan")]])
    on_gpu.add_rows([[*row, 2.0**30, 2.0**30, 90.0]])
    facts = RunFacts(controller="mpi", grad_allreduce="after_backward")
    assert len(row) == 4 + len(PHASES)
    assert "grad_allreduce overlap" not in on_cpu.table("t", facts)
    assert "grad_allreduce overlap" in on_gpu.table("t", facts)


def test_only_a_starved_loader_makes_the_first_interval_abnormal():
    starved, busy_exchange = Breakdown(), Breakdown()
    starved.add_rows([[1.0, 0.0, 5.0, 40.0, EARLY_DATA_WAIT_SHARE + 0.1, 0.5, *[0.0] * (len(PHASES) - 2),
                       float("nan"), float("nan"), float("nan")]])
    busy_exchange.add_rows([[1.0, 0.0, 5.0, 40.0, 0.05, 0.1, 0.8, *[0.0] * (len(PHASES) - 3), float("nan"),
                             float("nan"), float("nan")]])
    assert starved.abnormal_early() == "data wait 35% of the first steps' time"
    assert busy_exchange.abnormal_early() is None


class SlowLoader(FakeTrainer):
    data_delay = 0.02


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def logged():
    handler = Lines()
    logger = logging.getLogger("hvdazure")
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize(("trainer_class", "tables"), [(FakeTrainer, 1), (SlowLoader, 2)])
def test_the_table_shows_once_at_the_end_and_early_only_for_a_starved_loader(logged, trainer_class, tables):
    config = TrainConfig(epochs=2, batch_size=4, lr=0.05, progress_bar=False, log_every=2)
    world = ThreadWorld(1)
    trainer = trainer_class(world, 0, PROBLEM, config, [])
    world.run([trainer.fit])

    titles = [line.splitlines()[0] for line in logged if line.startswith("where the time went")]
    assert len(titles) == tables, titles
    assert titles[-1].startswith("where the time went in fit() (the first step apart)")
    if tables == 2:
        assert titles[0].startswith("where the time went, steps 2-2 (shown now: data wait ")
