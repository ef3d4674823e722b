"""`hvdazure bench data`'s figures from hand-made rank results: the ratios, the pooled intervals, the
verdicts against the issue's targets, the table. (The benchmark itself runs in tests/storage.)"""

import pytest

from hvdazure.bench.data import Data, summarize


def rank(number: int, cold: float, warm: float, raw_source: float, raw_local: float, wait: float) -> dict:
    return {"rank": number, "shards_touched": 4, "read_bytes": 2**20 * 8, "samples": 128,
            "fetched_bytes": [2**20 * 8, 2**20 * 8],
            "figures": {"cold_s": [cold] * 2, "warm_s": [warm] * 2, "raw_source_s": [raw_source] * 2,
                        "raw_local_s": [raw_local] * 2, "wait_fraction": [wait] * 2,
                        "resume_first_batch_s": [0.5] * 2, "cold_first_batch_s": [0.2] * 2},
            "compute_s": 0.01, "micro_batches": 8}


def result(url: str | None = "abfs://c") -> dict:
    # 256 samples of 64 KiB = 16 MiB; each rank reads 128 samples (8 MiB) from its 4 shards (8 MiB)
    return {"url": url, "world_size": 2, "num_shards": 8, "dataset_bytes": 2**20 * 16, "num_samples": 256,
            "repeats": 2, "ranks": [rank(0, 2.0, 0.5, 1.0, 0.25, 0.02), rank(1, 2.0, 0.5, 1.0, 0.25, 0.02)],
            "memory": {"peak_rss_mb": {"1": [200.0, 210.0], "4": [202.0, 212.0]}}}


def test_throughputs_and_ratios_come_from_samples_read_and_bytes_of_the_shards_read() -> None:
    s = summarize(result())
    assert s["warm_mb_s"]["median"] == pytest.approx(16.0)  # 8 MiB in 0.5 s
    assert s["raw_local_mb_s"]["median"] == pytest.approx(32.0)
    assert s["warm_over_raw"]["median"] == pytest.approx(0.5)
    assert s["warm_over_raw"]["verdict"] == "not met"  # the whole interval is below 0.9
    assert s["cold_over_raw"]["median"] == pytest.approx(0.5)
    assert s["cold_samples_s"]["median"] == pytest.approx(64.0)
    assert s["wait_fraction"]["verdict"] == "met"  # 0.02 <= 0.05
    assert s["fetched_over_dataset"]["median"] == pytest.approx(1.0)  # two ranks x 8 MiB of 16 MiB
    assert s["fetched_over_dataset"]["verdict"] == "met"
    assert s["shards_touched"] == {"per_rank": [4, 4], "ideal": 4, "max_over_ideal": 1.0}
    assert s["rss_4x_over_1x"]["verdict"] == "met"


def test_a_local_source_reports_no_fetched_bytes_and_the_table_says_why() -> None:
    r = result(url=None)
    r["summary"] = summarize(r)
    assert "fetched_over_dataset" not in r["summary"]
    table = Data().table(r)
    assert "read in place" in table and "warm epoch / raw read: 0.50" in table
    assert "target >= 0.9: not met" in table and "target <= 0.05: met" in table


def test_a_node_that_fetched_a_shard_twice_misses_the_fetch_target() -> None:
    r = result()
    for entry in r["ranks"]:
        entry["fetched_bytes"] = [2**20 * 12] * 2  # 24 MiB of 16: 1.5 x
    assert summarize(r)["fetched_over_dataset"]["verdict"] == "not met"
