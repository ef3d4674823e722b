"""What the allreduce and throughput benchmarks compute from their timings, on known inputs."""

from types import SimpleNamespace

import pytest

from hvdazure.bench import allreduce, checkpoint, throughput


def test_message_sizes_go_from_4_kb_to_256_mb_in_steps_of_4_and_quick_stops_at_16_mb():
    assert allreduce.message_sizes(quick=False) == [4096 * 4**i for i in range(9)]
    assert allreduce.message_sizes(quick=True)[-1] == 16 * 2**20


def test_allreduce_row_gives_latency_algorithm_and_bus_bandwidth():
    row = allreduce._row("horovod", 2**30, 2, [0.5, 1.0, 2.0], world_size=4, op="allreduce")

    assert row["latency_us"] == pytest.approx(1e6)
    assert row["algbw_GBps"] == pytest.approx(2**30 / 1e9)
    assert row["busbw_GBps"] == pytest.approx(2**30 / 1e9 * 1.5)


def test_allgather_bandwidth_counts_the_gathered_bytes_as_nccl_tests_does():
    row = allreduce._row("horovod", 1000, 2, [1e-6], world_size=4, op="allgather")

    assert row["algbw_GBps"] == pytest.approx(4.0)
    assert row["busbw_GBps"] == pytest.approx(3.0)


def test_bandwidth_share_pairs_each_repeat_and_uses_only_sizes_of_1_mb_and_more():
    rows = [allreduce._row(peer, size, 1, times, 2, "allreduce") for peer, size, times in [
        ("hvdazure", 2**20, [1.0, 2.0]), ("horovod", 2**20, [1.0, 2.0]),
        ("hvdazure", 4096, [9.0, 9.0]), ("horovod", 4096, [1.0, 1.0]),
    ]]

    share = allreduce.summarize(rows)["bandwidth_ratios_at_1MB_and_more"]["hvdazure / horovod"]

    assert share["median"] == pytest.approx(1.0) and share["pairs"] == 2
    assert share["ci95"] == pytest.approx([1.0, 1.0])


def test_weak_scaling_efficiency_of_two_ranks_at_90_percent_of_twice_one_rank():
    runs = {"1 rank": {"rates_per_rank": [[100.0, 100.0, 100.0]]},
            "2 ranks": {"rates_per_rank": [[90.0, 90.0, 90.0], [90.0, 90.0, 90.0]]},
            "2 independent": {"rates_per_rank": [[95.0, 95.0, 95.0], [95.0, 95.0, 95.0]]}}

    s = throughput.summarize(runs, 2)

    assert s["samples_per_s"]["2 ranks"]["total"]["mean"] == pytest.approx(180.0)
    assert s["samples_per_s"]["2 ranks"]["per_worker"]["mean"] == pytest.approx(90.0)
    assert s["weak_scaling_efficiency"]["value"] == pytest.approx(0.9)
    assert s["weak_scaling_efficiency"]["ci95"] == pytest.approx([0.9, 0.9])
    assert s["ceiling_efficiency"]["value"] == pytest.approx(0.95)
    assert s["share_of_ceiling"]["value"] == pytest.approx(180 / 190)
    assert s["target"]["verdict"] == "met"


def test_checkpoint_stall_is_a_blocks_excess_over_its_median_step_per_checkpoint():
    result = {"save_load_s": {"torch.save": [1.0, 1.0], "torch.save + fsync": [2.0, 2.0],
                              "write + fsync": [1.0, 2.0], "hvdazure save": [2.1, 2.3],
                              "async copy": [0.04, 0.06], "hvdazure save, CPU time": [0.1, 0.1],
                              "torch.load": [1.0, 1.0], "hvdazure load": [1.2, 1.4]},
              "step_s": {"none": [[0.2, 0.2, 0.2, 0.2], [0.3, 0.3, 0.3, 0.3]],
                         "async": [[0.2, 0.3, 0.2, 0.2], [0.3, 0.3, 0.3, 0.7]],
                         "blocking": [[0.2, 1.2, 0.2, 0.2], [0.3, 0.3, 2.3, 0.3]]}}

    s = checkpoint.summarize(result, {"steps": 45, "every": 10})

    assert s["checkpoints_per_block"] == 4
    assert s["stall_s_per_checkpoint"]["none"]["per_round"] == pytest.approx([0.0, 0.0])
    assert s["stall_s_per_checkpoint"]["async"]["per_round"] == pytest.approx([0.1 / 4, 0.4 / 4])
    assert s["stall_s_per_checkpoint"]["blocking"]["per_round"] == pytest.approx([1.0 / 4, 2.0 / 4])
    assert s["async_stall_over_blocking"]["values"] == pytest.approx([0.1, 0.2])
    assert s["async_stall_over_blocking"]["verdict"] == "undecided"  # 0.1 and 0.2 against <= 0.10
    assert s["async_copy_over_blocking_stall"] == pytest.approx(0.05 / 0.375)
    assert s["async_busy_over_blocking_stall"] == pytest.approx(0.15 / 0.375)
    assert s["save_vs_torch_save_fsync"]["median"] == pytest.approx(1.1)
    assert s["save_vs_torch_save_fsync"]["verdict"] == "undecided"  # 1.05 and 1.15 against <= 1.1
    assert s["save_vs_floor"]["values"] == pytest.approx([2.1, 1.15])
    assert s["load_vs_torch_load"]["median"] == pytest.approx(1.3)
    assert s["load_vs_torch_load"]["ci95"][1] == pytest.approx(1.4)
    assert s["step_s_without_checkpoints"] == pytest.approx(0.25)


def test_a_checkpoint_block_is_timed_step_by_step_up_to_its_last_step_not_fits_final_save():
    from hvdazure.bench.checkpoint_torch import BlockClock

    clock = BlockClock(steps=3)
    trainer = SimpleNamespace(state=SimpleNamespace(step=0))  # test double of a Trainer: only its step count
    for step in (1, 2, 3):
        trainer.state.step = step
        clock.on_step_end(trainer)

    # steps 2 and 3, each from the end of the step before; what fit() does after step 3 (its final, blocking
    # checkpoint) is in none of them
    assert len(clock.durations) == 2 and all(d >= 0 for d in clock.durations)
