"""core/step_times.py on a clock the test moves: what each phase is charged, start-up kept apart, the
reduced rows' means over ranks, shares, the log line's part, the table and its advice; and the device's
numbers (GPU peak memory, utilization) per rank, as plain numbers: their largest and smallest over ranks,
over intervals, and nothing at all where no rank knows them (CPUs)."""

import math

import pytest

from hvdazure.core.step_times import PHASES, ROW_LENGTH, Breakdown, StepTimes, advice

NAN = math.nan
GIB = 2.0**30


def _row(wall, startup, steps, samples, *phases, device=(NAN, NAN, NAN)):
    """One rank's row (StepTimes.row): the phases given in PHASES' order, the rest 0."""
    return [wall, startup, steps, samples, *phases, *[0.0] * (len(PHASES) - len(phases)), *device]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _steps(times: StepTimes, clock: Clock, count: int, data: float, compute: float, first: bool) -> None:
    for i in range(count):
        since = times.now()
        clock.t += data
        since = times.add("data", since)
        clock.t += compute
        times.add("compute", since)
        times.step_done(samples=8, first_of_fit=first and i == 0)


def test_each_phase_gets_its_own_time_and_the_first_step_is_start_up():
    clock = Clock()
    times = StepTimes(clock=clock)
    _steps(times, clock, 1, data=5.0, compute=1.0, first=True)  # start-up: loader workers, compilation
    _steps(times, clock, 4, data=0.25, compute=0.75, first=False)
    clock.t += 1.0  # between steps: callbacks, logging
    row = times.row()
    assert len(row) == ROW_LENGTH
    seconds = dict(zip(PHASES, row[4:4 + len(PHASES)], strict=True))
    assert row[:4] == [11.0, 6.0, 4.0, 32.0]  # wall (start-up included), start-up, steps, samples
    assert all(math.isnan(value) for value in row[4 + len(PHASES):])  # no device told: CPU
    assert seconds["data"] == pytest.approx(1.0) and seconds["compute"] == pytest.approx(3.0)
    assert times.row()[:4] == [0.0, 0.0, 0.0, 0.0]  # a new interval


def test_a_reduced_row_is_the_mean_over_ranks_and_shares_add_up_to_one():
    # two ranks' rows: rank 0 waited 1 s for data, rank 1 3 s, of 10 s each
    b = Breakdown()
    b.add_rows([_row(10.0, 0.0, 5.0, 80.0, 1.0, 6.5, 1.5, 0.5),
                _row(10.0, 0.0, 5.0, 80.0, 3.0, 5.5, 0.5, 0.5)])
    assert (b.wall, b.steps, b.samples) == (10.0, 5, 80)
    shares = b.shares()
    assert shares == pytest.approx({"data": 0.2, "compute": 0.6, "exchange": 0.1, "optimizer": 0.05,
                                    "other": 0.05})
    assert sum(shares.values()) == pytest.approx(1.0)
    assert b.samples_per_second == 8.0
    assert b.compact() == "time data 20% compute 60% exchange 10% optimizer 5% other 5%"
    assert b.scalars()["time_exchange"] == pytest.approx(0.1) and b.scalars()["samples_per_s"] == 8.0


def test_start_up_is_left_out_of_the_shares_and_shown_in_seconds():
    b = Breakdown()
    b.add_rows([_row(12.0, 2.0, 10.0, 80.0, 9.0, 1.0)])  # 2 s of the 12 were start-up
    assert b.timed == 10.0
    assert b.shares()["data"] == pytest.approx(0.9)
    table = b.table("where the time went")
    assert "first step" in table and "2e+03" in table  # 2000 ms, in the table's own line
    assert table.splitlines()[0] == ("where the time went: 10 steps in 10 s on 1 rank(s) (mean over ranks), "
                                     "8 samples/s")


def test_intervals_add_up_into_the_fit():
    fit = Breakdown()
    for data in (1.0, 3.0):
        interval = Breakdown()
        interval.add_rows([_row(4.0, 0.0, 2.0, 16.0, data, 4.0 - data)])
        fit.add(interval)
    assert (fit.wall, fit.steps, fit.samples) == (8.0, 4, 32)
    assert fit.shares()["data"] == pytest.approx(0.5)


def test_advice_names_the_phase_that_stands_out_largest_first_and_none_when_healthy():
    assert advice({"data": 0.05, "compute": 0.9, "other": 0.05}) == []
    lines = advice({"data": 0.6, "exchange": 0.35, "other": 0.05})
    assert lines[0].startswith("data wait 60%: the model waits for data: more loader workers (num_workers)")
    assert lines[1].startswith("allreduce wait 35%: the gradient exchange dominates")
    assert all(line.endswith("(see 'Why is my training slow?')") for line in lines)


def test_off_it_times_nothing_and_reports_no_row():
    clock = Clock()
    times = StepTimes(enabled=False, clock=clock)
    since = times.now()
    clock.t += 1.0
    times.add("data", since)
    times.step_done(8, first_of_fit=False)
    assert times.row() == []


def test_an_interval_without_timed_wall_time_has_no_shares():
    assert Breakdown().shares() == {} and Breakdown().samples_per_second == 0.0


def test_time_left_out_is_nobodys_not_even_other():
    clock = Clock()
    times = StepTimes(clock=clock)
    _steps(times, clock, 2, data=1.0, compute=1.0, first=False)
    since = times.now()
    clock.t += 30.0  # a profiler trace written
    times.leave_out(since)
    row = times.row()
    assert row[0] == 4.0  # the wall time: the two steps alone, nothing left over for `other`


