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

MPI4PY = importlib.util.find_spec("mpi4py") is not None


def bench(tmp_path_factory: pytest.TempPathFactory, name: str, *options: str) -> tuple[dict, str, Path]:
    """Run `hvdazure bench NAME --quick --json --plot`; return the JSON, the output and the plot's path."""
    out = tmp_path_factory.mktemp(name)
    cmd = [sys.executable, "-m", "hvdazure.cli", "bench", name, "--quick", "--json", str(out / "r.json"),
           "--plot", str(out / "r.png"), *options]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((out / "r.json").read_text()), proc.stdout, out / "r.png"


def assert_machine_facts(result: dict) -> None:
    facts = result["machine"]
    assert facts["cpu_cores"] >= 1 and facts["memory_bytes"] > 0 and facts["cpu_model"]
    assert facts["versions"]["torch"] and facts["versions"]["horovod"] and facts["python"]
    assert facts["command"][:3] == ["hvdazure", "bench", result["benchmark"]]


@pytest.fixture(scope="module")
def allreduce(tmp_path_factory):
    return bench(tmp_path_factory, "allreduce", "-np", "2", "--mpi" if MPI4PY else "--gloo")


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
