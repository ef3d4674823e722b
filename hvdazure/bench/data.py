"""Reading a sharded dataset (hvdazure.data.ShardedDataset) along each rank's plan, against a raw read of
the same bytes with the same concurrency, in the same run.

    hvdazure bench data -np 2 [--url abfs://CONTAINER/PATH] [--quick] [--json OUT.json]

The benchmark writes a dataset of tar shards (random bytes as images, 32 shards x 64 samples x 64 KB;
--quick 8 x 16 x 16 KB) to a local folder, or under --url (a folder of its own, deleted afterwards), and
reads it on -np ranks of this machine sharing one node cache, through the loader TorchTrainer uses
(hvdazure.torch.data.train_loader). Each repeat (5; --quick 1), every rank:
- raw read: this rank's shards of the epoch, whole, from the source with fsspec, 4 at a time (the
  cache's download threads);
- cold epoch: this rank's samples with the cache emptied (a local source: its files dropped from the page
  cache), no compute; the cache's downloads counted;
- warm epoch: the same again, and the raw read of the same shard files from where the loader read them;
- data wait: a cold cache, the loader's 2 workers, and a step of fixed compute (a sleep twice the cold
  epoch's read time per batch: a step whose compute exceeds its read, running elsewhere as on a GPU); the
  share of time spent waiting for batches once each worker has delivered its first;
- resume: a cold cache, the epoch started half way through: time to the first batch.
Then fresh single-rank processes read a local dataset 1x and 4x the size (more shards of the same size):
their peak RSS, rotated over rounds (3; --quick 1).

Targets (issue 21): warm-cache throughput >= 0.9 x the raw read; data wait <= 5% of step time; bytes
fetched per node per epoch <= 1.05 x the dataset (a store only: a local disk is read in place); peak RSS
of the 4x dataset <= 1.1 x the 1x one ("flat"). Figures per rank and repeat, pooled: their median with a
bootstrap 95% interval. The same run against Azurite behind a proxy with latency and a bandwidth cap:
benchmarks/data_on_azurite.py.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from hvdazure.bench import stats
from hvdazure.bench.benchmark import Jobs, Options, RankBenchmark, Result, progress
from hvdazure.bench.checkpoint import check_url
from hvdazure.figures import pyplot, save_figure

WARM_TARGET, WAIT_TARGET, FETCH_TARGET, MEMORY_TARGET = 0.9, 0.05, 1.05, 1.1


def _figure(values: list[float], target: float | None = None, at_least: bool = False) -> dict[str, Any]:
    """`values` with their median and bootstrap 95% interval; against a `target`, its verdict."""
    interval = stats.bootstrap_interval(values)
    figure: dict[str, Any] = {"values": values, "median": statistics.median(values), "ci95": list(interval)}
    if target is not None:
        verdict = stats.at_least_verdict if at_least else stats.verdict
        figure |= {"target": target, "at_least": at_least, "verdict": verdict(interval, target)}
    return figure


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Per rank and repeat: samples/s and MB/s cold and warm, the ratios to the raw reads, the data wait;
    per repeat: bytes fetched on the node over the dataset; shards touched per rank over the ideal."""
    ranks, world = result["ranks"], result["world_size"]
    bytes_per_sample = result["dataset_bytes"] / result["num_samples"]
    pooled: dict[str, list[float]] = {k: [] for k in (
        "cold_samples_s", "warm_samples_s", "cold_mb_s", "warm_mb_s", "raw_source_mb_s", "raw_local_mb_s",
        "warm_over_raw", "cold_over_raw", "wait_fraction", "resume_first_batch_s")}
    for r in ranks:
        f, mb = r["figures"], r["samples"] * bytes_per_sample / 2**20
        for i in range(len(f["cold_s"])):
            pooled["cold_samples_s"].append(r["samples"] / f["cold_s"][i])
            pooled["warm_samples_s"].append(r["samples"] / f["warm_s"][i])
            pooled["cold_mb_s"].append(mb / f["cold_s"][i])
            pooled["warm_mb_s"].append(mb / f["warm_s"][i])
            raw_source = r["read_bytes"] / 2**20 / f["raw_source_s"][i]
            raw_local = r["read_bytes"] / 2**20 / f["raw_local_s"][i]
            pooled["raw_source_mb_s"].append(raw_source)
            pooled["raw_local_mb_s"].append(raw_local)
            pooled["warm_over_raw"].append(mb / f["warm_s"][i] / raw_local)
            pooled["cold_over_raw"].append(mb / f["cold_s"][i] / raw_source)
            pooled["wait_fraction"].append(f["wait_fraction"][i])
            pooled["resume_first_batch_s"].append(f["resume_first_batch_s"][i])
    targets = {"warm_over_raw": (WARM_TARGET, True), "wait_fraction": (WAIT_TARGET, False)}
    summary: dict[str, Any] = {name: _figure(values, *targets.get(name, (None, False)))
                               for name, values in pooled.items()}
    if result["url"] is not None:
        per_repeat = [sum(r["fetched_bytes"][i] for r in ranks) / result["dataset_bytes"]
                      for i in range(len(ranks[0]["fetched_bytes"]))]
        summary["fetched_over_dataset"] = _figure(per_repeat, FETCH_TARGET)
    ideal = -(-result["num_shards"] // world)
    summary["shards_touched"] = {"per_rank": [r["shards_touched"] for r in ranks], "ideal": ideal,
                                 "max_over_ideal": max(r["shards_touched"] for r in ranks) / ideal}
    memory = result.get("memory")
    if memory:
        one, four = memory["peak_rss_mb"]["1"], memory["peak_rss_mb"]["4"]
        summary["rss_4x_over_1x"] = _figure([b / a for a, b in zip(one, four, strict=True)], MEMORY_TARGET)
    return summary


class Data(RankBenchmark):
    """One job of -np ranks reading the dataset, then the memory probes (fresh single-rank processes)."""

    name = "data"

    def check(self, options: Options) -> None:
        if options.get("url") is not None:
            check_url(options["url"])

    def measure(self, options: Options) -> Result | None:
        """On every rank of the job: the reads (rank 0 returns everyone's figures); in a probe process:
        write a dataset, or read one and report the peak RSS."""
        from hvdazure.bench import data_workload as w

        p = w.schedule(options["quick"])
        probe = options.get("probe")
        if probe == "write":
            return w.write_dataset(p, options["folder"], options["scale"])
        if probe == "read":
            return w.measure_memory(p, options["source"])
        return w.measure_ranks(options.get("url"), p, progress)

    def run(self, options: Options, jobs: Jobs) -> Result:
        from hvdazure.bench.data_workload import schedule

        p = schedule(options["quick"])
        result = {**p, **jobs.run_ranks(self.name, options, options["np"])}
        progress("data: memory probes")
        peaks: dict[str, list[float]] = {str(scale): [] for scale in p["memory_scales"]}
        with tempfile.TemporaryDirectory(prefix="hvdazure-bench-data-") as folder:
            sources = {}
            for scale in p["memory_scales"]:
                (Path(folder) / str(scale)).mkdir()
                written = jobs.single_rank_processes(
                    self.name, {**options, "probe": "write", "scale": scale,
                                "folder": f"{folder}/{scale}"}, 1, {})
                sources[str(scale)] = written[0]["source"]
            scales = list(peaks)
            for round_ in range(p["memory_rounds"]):
                for scale in scales[round_ % len(scales):] + scales[:round_ % len(scales)]:
                    read = jobs.single_rank_processes(self.name, {**options, "probe": "read",
                                                                  "source": sources[scale]}, 1, {})
                    peaks[scale].append(read[0]["peak_rss_mb"])
        result["memory"] = {"peak_rss_mb": peaks}
        return {**result, "summary": summarize(result)}

    def table(self, result: Result) -> str:
        s = result["summary"]
        where = result["url"] or "a local folder (read in place)"
        lines = [f"data: {result['num_shards']} tar shards, {result['num_samples']} samples, "
                 f"{result['dataset_bytes'] / 2**20:.0f} MB on {where}; {result['world_size']} rank(s), "
                 f"{result['repeats']} repeat(s), medians per rank and repeat (95% interval)"]

        def line(text: str, key: str, unit: str = "", digits: int = 2) -> None:
            f = s[key]
            low, high = f["ci95"]
            text = f"  {text}: {f['median']:.{digits}f}{unit} ({low:.{digits}f} to {high:.{digits}f})"
            if "target" in f:
                text += f", target {'>=' if f['at_least'] else '<='} {f['target']}: {f['verdict']}"
            lines.append(text)

        line("cold epoch, samples/s per rank", "cold_samples_s", digits=0)
        line("cold epoch, MB/s per rank", "cold_mb_s", digits=1)
        line("raw read from the source, MB/s per rank", "raw_source_mb_s", digits=1)
        line("cold epoch / raw read from the source", "cold_over_raw")
        line("warm epoch, samples/s per rank", "warm_samples_s", digits=0)
        line("warm epoch, MB/s per rank", "warm_mb_s", digits=1)
        line("raw read of the same local files, MB/s per rank", "raw_local_mb_s", digits=1)
        line("warm epoch / raw read", "warm_over_raw")
        line("data wait / step time (fixed compute, 2 loader workers, cold cache)", "wait_fraction", digits=3)
        line("time to the first batch of a resume half way, cold cache", "resume_first_batch_s", " s")
        if "fetched_over_dataset" in s:
            line("bytes fetched on the node per epoch / dataset", "fetched_over_dataset")
        else:
            lines.append("  bytes fetched per node: none (a local folder is read in place, not cached)")
        t = s["shards_touched"]
        lines.append(f"  shards touched per rank per epoch: {t['per_rank']} (ideal {t['ideal']}; the most "
                     f"{t['max_over_ideal']:.2f} x the ideal)")
        if "rss_4x_over_1x" in s:
            peaks = result["memory"]["peak_rss_mb"]
            lines.append(f"  peak RSS reading an epoch: 1x {statistics.median(peaks['1']):.0f} MB, 4x "
                         f"{statistics.median(peaks['4']):.0f} MB")
            line("peak RSS 4x dataset / 1x dataset", "rss_4x_over_1x")
        return "\n".join(lines)

    def plot(self, result: Result, path: Path) -> None:
        """Throughput per variant (MB/s per rank), and the data wait."""
        plt = pyplot()
        s = result["summary"]
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        names = ["raw_source_mb_s", "cold_mb_s", "raw_local_mb_s", "warm_mb_s"]
        left.boxplot([s[n]["values"] for n in names])
        left.set_xticks(range(1, len(names) + 1), ["raw source", "cold", "raw local", "warm"])
        left.set_ylabel("MB/s per rank")
        left.set_title(f"reading on {result['world_size']} rank(s)")
        right.boxplot([s["wait_fraction"]["values"]])
        right.axhline(WAIT_TARGET, linestyle="--", color="gray")
        right.set_xticks([1], ["data wait / step"])
        right.set_title("with a fixed compute per step")
        save_figure(fig, path)


if __name__ == "__main__":
    from hvdazure.bench.runner import main

    sys.exit(main("data"))
