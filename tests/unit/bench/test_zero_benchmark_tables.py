"""What benchmarks/zero_memory.py and benchmarks/zero_step_time.py compute and print from their measurements,
on known inputs (the measurements themselves are run by hand: benchmarks/RESULTS.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

M = 1_000_000
BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


zero_memory = load("zero_memory")
zero_step_time = load("zero_step_time")


def rank(world: int, stage: int, state: int, baseline: int, peak: int, params: int = 1000) -> dict:
    return {"rank": 0, "world_size": world, "stage": stage, "params": params, "param_bytes": 4 * params,
            "state_bytes": state, "baseline_rss": baseline, "peak_rss": peak, "end_rss": peak,
            "phase_peaks": {} if stage == 0 else {"forward+backward": 500 * M, "exchange": 700 * M,
                                                  "optimizer": (900 + world) * M, "allgather": 800 * M}}


def test_a_row_takes_the_neediest_rank_and_its_rest_is_the_rise_less_state_and_gradients() -> None:
    ranks = [rank(2, 1, state=4000, baseline=10_000, peak=20_000),
             rank(2, 1, state=4100, baseline=11_000, peak=20_500)]
    row = zero_memory.summarize(ranks, unsharded_state=8000)
    assert row["state_bytes"] == 4100 and row["peak_rss"] == 20_500
    assert row["training_rise"] == 10_000  # the first rank's 20_000 - 10_000 beats the second's 9_500
    assert row["grads_kept_bytes"] == 4000  # stage 1 keeps the full gradients
    assert row["rest_bytes"] == 10_000 - 4100 - 4000
    assert row["state_ratio"] == pytest.approx(4100 / 8000) and row["goal"] == pytest.approx(0.52)
    assert row["goal_met"]


def test_stage_2_keeps_only_its_slice_of_the_gradients_rounded_up() -> None:
    row = zero_memory.summarize([rank(3, 2, state=3000, baseline=0, peak=9000, params=1001)],
                                unsharded_state=8008)
    assert row["grads_kept_bytes"] == 1335  # ceil(4004 / 3)
    assert row["goal_met"] is False  # 3000 / 8008 = 0.375 > 1/3 + 0.02


def test_stage_0_is_not_held_to_the_sharded_goal() -> None:
    row = zero_memory.summarize([rank(2, 0, state=8000, baseline=0, peak=9000)], unsharded_state=8000)
    assert row["state_ratio"] == 1.0 and row["goal_met"] is None


def test_the_unsharded_state_is_stage_0s_measurement_else_adamws_arithmetic() -> None:
    jobs = {(2, 1): [rank(2, 1, 4000, 0, 1)], (1, 0): [rank(1, 0, 8040, 0, 1)]}
    assert zero_memory.unsharded_state_bytes(jobs) == 8040
    without_stage_0 = {(2, 1): [rank(2, 1, 4000, 0, 1)]}
    assert zero_memory.unsharded_state_bytes(without_stage_0) == 8000 + 4 * 2 * zero_memory.LAYERS


def test_the_memory_table_is_markdown_in_megabytes_with_the_verdict() -> None:
    rows = [zero_memory.summarize([rank(1, 0, 800_000_000, 700_000_000, 2_000_000_000, 100_000_000)],
                                  800_000_000),
            zero_memory.summarize([rank(2, 2, 500_000_000, 700_000_000, 2_000_000_000, 100_000_000)],
                                  800_000_000)]
    lines = zero_memory.table(rows).splitlines()
    assert lines[0].startswith("| ranks | stage | state MB/rank |") and lines[1].count("---") == 9
    assert lines[2] == "| 1 | 0 | 800 | 1.000 | 1.020 (unsharded) | 2000 | 1300 | 400 | 100 |"
    assert lines[3] == "| 2 | 2 | 500 | 0.625 | 0.520 (not met) | 2000 | 1300 | 200 | 600 |"


def test_the_stages_order_rotates_each_round() -> None:
    assert [zero_step_time.round_order(i) for i in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]


@pytest.mark.parametrize(("numerators", "verdict"), [([1.0, 1.02, 1.05, 1.01], "met"),
                                                      ([1.3, 1.4, 1.35, 1.5], "not met"),
                                                      ([0.9, 1.3, 1.0, 1.25], "undecided")])
def test_the_ratio_to_stage_0_is_per_round_with_a_verdict_against_1_10(numerators: list[float],
                                                                       verdict: str) -> None:
    summary = zero_step_time.ratio_summary(numerators, [1.0] * len(numerators))
    assert summary["verdict"] == verdict
    assert summary["ratios"] == numerators and summary["min"] == min(numerators)
    assert summary["ci95"][0] <= summary["median"] <= summary["ci95"][1]


def test_the_step_time_table_has_a_row_per_stage() -> None:
    result = {"model": "mlp",
              "ms_per_step": {"0": {"median": 10.0, "min": 9.0, "max": 12.0},
                              "1": {"median": 11.0, "min": 10.0, "max": 13.0},
                              "2": {"median": 12.0, "min": 11.0, "max": 14.0}},
              "ratio_to_stage0": {s: {"median": m, "ci95": [m - 0.1, m + 0.1], "min": m - 0.2, "max": m + 0.2,
                                      "verdict": "undecided"} for s, m in (("1", 1.1), ("2", 1.2))}}
    lines = zero_step_time.table(result).splitlines()
    assert lines[0].endswith("| target 1.10 |") and lines[1].count("---") == 5
    assert lines[2:] == [
        "| mlp | 0 | 10.0 (9.0-12.0) | 1 | |",
        "| mlp | 1 | 11.0 (10.0-13.0) | 1.100 (1.000-1.200; 0.90-1.30) | undecided |",
        "| mlp | 2 | 12.0 (11.0-14.0) | 1.200 (1.100-1.300; 1.00-1.40) | undecided |"]


def test_the_phase_table_lists_the_sharded_rows_with_the_neediest_ranks_peaks() -> None:
    stage_0 = zero_memory.summarize([rank(2, 0, 8000, 0, 1)], 8000)
    stage_2 = zero_memory.summarize([rank(2, 2, 4000, 0, 1), rank(4, 2, 4000, 0, 1)], 8000)
    assert stage_2["phase_peaks"]["optimizer"] == 904 * M and stage_0["phase_peaks"] == {}
    lines = zero_memory.phase_table([stage_0, stage_2]).splitlines()
    assert lines[0] == "| ranks | stage | forward+backward | exchange | optimizer | allgather |"
    assert lines[1].count("---") == 6
    assert lines[2:] == ["| 2 | 2 | 500 | 700 | 904 | 800 |"]


def test_repeats_give_the_varying_figures_median_and_spread_and_the_table_shows_it() -> None:
    runs = [zero_memory.summarize([rank(4, 2, 200 * M, 700 * M, peak, params=100 * M)], 800 * M)
            for peak in (1600 * M, 1700 * M, 1650 * M)]
    row = zero_memory.combine(runs)
    assert row["peak_rss"] == 1650 * M and row["peak_rss_spread"] == {"min": 1600 * M, "max": 1700 * M}
    assert row["training_rise"] == 950 * M and row["goal_met"] is True and len(row["repeats"]) == 3
    assert row["phase_peaks"]["optimizer"] == 904 * M
    assert zero_memory.table([row]).splitlines()[2] == \
        "| 4 | 2 | 200 | 0.250 | 0.270 (met) | 1650 (1600-1700) | 950 (900-1000) | 100 | 650 (600-700) |"
    steady = zero_memory.combine(runs[:1] * 2)
    assert zero_memory.megabytes(steady, "peak_rss") == "1600"  # no spread shown when there is none
