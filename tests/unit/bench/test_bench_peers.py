"""`hvdazure bench peers`' framework-free side: how each peer is started, a run's figures from its ranks'
step times, the paired ratios and targets, the report, and one-line errors before anything starts. The
benchmark itself, every peer on real processes: tests/distributed/test_bench.py."""

import json
import sys
from pathlib import Path

import pytest

from hvdazure.bench import peers
from hvdazure.bench.benchmark import BenchError
from hvdazure.bench.peers_workload import PeerSpec


def launch(tmp_path, gpus=False, np_=2):
    return peers.Launch(np_, "/s/script.py", "/s/spec.json", 29999, tmp_path, gpus)


def peer(name, framework="torch"):
    return next(p for p in peers.PEERS if p.name == name and p.framework == framework)


def test_each_peer_is_started_the_way_its_users_start_it(tmp_path):
    (ddp_argv, _), = peer("torchrun + DDP").commands(launch(tmp_path))
    assert ddp_argv[0].endswith("torchrun") and ddp_argv[1:] == ["--standalone", "--nproc-per-node=2",
                                                                 "/s/script.py", "/s/spec.json"]
    (lightning_argv, lightning_env), = peer("Lightning Trainer").commands(launch(tmp_path))
    assert lightning_argv[1:] == ["/s/script.py", "/s/spec.json", "2"]  # Lightning starts rank 1 itself
    assert lightning_env == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
    for controller in ("gloo", "mpi"):
        (argv, _), = peer(f"hvdazure ({controller.title() if controller == 'gloo' else 'MPI'})").commands(
            launch(tmp_path))
        assert argv[1:] == ["-m", "hvdazure.cli", "run", "-np", "2", f"--{controller}", "/s/script.py",
                            "/s/spec.json"]


def test_accelerate_uses_its_multi_cpu_launcher_on_cpus_and_multi_gpu_on_gpus(tmp_path):
    (cpu_argv, cpu_env), = peer("HF Accelerate").commands(launch(tmp_path))
    assert cpu_argv[1:8] == ["launch", "--num_processes", "2", "--num_machines", "1", "--cpu",
                             "--mpirun_hostfile"]
    assert Path(cpu_argv[8]).read_text() == "localhost slots=2\n" and cpu_env["MASTER_PORT"] == "29999"
    (gpu_argv, _), = peer("HF Accelerate").commands(launch(tmp_path, gpus=True))
    assert "--multi_gpu" in gpu_argv and "--cpu" not in gpu_argv


def test_multi_worker_mirrored_strategy_gets_one_process_per_worker_each_with_its_index(tmp_path):
    commands = peer("MultiWorkerMirroredStrategy", "tensorflow").commands(launch(tmp_path, np_=3))
    configs = [json.loads(env["TF_CONFIG"]) for _, env in commands]
    assert [c["task"] for c in configs] == [{"type": "worker", "index": i} for i in range(3)]
    workers = configs[0]["cluster"]["worker"]
    assert all(c["cluster"]["worker"] == workers for c in configs)
    assert len(set(workers)) == 3 and all(w.startswith("127.0.0.1:") for w in workers)


def test_a_peer_whose_package_or_launcher_is_missing_says_which():
    missing_module = peers.Peer("x", "torch", "ddp.py", ("no_such_module_here",), peers._torchrun)
    assert "no_such_module_here is not installed" in missing_module.missing()
    missing_program = peers.Peer("x", "torch", "ddp.py", ("json",), peers._torchrun, "no-such-launcher")
    assert missing_program.missing() == "no-such-launcher is not on PATH"


def rank(index, ends, launched_at=100.0, rss=2**30):
    return {"rank": index, "world_size": 2, "step_ends": ends, "launched_at": launched_at,
            "max_rss_bytes": rss, "threads": 1, "backend": "gloo"}


