"""The trainer's checkpoint guarantees on real ranks (Gloo and MPI) with `checkpoint_dir=abfs://...` on
Azurite, through the public API only (tests/distributed/workers/torch_job.py, `hvdazure run`): a rank killed
mid-epoch and the run resumed ends bit-identical to the uninterrupted run; a corrupt or truncated newest
checkpoint falls back to the previous one; 2 -> 1 -> 2 ranks trains every sample of every epoch once;
503s, dropped connections and truncated bodies (the fault proxy) during a save and during a resume are
survived; a wrong key or a missing container is one line on every rank, a non-zero exit and no hang.

The ranks are subprocesses: they get the connection string (the proxy's port for the fault tests) through
the environment, as a user's job does, and run the worker through workers/blob_torch_job.py, which only
shortens the retry waits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import fsspec
import pytest
from distributed.harness import TorchRuns, kill_tree, processes_running, set_args
from distributed.harness import train as train_job
from distributed.rank_output import lines_of

from storage.azurite import ACCOUNT_KEY, Azurite, forget_filesystems
from storage.conftest import ProxiedBlob

pytestmark = pytest.mark.distributed

JOB = Path(__file__).resolve().parent / "workers" / "blob_torch_job.py"
# 37 samples, batch 4 on 2 ranks: 5 steps per epoch with an uneven last step; checkpoints every 3 steps
BASE = ("epochs=3", "batch_size=4", "extra.n_train=37", "lr=0.05", "checkpoint_every_steps=3",
        "checkpoint_every_epochs=null")
CONTROLLERS = ("gloo", "mpi")


train = partial(train_job, JOB, timeout=180)  # (tmp_path, name, *settings, np, controller, expect, env)


def _fs(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    forget_filesystems()  # a fresh client: listings cached by an earlier one would hide the ranks' writes
    return fsspec.core.url_to_fs(url)


def _latest(run: str) -> str | None:
    fs, path = _fs(run)
    try:
        return fs.cat_file(f"{path}/latest").decode().strip()
    except FileNotFoundError:
        return None


def _checkpoints(run: str) -> list[str]:
    """The names under `run` that hold a manifest (a committed checkpoint), oldest first."""
    fs, path = _fs(run)
    return sorted(p.split("/")[-2] for p in fs.glob(f"{path}/step-*/manifest.json"))


def _damage(url: str, how: str) -> None:
    fs, path = _fs(url)
    data = bytearray(fs.cat_file(path))
    if how == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0x01
    fs.pipe_file(path, bytes(data))


def _errors(stderr: str, rank: int) -> list[str]:
    prefix = "hvdazure: error: "
    return [line.removeprefix(prefix) for line in lines_of(stderr, rank) if line.startswith(prefix)]


@pytest.fixture
def uninterrupted(torch_runs: TorchRuns) -> dict:
    """The reference, shared by every test here and tests/distributed/test_checkpointing.py: the same
    training, never interrupted, with the same checkpoint schedule (on a local directory: where it saves
    does not change what it trains), one run per session."""
    return torch_runs.get(*BASE).job.reports[0]


# --- kill mid-epoch, resume exactly; a damaged newest checkpoint is skipped ---------------------------------
@pytest.mark.parametrize("controller", CONTROLLERS)
def test_a_rank_killed_mid_epoch_resumes_bit_identical_and_damaged_newest_checkpoints_fall_back(
        tmp_path: Path, blob_url: str, uninterrupted: dict, controller: str) -> None:
    run = f"{blob_url}/run1"
    settings = (*BASE, f"checkpoint_dir={run}")
    out = tmp_path / "killed"
    out.mkdir()
    cmd = [sys.executable, "-m", "hvdazure.cli", "run", "-np", "2", f"--{controller}", str(JOB),
           *set_args((*settings, "extra.step_sleep=0.3"))]
    proc = subprocess.Popen(cmd, env={**os.environ, "HVDAZURE_TEST_OUT": str(out)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while not (out / "pid-1").exists() or _latest(run) != "step-00000006":  # committed, in epoch 2
            assert time.monotonic() < deadline and proc.poll() is None, "no checkpoint of step 6"
            time.sleep(0.05)
        os.kill(int((out / "pid-1").read_text()), signal.SIGKILL)
        output, _ = proc.communicate(timeout=60)
    finally:
        kill_tree(proc.pid)
    assert proc.returncode == 128 + signal.SIGKILL, output
    assert not processes_running(str(JOB))

    resumed = train(tmp_path, "resumed", *settings, "resume=auto", controller=controller)
    assert "hvdazure: resumed from step-0000000" in resumed.stderr
    assert resumed.reports[0]["params_sha256"] == uninterrupted["params_sha256"]
    assert resumed.reports[0]["history"] == uninterrupted["history"]

    # The newest checkpoint corrupt (a flipped bit), the one before it truncated: the third one is used.
    newest, previous, third = _checkpoints(run)[::-1][:3]
    assert newest == _latest(run)
    _damage(f"{run}/{newest}/model.pt", "flip_bit")
    _damage(f"{run}/{previous}/model.pt", "truncate")
    again = train(tmp_path, "fallback", *settings, "resume=auto", "epochs=4", controller=controller)
    warnings = [line for line in again.stderr.splitlines() if "skipping invalid" in line]
    assert len(warnings) == 2, again.stderr
    assert newest in warnings[0] and previous in warnings[1] and all("model.pt" in w for w in warnings)
    assert f"resumed from {third}" in again.stderr


# --- another world size ----------------------------------------------------------------------------------
def test_a_run_resized_2_1_2_ranks_trains_every_sample_of_every_epoch_once(blob_url: str,
                                                                          tmp_path: Path) -> None:
    # each controller saves and resumes once (Gloo on 2 ranks, MPI on 1), and the run changes controller
    # twice, as a job moved between a laptop and a cluster may: one chain instead of one per controller
    settings = (*BASE, f"checkpoint_dir={blob_url}/run1")
    runs = [train(tmp_path, "2 ranks", *settings, "max_steps=4", np=2, controller="gloo"),
            train(tmp_path, "1 rank", *settings, "resume=auto", "max_steps=9", np=1, controller="mpi"),
            train(tmp_path, "2 again", *settings, "resume=auto", np=2, controller="gloo")]

    for epoch in ("0", "1", "2"):
        used = [i for job in runs for report in job.reports.values() for i in report["seen"].get(epoch, [])]
        assert sorted(used) == list(range(37)), (epoch, runs[-1].output)
    history = runs[-1].reports[0]["history"]
    assert [record["epoch"] for record in history] == [0, 1, 2]
    assert history[-1]["samples_seen"] == 3 * 37
    assert "world size 2 -> 1" in runs[1].stderr and "world size 1 -> 2" in runs[2].stderr


# --- faults through the proxy ------------------------------------------------------------------------------
@pytest.mark.parametrize("controller", CONTROLLERS)
def test_faults_during_a_save_and_during_the_resume_are_retried_and_the_run_ends_bit_identical(
        proxied_blob: ProxiedBlob, tmp_path: Path, uninterrupted: dict, controller: str) -> None:
    proxy, run = proxied_blob.proxy, f"{proxied_blob.url}/run1"
    settings = (*BASE, f"checkpoint_dir={run}")
    during_save = [proxy.inject("status", status=503, method="PUT", path=r"step-00000003/model\.pt"),
                   proxy.inject("drop", method="PUT", path=r"step-00000006/manifest\.json"),
                   proxy.inject("drop_after", method="PUT", path=r"/latest", nth=2)]
    train(tmp_path, "first", *settings, "max_steps=7", controller=controller)
    assert [fault.applied for fault in during_save] == [1, 1, 1]
    proxy.clear()

    during_resume = [proxy.inject("truncate", keep_bytes=100, method="GET", path=r"step-00000007/model\.pt"),
                     proxy.inject("status", status=503, method="GET", path=r"/latest"),
                     proxy.inject("drop", method="GET", path=r"step-00000007/manifest\.json")]
    resumed = train(tmp_path, "resumed", *settings, "resume=auto", controller=controller)
    assert [fault.applied for fault in during_resume] == [1, 1, 1]
    proxy.clear()

    assert "resumed from step-00000007" in resumed.stderr and "skipping invalid" not in resumed.stderr
    assert resumed.reports[0]["params_sha256"] == uninterrupted["params_sha256"]


PERMANENT = {  # controller: (what is wrong, the settings, what every rank's one line says)
    "gloo": ("a wrong key", "resume=null", "authentication failed"),
    "mpi": ("a missing container", "resume=auto", "the container does not exist"),
}


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_a_permanent_storage_error_is_one_line_on_every_rank_and_a_non_zero_exit(
        azurite: Azurite, blob_url: str, tmp_path: Path, controller: str) -> None:
    what, resume, problem = PERMANENT[controller]
    if what == "a wrong key":
        wrong = azurite.connection_string().replace(ACCOUNT_KEY, "A" * 86 + "==")
        run, env = f"{blob_url}/run1", {"AZURE_STORAGE_CONNECTION_STRING": wrong}
    else:
        run, env = "abfs://no-such-container/run1", {}

    job = train(tmp_path, "job", *BASE, f"checkpoint_dir={run}", resume, controller=controller, expect=None,
                env=env)  # a hang fails in run_job

    assert job.returncode != 0, job.output
    for rank in (0, 1):
        errors = _errors(job.stderr, rank)
        assert len(errors) == 1 and run in errors[0] and problem in errors[0], job.stderr
        assert not [line for line in lines_of(job.stderr, rank) if "Traceback" in line], job.stderr
    assert ACCOUNT_KEY not in job.output and "A" * 86 not in job.output
    assert not job.reports
