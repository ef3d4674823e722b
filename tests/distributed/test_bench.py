"""`hvdazure bench` on real ranks, each benchmark once in its --quick configuration (seconds): the JSON's
shape and sanity (positive times, every peer measured or skipped with a reason, finite ratios). No timing
is asserted: these check that the benchmarks run and report, not how fast anything is."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from hvdazure.bench import registry

MPI4PY = importlib.util.find_spec("mpi4py") is not None


COMMANDS = {
    "allreduce": ["-np", "2", "--mpi" if MPI4PY else "--gloo"],
    # PyTorch only: the TensorFlow job's start-up and tracing alone would take the suite's whole budget
    "overhead": ["-np", "2", "--framework", "torch", "--mpi"],
    # PyTorch only: the TensorFlow side (checked by hand, `--framework tensorflow --quick`) adds about 25 s
    "throughput": ["-np", "2", "--framework", "torch", "--mpi"],
    "checkpoint": ["-np", "1", "--mpi"],
    "launch": ["-np", "1", "--mpi"],
    # every peer of both frameworks, started by its own launcher, in the latency-bound regime's few steps
    "peers": ["-np", "2", "--model", "mlp"],
}
TIMEOUT_S = {"peers": 600}  # eight jobs one after the other, beside the others; the rest: 180 s each


@pytest.fixture(scope="module")
def benches(tmp_path_factory) -> dict[str, tuple[dict, str, Path]]:
    """Every `hvdazure bench NAME --quick --json` of COMMANDS, started at once (no timing is asserted, and
    together they take half the time); each benchmark's plot is drawn here from its JSON, in this process
    (what --plot calls, without loading matplotlib four more times). Each benchmark's JSON, output, plot."""
    out = tmp_path_factory.mktemp("bench")
    procs = {name: subprocess.Popen(
        [sys.executable, "-m", "hvdazure.cli", "bench", name, "--quick", "--json", str(out / f"{name}.json"),
         *options], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name, options in COMMANDS.items()}
    results = {}
    for name, proc in procs.items():
        output, _ = proc.communicate(timeout=TIMEOUT_S.get(name, 180))
        assert proc.returncode == 0, f"{name}:\n{output}"
        result = json.loads((out / f"{name}.json").read_text())
        registry.load(name).plot(result, out / f"{name}.png")
        results[name] = result, output, out / f"{name}.png"
    return results


def assert_machine_facts(result: dict) -> None:
    facts = result["machine"]
    assert facts["cpu_cores"] >= 1 and facts["memory_bytes"] > 0 and facts["cpu_model"]
    assert facts["versions"]["torch"] and facts["versions"]["horovod"] and facts["python"]
    assert facts["command"][:3] == ["hvdazure", "bench", result["benchmark"]]


@pytest.fixture(scope="module")
def allreduce(benches):
    return benches["allreduce"]


def test_allreduce_reports_every_peer_at_every_size_or_why_it_was_skipped(allreduce):
    result, _, _ = allreduce
    peers = result["peers"]
    assert {"hvdazure", "hvdazure fp16", "horovod", "torch.distributed gloo", "mpi4py"} <= set(peers)
    assert peers["mpi4py"]["status"] == ("measured" if MPI4PY else "skipped")
    for name, peer in peers.items():
        assert peer["status"] == "measured" or peer["reason"], name
    measured = {name for name, peer in peers.items() if peer["status"] == "measured"}
    assert {(r["peer"], r["bytes"]) for r in result["rows"]} == {(p, s) for p in measured
                                                                  for s in result["sizes"]}
    assert result["sizes"][0] == 4096 and result["sizes"][-1] == 16 * 2**20


def test_allreduce_figures_are_positive_and_bus_bandwidth_follows_the_nccl_tests_factor(allreduce):
    result, _, _ = allreduce
    for row in result["rows"]:
        assert row["latency_us"] > 0 and all(t > 0 for t in row["times_s"])
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 2 * (2 - 1) / 2)
    ratios = result["summary"]["bandwidth_ratios_at_1MB_and_more"]
    assert "hvdazure / horovod" in ratios
    assert all(math.isfinite(v) for c in ratios.values() for v in [c["median"], *c["ci95"]])
    assert result["summary"]["target"]["verdict"] in ("met", "not met", "undecided")


