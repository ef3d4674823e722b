"""`hvdazure sweep` on real MPI ranks: concurrent Horovod trials on mpi4py sub-communicators, failures,
pruning, divergence, stop and restart. The trial script (workers/sweep_trial.py) is an ordinary trainer
script; each run writes what its ranks saw into the trial's output_dir."""

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from harness import REPO, WORKERS, kill_tree, run_job
from rank_output import lines_of

from hvdazure import TrainConfig

pytest.importorskip("mpi4py")
pytest.importorskip("optuna")

SCRIPT = WORKERS / "sweep_trial.py"


def sweep_command(out: Path, space: dict, np: int, rpt: int, *options: str, script_args=()) -> list[str]:
    space_file = out.parent / f"{out.name}-space.yaml"
    space_file.write_text(yaml.safe_dump(space))
    return [sys.executable, "-m", "hvdazure.cli", "sweep", "-np", str(np), "--ranks-per-trial", str(rpt),
            str(SCRIPT), "--space", str(space_file), "--metric", "eval_loss", "--output", str(out), *options,
            "--", *script_args]


def run_sweep(cmd: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"sweep hung: {' '.join(cmd)}\n{stdout}\n{stderr}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def rank_reports(trial_dir: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(trial_dir).glob("rank-*.json"))]


def test_trials_run_concurrently_on_groups_of_ranks_and_a_failing_trial_does_not_stop_the_sweep(tmp_path):
    out = tmp_path / "sweep"
    space = {"lr": {"type": "choice", "values": [0.05, 0.02]},
             "extra.behaviour": {"type": "choice", "values": ["ok", "raise"]}}
    # the trials shard their optimizer state and gradients (zero_stage 2, a bucket a tensor: reduce-scatters
    # from backward hooks on each trial's parameters), one trial after another on each group's processes
    done = run_sweep(sweep_command(out, space, 4, 2, "--sampler", "grid", "--trials", "10",
                                   script_args=["--set", "base_batch_size=8",
                                                "--set", "extra.step_sleep=0.03", "--set", "zero_stage=2",
                                                "--set", "zero_bucket_mb=0.000001"]))
    assert done.returncode == 0, done.stdout + done.stderr
    trials = results(out)["trials"]

    # the grid, each point exactly once (--trials 10 is capped at the grid's 4 points)
    points = sorted((t["params"]["lr"], t["params"]["extra.behaviour"]) for t in trials)
    assert points == sorted((lr, b) for lr in (0.05, 0.02) for b in ("ok", "raise"))
    # a trial whose rank 1 raised while rank 0 waited in a collective: failed, with rank 1's error
    for t in trials:
        if t["params"]["extra.behaviour"] == "raise":
            assert t["state"] == "failed" and "trial asked to fail on rank 1" in t["error"], t
        else:
            assert t["state"] == "complete" and t["value"] > 0, t
    assert "failed after" in done.stdout and "trial asked to fail on rank 1" in done.stdout

    ok = [t for t in trials if t["state"] == "complete"]
    reports = {t["trial"]: rank_reports(t["dir"]) for t in ok}
    for t in ok:
        ranks = reports[t["trial"]]
        # each trial: its own Horovod world of 2 ranks, on the ranks the sweep says
        assert [(r["rank"], r["size"]) for r in ranks] == [(0, 2), (1, 2)]
        assert [r["world_rank"] for r in ranks] == t["ranks"]
        assert ranks[0]["params"] == ranks[1]["params"]  # identical within the group
        assert ranks[0]["config"]["lr"] == t["params"]["lr"] and ranks[0]["config"]["seed"] == t["seed"]
        assert ranks[0]["config"]["output_dir"] == t["dir"]
    a, b = (reports[t["trial"]][0] for t in ok)
    assert a["params"] != b["params"]  # different trials, different models
    # two trials at once: some pair of trials on different groups overlapped in time
    spans = [(r["start"], r["end"], tuple(t["ranks"])) for t in trials for r in rank_reports(t["dir"])[:1]]
    spans += [(t["start"], t["end"], tuple(t["ranks"])) for t in trials]
    assert any(s1[2] != s2[2] and s1[0] < s2[1] and s2[0] < s1[1] for s1 in spans for s2 in spans), spans

    # data-parallel equivalence inside a trial: 2 ranks x batch 4 (sharded) == 1 rank x batch 8, same seed
    trial = next(t for t in ok if t["params"]["lr"] == 0.05)
    reference = tmp_path / "reference"
    subprocess.run([sys.executable, str(SCRIPT), "--set", "lr=0.05", "--set", "batch_size=8", "--set",
                    "base_batch_size=8", "--set", f"seed={trial['seed']}", "--set", f"output_dir={reference}",
                    "--set", "progress_bar=false"], check=True, cwd=REPO, capture_output=True, timeout=120)
    one = json.loads((reference / "rank-0.json").read_text())
    np.testing.assert_allclose(reports[trial["trial"]][0]["params"], one["params"], rtol=0, atol=1e-10)

    # results: CSV, a best.yaml that --config accepts, a plot
    best = results(out)["best"]
    assert best["value"] == min(t["value"] for t in ok)
    config = TrainConfig.from_yaml(out / "best.yaml")
    assert config.lr == best["params"]["lr"] and config.extra["behaviour"] == "ok"
    assert len((out / "results.csv").read_text().splitlines()) == 5
    assert (out / "sweep.png").stat().st_size > 1000
    assert "best: trial" in done.stdout


def test_pruning_stops_a_bad_trial_early_and_a_diverged_trial_is_not_a_success(tmp_path):
    out = tmp_path / "sweep"
    space = {"lr": {"type": "choice", "values": [0.05, 1e-6]},
             "extra.behaviour": {"type": "choice", "values": ["ok", "nan"]}}
    done = run_sweep(sweep_command(out, space, 2, 2, "--sampler", "grid", "--pruner", "median", "--seed", "4",
                                   "--mlflow", script_args=["--set", "epochs=4"]))
    assert done.returncode == 0, done.stdout + done.stderr
    trials = sorted(results(out)["trials"], key=lambda t: t["trial"])
    by_params = {(t["params"]["lr"], t["params"]["extra.behaviour"]): t for t in trials}
    # one group: trials run one after another; seed 4 puts the good trial first, so the median pruner has
    # a finished trial to compare the others with
    assert trials[0]["params"] == {"lr": 0.05, "extra.behaviour": "ok"}, trials
    assert trials[0]["state"] == "complete" and trials[0]["epochs"] == 4
    bad = by_params[(1e-6, "ok")]
    assert bad["state"] == "pruned" and bad["epochs"] < 4, bad
    diverged = by_params[(0.05, "nan")]
    assert diverged["state"] == "diverged" and diverged["epochs"] < 4, diverged
    assert "diverged" in diverged["error"]
    # the trainer stopped it at its next log interval (on_nan_loss: stop), and the sweep kept its line
    assert "training_step returned a non-finite loss (nan) at step" in diverged["error"], diverged
    assert results(out)["best"]["trial"] == trials[0]["trial"]

    # --mlflow: a child run per trial under one run for the sweep, in the sweep's store
    mlflow = pytest.importorskip("mlflow")
    client = mlflow.MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("hvdazure").experiment_id])
    parent = next(r for r in runs if "hvdazure.sweep" in r.data.tags)
    children = {r.info.run_name: r for r in runs
                if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert sorted(children) == [f"trial-{t['trial']:04d}" for t in trials]
    assert children["trial-0000"].info.status == "FINISHED"
    assert children["trial-0000"].data.metrics["eval_loss"] == pytest.approx(trials[0]["value"])
    assert parent.data.metrics["best_eval_loss"] == pytest.approx(trials[0]["value"])
    assert parent.info.status == "FINISHED"


def _log(trial_dir: str | Path) -> str:
    path = Path(trial_dir) / "trial.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _one_finished_and_one_training(out: Path, printed: list[str]) -> bool:
    """The sweep has said a trial is complete and another is inside fit() (it logged "training on"), so a
    SIGTERM now stops at least one trial that checkpoints (a fixed pause could land while the next trials
    were all still starting, or after every trial had finished, on a loaded machine)."""
    finished = any(" complete in " in line for line in printed)
    trials = [d for d in out.glob("trials/*") if d.is_dir()]
    training = [d for d in trials if not (d / "rank-0.json").exists() and "training on" in _log(d)]
    return bool(finished and training)


def test_a_stopped_sweep_resumes_without_rerunning_finished_trials(tmp_path):
    out = tmp_path / "sweep"
    space = {"lr": {"type": "uniform", "min_value": 0.01, "max_value": 0.05}}
    hold = tmp_path / "hold"  # the trials after the first train slowly until the sweep is stopped
    hold.write_text("")
    cmd = sweep_command(out, space, 2, 1, "--sampler", "random", "--trials", "4",
                        script_args=["--set", "extra.step_sleep=0.04", "--set", f"extra.hold_file={hold}"])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    printed: list[str] = []  # stdout, line by line as the sweep prints it; stderr whole
    errors: list[str] = []
    readers = [threading.Thread(target=lambda: printed.extend(proc.stdout), daemon=True),
               threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + 120
        while not _one_finished_and_one_training(out, printed) and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
        for reader in readers:
            reader.join(timeout=10)
        stdout, stderr = "".join(printed), "".join(errors)
    finally:
        kill_tree(proc.pid)
    assert proc.returncode == 128 + signal.SIGTERM, stdout + stderr
    trials = results(out)["trials"]
    first = {t["trial"]: t["state"] for t in trials}
    finished = {n for n, state in first.items() if state == "complete"}
    stopped = {n for n, state in first.items() if state == "running"}
    # stopped inside fit(): they saved a checkpoint; a trial stopped while it was still starting has none
    training = {t["trial"] for t in trials if t["trial"] in stopped and "training on" in _log(t["dir"])}
    assert finished and training, (first, stdout, stderr)

    hold.unlink()
    again = run_sweep(cmd)
    assert again.returncode == 0, again.stdout + again.stderr
    final = {t["trial"]: t for t in results(out)["trials"]}
    assert sorted(final) == [0, 1, 2, 3] and all(t["state"] == "complete" for t in final.values()), final
    for n in finished:
        assert f"trial {n} starts" not in again.stdout and f"trial {n} resumes" not in again.stdout
    for n in stopped:
        assert f"trial {n} resumes" in again.stdout
    for n in training:
        log = _log(final[n]["dir"])
        assert "resumed from" in log, log


def test_a_trainer_on_a_communicator_under_gloo_fails_on_every_rank_in_one_line(tmp_path):
    script = tmp_path / "comm_under_gloo.py"
    script.write_text("\n".join([
        "import sys", f"sys.path.insert(0, {str(WORKERS)!r})", "from mpi4py import MPI",
        "from sweep_trial import SweptRegression", "from hvdazure import TrainConfig",
        "SweptRegression(TrainConfig(progress_bar=False), comm=MPI.COMM_SELF).fit()", ""]))
    job = run_job(script, out_dir=tmp_path, np=2, controller="gloo", env={"OMPI_MCA_btl": "self,tcp"})
    assert job.returncode != 0
    said = [rank for rank in (0, 1)
            if any("needs Horovod's MPI controller" in line for line in lines_of(job.stderr, rank))]
    assert said == [0, 1], job.output  # every rank says it
    assert "Traceback" not in job.output


def test_a_metric_the_trials_do_not_have_stops_the_sweep_with_the_metrics_they_have(tmp_path):
    out = tmp_path / "sweep"
    cmd = sweep_command(out, {"lr": {"type": "choice", "values": [0.05, 0.02, 0.01]}}, 2, 1, "--trials", "3")
    cmd[cmd.index("eval_loss")] = "eval_acc"
    done = run_sweep(cmd)
    assert done.returncode == 1, done.stdout + done.stderr
    line = "--metric 'eval_acc' is not in the trial's history; its metrics are eval_loss, train_loss"
    assert line in done.stderr
    trials = results(out)["trials"]
    assert len(trials) == 2 and {t["state"] for t in trials} == {"failed"}  # no third trial was started