def test_the_device_row_is_asked_once_per_interval_and_rides_after_the_phases():
    readings = iter([(3 * GIB, 4 * GIB, 80.0), (2 * GIB, 4 * GIB, 60.0)])
    times = StepTimes(clock=Clock(), device=lambda: next(readings))
    assert [times.row()[-3:] for _ in range(2)] == [[3 * GIB, 4 * GIB, 80.0], [2 * GIB, 4 * GIB, 60.0]]


def test_gpu_memory_and_utilization_show_each_ranks_highest_and_lowest_and_which_rank():
    b = Breakdown()
    b.add_rows([_row(10.0, 0.0, 5.0, 80.0, 1.0, 9.0, device=(11.0 * GIB, 12.0 * GIB, 97.0)),
                _row(10.0, 0.0, 5.0, 80.0, 1.0, 9.0, device=(10.5 * GIB, 12.0 * GIB, 85.0)),
                _row(10.0, 0.0, 5.0, 80.0, 1.0, 9.0, device=(12.25 * GIB, 14.0 * GIB, 91.0))])
    assert b.compact() == ("time data 10% compute 90% other 0% | gpu peak 10.5-12.2 GiB reserved 12-14 GiB "
                           "util 85-97%")
    assert b.scalars()["gpu_memory_peak_gib_max"] == 12.25 and b.scalars()["gpu_memory_peak_gib_min"] == 10.5
    assert (b.scalars()["gpu_utilization_max"], b.scalars()["gpu_utilization_min"]) == (97.0, 85.0)
    table = b.table("where the time went").splitlines()
    assert "  gpu memory peak   max 12.2 GiB (rank 2), min 10.5 GiB (rank 1)" in table
    assert "  gpu reserved peak max 14 GiB (rank 2), min 12 GiB (rank 0)" in table
    assert b.scalars()["gpu_memory_reserved_gib_max"] == 14.0
    assert "  gpu utilization   max 97% (rank 0), min 85% (rank 1)" in table


def test_over_intervals_a_ranks_peak_is_its_largest_and_its_utilization_the_mean_of_its_readings():
    fit = Breakdown()
    for peaks, utilizations in (((4 * GIB, 2 * GIB), (90.0, 50.0)), ((3 * GIB, 5 * GIB), (70.0, NAN))):
        interval = Breakdown()
        interval.add_rows([_row(1.0, 0.0, 1.0, 8.0, 0.5, 0.5, device=(peak, peak, utilization))
                           for peak, utilization in zip(peaks, utilizations, strict=True)])
        fit.add(interval)
    (_, memory), (_, reserved), (_, utilization) = fit.device.spreads()
    assert (reserved.high, reserved.low) == (memory.high, memory.low)
    assert (memory.high, memory.high_rank, memory.low, memory.low_rank) == (5 * GIB, 1, 4 * GIB, 0)
    assert (utilization.high, utilization.high_rank) == (80.0, 0)  # rank 0 read 90 and 70
    assert (utilization.low, utilization.low_rank) == (50.0, 1)  # rank 1 read 50, then nothing


def test_a_device_that_reports_memory_but_no_utilization_shows_memory_alone():
    # TensorFlow (no reserved memory either), PyTorch without pynvml: the utilization is NaN on every rank
    b = Breakdown()
    b.add_rows([_row(1.0, 0.0, 1.0, 8.0, 0.5, 0.5, device=(2 * GIB, NAN, NAN))] * 2)
    assert b.compact().endswith("| gpu peak 2 GiB")
    assert set(b.scalars()) >= {"gpu_memory_peak_gib_max"} and "gpu_utilization_max" not in b.scalars()
    assert not any("utilization" in line for line in b.table("t").splitlines())


def test_on_cpus_nothing_of_the_device_is_shown_anywhere():
    b = Breakdown()
    b.add_rows([_row(1.0, 0.0, 1.0, 8.0, 0.5, 0.5)] * 2)
    assert "gpu" not in b.compact() and "gpu" not in b.table("t")
    assert not [name for name in b.scalars() if name.startswith("gpu")]


def test_with_sharding_the_table_names_the_reduce_scatter_and_the_allgather_apart():
    """zero_stage: the allgather of the updated slices is its own phase, shown after the update; at stage 2
    the exchange is a reduce-scatter, and the table and its advice say so (stage 0 and 1: an allreduce)."""
    from hvdazure.core.step_times import RunFacts

    b = Breakdown()
    b.add_rows([_row(10.0, 0.0, 5.0, 80.0, 0.5, 4.0, 4.0, 0.5, *[0.0] * (len(PHASES) - 5), 1.0)])
    assert list(b.shares())[:5] == ["data", "compute", "exchange", "optimizer", "gather"]
    stage_2 = b.table("t", RunFacts(zero_stage=2)).splitlines()
    assert [line.split()[0] for line in stage_2[2:7]] == ["data", "forward+backward", "reducescatter",
                                                         "optimizer", "allgather"]
    assert any(line.strip().startswith("reducescatter wait 40%: the gradient exchange") for line in stage_2)
    assert "allreduce wait" in b.table("t", RunFacts(zero_stage=1))
    assert "allreduce wait" not in b.table("t", RunFacts(zero_stage=2))