def test_a_runs_figures_are_its_timed_steps_on_the_slowest_rank_and_its_first_step_on_every_rank():
    spec = PeerSpec("mlp", batch_size=64, warmup=2, steps=6, out_dir="")
    fast = rank(0, [103.0, 104.0, 105.0, 106.0, 107.0, 108.0])
    slow = rank(1, [104.0, 104.5, 105.0, 107.0, 109.0, 111.0], rss=2**31)  # 6 s for the 4 timed steps
    figures = peers.run_figures([fast, slow], spec, wall_s=20.0)

    assert figures["samples_per_s"] == pytest.approx(4 * 64 * 2 / 6.5)
    assert figures["first_step_s"] == pytest.approx(4.0)
    assert figures["wall_s"] == 20.0 and figures["peak_rss_bytes"] == [2**30, 2**31]
    assert figures["facts"] == {"world_size": 2, "threads": 1, "backend": "gloo"}


def test_a_rank_that_ran_another_number_of_steps_is_an_error():
    spec = PeerSpec("mlp", batch_size=64, warmup=2, steps=6, out_dir="")
    with pytest.raises(BenchError, match="rank 1 ran 5 steps, expected 6"):
        peers.run_figures([rank(0, [1.0] * 6), rank(1, [1.0] * 5)], spec, wall_s=1.0)


def runs(samples_per_s, first_step_s):
    return [{"samples_per_s": s, "first_step_s": f, "wall_s": f + 5, "peak_rss_bytes": [2**29]}
            for s, f in zip(samples_per_s, first_step_s, strict=True)]


def test_ratios_are_paired_by_round_and_targets_compare_with_the_fastest_and_the_slowest_peer():
    summary = peers.summarize("mlp", {
        "hvdazure (MPI)": runs([100, 110, 90], [5, 5, 5]),
        "torchrun + DDP": runs([80, 100, 90], [3, 3, 3]),
        "Lightning Trainer": runs([50, 50, 50], [10, 12, 11]),
    })
    assert summary["regime"] == "latency-bound"
    ratio = summary["ratios"]["hvdazure (MPI)"]["torchrun + DDP"]["samples_per_s"]
    assert ratio["median"] == pytest.approx(1.1)  # the rounds' ratios 1.25, 1.1, 1.0
    target = summary["targets"]["hvdazure (MPI)"]
    assert target["samples_per_s_vs_fastest"]["peer"] == "torchrun + DDP"
    assert target["samples_per_s_vs_fastest"]["target_at_least"] == 0.95
    assert target["samples_per_s_vs_fastest"]["verdict"] == "met"
    assert target["first_step_vs_slowest"]["peer"] == "Lightning Trainer"
    assert target["first_step_vs_slowest"]["verdict"] == "met"
    assert summary["peers"]["Lightning Trainer"]["first_step_s"]["mean"] == pytest.approx(11.0)
    assert "hvdazure (MPI)" not in summary["ratios"]["hvdazure (MPI)"]


def test_compute_bound_regimes_aim_at_the_fastest_peers_speed_itself():
    summary = peers.summarize("cnn", {"hvdazure (Gloo)": runs([90, 91], [5, 5]),
                                      "torchrun + DDP": runs([100, 100], [4, 4])})
    target = summary["targets"]["hvdazure (Gloo)"]
    assert summary["regime"] == "compute-bound"
    assert target["samples_per_s_vs_fastest"]["target_at_least"] == 1.0
    assert target["samples_per_s_vs_fastest"]["verdict"] == "not met"
    assert target["first_step_vs_slowest"]["verdict"] == "not met"


def test_without_other_peers_there_is_no_target_to_report():
    assert peers.summarize("mlp", {"hvdazure (Gloo)": runs([90], [5])})["targets"] == {}


@pytest.mark.parametrize(("options", "message"), [
    ({"np": 1}, "-np must be at least 2, got 1"),
    ({"rounds": 0}, "--rounds must be at least 1, got 0"),
])
def test_bad_options_are_one_line_before_anything_starts(options, message):
    with pytest.raises(BenchError, match=message):
        peers.Peers().check({"np": 2, "rounds": None, "model": None, "framework": "both", **options})


def test_resnet50_without_torchvision_is_refused_before_anything_starts(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: None if name == "torchvision" else real(name))
    with pytest.raises(BenchError, match="--model resnet50 needs torchvision"):
        peers.Peers().check({"np": 2, "rounds": None, "model": "resnet50", "framework": "torch"})
    peers.Peers().check({"np": 2, "rounds": None, "model": "resnet50", "framework": "tensorflow"})