def test_allreduce_prints_a_table_on_rank_0_and_writes_the_machine_facts_and_a_plot(allreduce):
    result, stdout, png = allreduce
    assert "busbw GB/s" in stdout and "target hvdazure / horovod" in stdout
    assert_machine_facts(result)
    assert png.stat().st_size > 0


@pytest.fixture(scope="module")
def overhead(benches):
    return benches["overhead"]


def test_overhead_pairs_blocks_and_reports_a_finite_ratio_with_its_interval(overhead):
    result, stdout, png = overhead
    torch_run = result["frameworks"]["torch"]
    assert torch_run["status"] == "measured" and torch_run["trainer"] == "TorchTrainer"
    blocks = torch_run["block_seconds"]
    assert len(blocks["hand-written"]) == len(blocks["trainer"]) == torch_run["pairs"] >= 2
    assert all(t > 0 for times in blocks.values() for t in times)
    s = torch_run["summary"]
    low, high = s["ratio_ci95"]
    assert all(math.isfinite(v) and v > 0 for v in (s["ratio_median"], low, high))
    assert low <= s["ratio_median"] <= high
    assert s["target"]["verdict"] in ("met", "not met", "undecided")
    assert s["trainer_bookkeeping_us_per_step"]["n"] == torch_run["pairs"]
    assert "target <= 1.02" in stdout and png.stat().st_size > 0
    # and what timing the step's phases costs: the trainer against itself with step_times off
    assert len(blocks["trainer, step_times off"]) == torch_run["pairs"]
    timing = s["step_times"]
    assert len(timing["ratio_per_pair"]) == torch_run["pairs"]
    assert timing["ratio_ci95"][0] <= timing["ratio_median"] <= timing["ratio_ci95"][1]
    assert timing["target"]["verdict"] in ("met", "not met", "undecided")
    assert "timing the step's phases (trainer / step_times off)" in stdout and "target <= 1.01" in stdout
    assert_machine_facts(result)


def test_throughput_runs_one_rank_n_ranks_and_n_independent_processes_and_reports_efficiencies(benches):
    result, stdout, png = benches["throughput"]
    assert list(result["frameworks"]) == ["torch"]
    torch_run = result["frameworks"]["torch"]
    assert torch_run["status"] == "measured" and torch_run["trainer"] == "TorchTrainer"
    runs = torch_run["runs"]
    assert list(runs) == ["1 rank", "2 ranks", "2 independent"]
    assert [len(run["rates_per_rank"]) for run in runs.values()] == [1, 2, 2]
    assert all(len(rates) == result["batches"] * result["rounds"] and all(r > 0 for r in rates)
               for run in runs.values() for rates in run["rates_per_rank"])
    s = torch_run["summary"]
    for key in ("weak_scaling_efficiency", "ceiling_efficiency", "share_of_ceiling"):
        assert s[key]["value"] > 0 and all(math.isfinite(v) for v in s[key]["ci95"]), key
    assert s["samples_per_s"]["2 ranks"]["total"]["mean"] > 0
    assert s["target"]["verdict"] in ("met", "not met", "undecided")
    assert "weak-scaling efficiency" in stdout and png.stat().st_size > 0
    assert_machine_facts(result)


def test_launch_times_the_bare_launcher_and_hvdazure_run_alike(benches):
    result, stdout, png = benches["launch"]
    assert result["launcher"] == "mpirun" and result["world_size"] == 1
    assert set(result["times_s"]) == {"mpirun", "hvdazure run"}
    assert all(len(times) == result["repeats"] and all(t > 0 for t in times)
               for times in result["times_s"].values())
    s = result["summary"]
    assert s["bare_median_s"] > 0 and s["hvdazure_median_s"] > 0 and math.isfinite(s["overhead_s_median"])
    assert "hvdazure run (s)" in stdout and png.stat().st_size > 0
    assert_machine_facts(result)