def test_both_regimes_by_default_and_the_steps_of_each():
    assert peers.chosen_models(None) == ["mlp", "cnn"] and peers.chosen_models("resnet50") == ["resnet50"]
    spec = PeerSpec.for_model("cnn", quick=False, out_dir="x")
    assert (spec.batch_size, spec.warmup, spec.steps, spec.samples(2)) == (64, 5, 45, 45 * 64 * 2)
    assert PeerSpec.for_model("mlp", quick=True, out_dir="x").steps == 6


def test_the_table_shows_every_peer_the_targets_and_the_skipped_ones_with_why():
    summary = peers.summarize("mlp", {"hvdazure (MPI)": runs([100], [5]), "torchrun + DDP": runs([80], [3])})
    result = {"world_size": 2, "threads_per_rank": 1, "rounds": 1,
              "steps": {"mlp": {"warmup": 2, "timed": 4, "batch_per_rank": 64}},
              "results": {"mlp": {"torch": {"runs": {}, "summary": summary}}},
              "skipped": [{"peer": "HF Accelerate", "framework": "torch",
                           "reason": "accelerate is not installed"}]}
    table = peers.Peers().table(result)
    assert "mlp (latency-bound), torch" in table and "torchrun + DDP" in table
    assert "hvdazure (MPI): samples/s / torchrun + DDP (fastest) 1.25" in table
    assert "skipped: HF Accelerate (torch): accelerate is not installed" in table


FAKE_PEER = """
import json, os, resource, sys, time
spec = json.load(open(sys.argv[1]))
if os.environ.get("FAKE_FAIL"):
    sys.exit("the fake peer's launcher failed")
start = time.time()
for rank in range(2):
    ends = [start + 0.01 * (step + 1) for step in range(spec["steps"])]
    result = {"rank": rank, "world_size": 2, "step_ends": ends, "launched_at": float(os.environ["%s"]),
              "max_rss_bytes": 2**20, "threads": int(os.environ["OMP_NUM_THREADS"])}
    with open(os.path.join(spec["out_dir"], f"rank{rank}.json"), "w") as out:
        json.dump(result, out)
"""


class JobsDouble:
    """Test double of the bench's Jobs: all Peers.run reads of it is the timeout per job."""
    timeout_s = 60.0


def fake_peers(tmp_path, failing):
    """Peers that run a script of a few lines instead of a framework: each writes both ranks' results,
    or exits 1 (the names in `failing`)."""
    script = tmp_path / "fake_peer.py"
    script.write_text(FAKE_PEER % peers.LAUNCHED_AT)

    def commands(name):
        env = {"FAKE_FAIL": "1"} if name in failing else {}
        return lambda launch: [([sys.executable, launch.script, launch.spec], env)]

    return [peers.Peer(name, "torch", str(script), ("json",), commands(name))
            for name in ("hvdazure (fake)", "good peer", "broken peer")]


def options(**changes):
    return {"np": 2, "quick": True, "rounds": 2, "model": "mlp", "framework": "torch", **changes}


def test_a_failing_peer_is_left_out_with_the_reason_and_the_others_are_measured_and_paired(tmp_path):
    result = peers.Peers(fake_peers(tmp_path, failing={"broken peer"})).run(options(), JobsDouble())

    summary = result["results"]["mlp"]["torch"]["summary"]
    assert set(summary["peers"]) == {"hvdazure (fake)", "good peer"}
    assert len(result["results"]["mlp"]["torch"]["runs"]["good peer"]) == 2
    assert set(summary["ratios"]["hvdazure (fake)"]) == {"good peer"}
    (failure,) = result["failed"]
    assert (failure["peer"], failure["model"], failure["round"]) == ("broken peer", "mlp", 1)
    assert "the fake peer's launcher failed" in failure["reason"]
    assert "failed, left out of mlp: broken peer (torch), round 1" in peers.Peers().table(
        {**result, "options": options()})


def test_hvdazure_failing_ends_the_benchmark_with_its_error(tmp_path):
    with pytest.raises(BenchError, match=r"hvdazure \(fake\) \(torch, mlp\) failed"):
        peers.Peers(fake_peers(tmp_path, failing={"hvdazure (fake)"})).run(options(rounds=1), JobsDouble())