def test_checkpoint_compares_save_and_load_with_bare_torch_and_measures_both_stalls(benches):
    result, stdout, png = benches["checkpoint"]
    assert set(result["save_load_s"]) == {"torch.save", "torch.save + fsync", "write + fsync",
                                          "hvdazure save", "hvdazure save + retention",
                                          "hvdazure save, CPU time", "async copy", "torch.load",
                                          "hvdazure load"}
    times = result["save_load_s"]
    assert all(a < b for a, b in zip(times["hvdazure save"], times["hvdazure save + retention"], strict=True))
    assert all(len(t) == result["repeats"] and all(v > 0 for v in t) for t in result["save_load_s"].values())
    assert all(len(blocks) == result["pairs"] for blocks in result["step_s"].values())
    assert all(len(steps) == result["steps"] - 1 and min(steps) > 0
               for blocks in result["step_s"].values() for steps in blocks)
    s = result["summary"]
    for key in ("save_vs_torch_save_fsync", "save_vs_torch_save", "save_vs_floor", "load_vs_torch_load"):
        assert s[key]["median"] > 0 and all(math.isfinite(v) for v in s[key]["ci95"]), key
    stall = s["async_stall_over_blocking"]  # a stall may come out below zero: noise, in --quick's one round
    assert math.isfinite(stall["median"]) and all(math.isfinite(v) for v in stall["ci95"])
    for key in ("save_vs_torch_save_fsync", "load_vs_torch_load", "async_stall_over_blocking"):
        assert s[key]["verdict"] in ("met", "not met", "undecided"), key
    assert set(s["stall_s_per_checkpoint"]) == {"none", "async", "blocking"}
    assert all(math.isfinite(st["median"]) for st in s["stall_s_per_checkpoint"].values())
    peak = result["memory"]  # fresh processes: each probe's peak RSS, and the checkpoint they wrote
    assert set(peak["peak_rss_mb"]) == {"baseline", "async save", "blocking save", "resume"}
    assert 3.5 < peak["checkpoint_mb"] < 5  # --quick: a 4 MB model, SGD without momentum state
    assert set(peak["added_over_checkpoint"]) == {"async save", "blocking save", "resume"}
    assert "stall per blocking checkpoint" in stdout and "resume / checkpoint size" in stdout
    assert png.stat().st_size > 0
    assert_machine_facts(result)


def test_peers_measures_every_peer_of_both_frameworks_or_says_why_it_was_skipped(benches):
    result, stdout, png = benches["peers"]
    from hvdazure.bench.peers import PEERS

    assert result["rounds"] == 1 and result["world_size"] == 2 and list(result["results"]) == ["mlp"]
    measured = {(framework, name) for framework, r in result["results"]["mlp"].items()
                for name in r["summary"]["peers"]}
    skipped = {(s["framework"], s["peer"]) for s in result["skipped"]}
    assert not result["failed"], result["failed"]  # make setup installs every peer: none may fail here
    assert measured | skipped == {(p.framework, p.name) for p in PEERS} and not measured & skipped
    assert all(s["reason"] for s in result["skipped"])
    assert ("torch", "hvdazure (Gloo)") in measured and ("torch", "torchrun + DDP") in measured
    steps = result["steps"]["mlp"]
    for framework, r in result["results"]["mlp"].items():
        for name, runs in r["runs"].items():
            (run,) = runs
            assert run["samples_per_s"] > 0 and 0 < run["first_step_s"] < run["wall_s"], (framework, name)
            assert len(run["peak_rss_bytes"]) == 2 and min(run["peak_rss_bytes"]) > 2**20
            assert run["facts"]["world_size"] == 2 and run["facts"]["threads"] == result["threads_per_rank"]
        for ours, ratios in r["summary"]["ratios"].items():
            assert ours.startswith("hvdazure") and ratios
            for ratio in ratios.values():
                figures = [v for f in ratio.values() for v in [f["median"], *f["ci95"]]]
                assert all(math.isfinite(v) and v > 0 for v in figures)
        for target in r["summary"]["targets"].values():
            assert target["samples_per_s_vs_fastest"]["verdict"] in ("met", "not met", "undecided")
            assert target["first_step_vs_slowest"]["verdict"] in ("met", "not met", "undecided")
    torch_runs = result["results"]["mlp"]["torch"]["runs"]
    controllers = {run["facts"]["controller"] for name, runs in torch_runs.items()
                   if name.startswith("hvdazure") for run in runs}
    assert controllers == {"gloo", "mpi"}  # what each hvdazure run really ran on, asked of Horovod
    assert f"{steps['warmup']} warm-up + {steps['timed']} timed steps" in stdout and png.stat().st_size > 0
    assert_machine_facts(result)
