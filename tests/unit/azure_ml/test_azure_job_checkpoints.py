"""What `hvdazure jobs` makes of a job's checkpoints, with no Azure at all: where the command puts them, which
is the last, what counts as a preemption report, the resume command, and the download's verification of
real checkpoints (written by the checkpoint manager) on a local disk. The SDKs' side: test_azure_jobs.py
and tests/storage/test_azure_jobs_storage.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hvdazure.azure.errors import JobError
from hvdazure.azure.jobs.preempted import preemption, reported_preemption, resume_command
from hvdazure.azure.records.checkpoints import CheckpointPlace, checkpoint_place, last_checkpoint
from hvdazure.azure.records.download import DAMAGED_SUFFIX, download, verify_checkpoints
from hvdazure.azure.records.job import JobDetails, RunFacts, format_duration, run_facts
from hvdazure.core.checkpoint.store import CheckpointManager


def job(command: str | None = "python train.py --set epochs=3", status: str = "Failed",
        error: str | None = None, warnings: tuple[str, ...] = ()) -> JobDetails:
    return JobDetails(name="digits_7", sdk="v2", status=status, experiment="digits", display_name=None,
                      compute="gpu-cluster", nodes=2, studio_url=None, command=command, created=None,
                      facts=RunFacts(error=error, warnings=warnings))


def save(directory: Path, step: int) -> None:
    files = {"model.bin": lambda f: f.write(bytes(range(256)) * 8), "state.json": lambda f: f.write(b"{}")}
    CheckpointManager(str(directory), keep_last=10).save(step, files, {"framework": "test"})


# --- where the checkpoints are ----------------------------------------------------------------------------
@pytest.mark.parametrize(("command", "place"), [
    ("python train.py --set epochs=3", CheckpointPlace("job files", "outputs/checkpoints")),
    ("python train.py --set 'checkpoint_dir=${{outputs.ckpt}}'", CheckpointPlace("output", "ckpt")),
    ("python train.py --set=checkpoint_dir=${{outputs.ckpt}}/run1/", CheckpointPlace("output", "ckpt/run1")),
    ("python train.py --set checkpoint_dir=abfs://c/run1", CheckpointPlace("url", "abfs://c/run1")),
    ("python train.py --set checkpoint_dir=./outputs/ck", CheckpointPlace("job files", "outputs/ck")),
    # the last one given wins, as TrainConfig reads them
    ("python train.py --set checkpoint_dir=a --set checkpoint_dir=${{outputs.o}}",
     CheckpointPlace("output", "o")),
])
def test_the_commands_checkpoint_dir_says_where_the_checkpoints_are(command, place):
    assert checkpoint_place(job(command)) == place


def test_a_job_whose_command_is_unknown_has_no_checkpoint_place():
    assert checkpoint_place(job(None)) is None


def test_the_last_checkpoint_is_latests_with_its_manifests_step(tmp_path):
    save(tmp_path, 5)
    save(tmp_path, 12)

    last = last_checkpoint(CheckpointPlace("output", "ckpt"), _reader(tmp_path))

    assert (last.name, last.step) == ("step-00000012", 12)


def test_an_unreadable_manifest_leaves_the_step_of_the_name(tmp_path):
    (tmp_path / "latest").write_text("step-00000030-v2\n")

    last = last_checkpoint(CheckpointPlace("output", "ckpt"), _reader(tmp_path))

    assert (last.name, last.step) == ("step-00000030-v2", 30)


@pytest.mark.parametrize("pointer", [None, "", "../../etc/passwd", "step-x"])
def test_no_pointer_or_one_that_names_no_checkpoint_is_no_last_checkpoint(tmp_path, pointer):
    if pointer is not None:
        (tmp_path / "latest").write_text(pointer)

    assert last_checkpoint(CheckpointPlace("output", "ckpt"), _reader(tmp_path)) is None


# --- preemption ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("error", "warnings", "found"), [
    ("UserError: AzureMLCompute job failed. PreemptionError: Nodes of this job got pre-empted.", (), True),
    (None, ("Low priority compute preemption warning: a node has been preempted.",), True),
    ("UserError: Execution failed. User process 'python' exited with status code 1.", (), False),
    (None, ("Your job used more memory than was preempt-ively reserved",), True),  # says "preempt": counted
    (None, ("Dataset mount is slow",), False),
])
def test_a_preemption_is_what_the_services_error_or_a_warning_says(error, warnings, found):
    reported = reported_preemption(job(error=error, warnings=warnings))

    assert (reported is not None) == found


def test_the_resume_command_has_the_script_compute_nodes_the_jobs_name_and_its_arguments_but_resume():
    resumed = job("python train.py --set epochs=3 --set resume=auto --set=resume=auto")
    # --resume-from sets resume itself, and refuses the script's own
    assert resume_command(resumed) == ("hvdazure submit train.py --compute gpu-cluster --nodes 2 "
                                       "--resume-from digits_7 ... -- --set epochs=3")
    assert resume_command(job("python train.py")).endswith("--resume-from digits_7 ...")


@pytest.mark.parametrize(("command", "sdk", "why"), [
    ("python -m hvdazure.sweep train.py --space s.yaml", "v2", "is an in-job sweep, whose trials each keep"),
    ("python train.py --set checkpoint_dir=ckpt", "v2", "keeps checkpoints in ckpt inside the container"),
    ("python train.py", "v1", "is an SDK v1 run, and --resume-from looks jobs up with SDK v2"),
])
def test_a_preempted_job_resume_from_would_refuse_gets_why_instead_of_a_command(command, sdk, why):
    preempted = dataclasses.replace(job(command, error="PreemptionError: Nodes of this job got pre-empted."),
                                    sdk=sdk)

    line = preemption(preempted, lambda place: None).line()

    assert line.startswith("preempted ") and "; not resumable with --resume-from: " in line
    assert why in line
    assert preemption(preempted, lambda place: None).as_dict()["resume_command"] is None


def test_a_preempted_job_that_ended_gets_its_step_and_the_resume_command(tmp_path):
    save(tmp_path, 12)
    preempted = dataclasses.replace(
        job("python train.py --set checkpoint_dir=${{outputs.ckpt}} --set resume=auto",
            error="UserError: AzureMLCompute job failed. PreemptionError: Nodes of this job got pre-empted."),
        outputs={"ckpt": ""})

    found = preemption(preempted, lambda place: last_checkpoint(place, _reader(tmp_path)))

    assert found.line() == ("preempted at step 12 (last checkpoint step-00000012 in output ckpt), resume "
                            "with: hvdazure submit train.py --compute gpu-cluster --nodes 2 --resume-from "
                            "digits_7 ... -- --set 'checkpoint_dir=${{outputs.ckpt}}'")
    assert found.as_dict()["step"] == 12


def test_a_job_not_preempted_reads_no_checkpoint():
    read = []

    assert preemption(job(error="UserError: Execution failed."), lambda place: read.append(place)) is None
    assert read == []


# --- what Run History says ----------------------------------------------------------------------------------
def test_run_history_errors_and_warnings_are_one_line_each_without_credentials():
    facts = run_facts({"startTimeUtc": "2026-01-01T00:00:00.1234567Z", "endTimeUtc": None,
                       "error": {"error": {"code": "UserError", "message": "first\nsecond ?sig=SECRET&x=1"}},
                       "warnings": [{"source": "s", "message": "w1\nw2"}, {"source": "s", "message": None}]})

    assert facts.error == "UserError: first second ?sig=REDACTED&x=1"
    assert facts.warnings == ("w1 w2",)
    assert facts.started == "2026-01-01T00:00:00+00:00"


@pytest.mark.parametrize(("seconds", "text"),
                         [(None, "-"), (5.4, "5s"), (65, "1m 05s"), (7290, "2h 01m 30s")])
def test_durations_read_as_hours_minutes_and_seconds(seconds, text):
    assert format_duration(seconds) == text


# --- the download's verification ----------------------------------------------------------------------------
def test_every_checkpoint_verifies_and_a_save_cut_short_is_noted(tmp_path):
    save(tmp_path, 5)
    save(tmp_path, 10)
    (tmp_path / "step-00000015").mkdir()  # a writer killed before its manifest: no checkpoint
    (tmp_path / "step-00000015" / "model.bin").write_bytes(b"half")

    check = verify_checkpoints(tmp_path)

    assert check.valid == ("step-00000005", "step-00000010")
    assert (check.damaged, check.incomplete, check.latest) == ((), ("step-00000015",), "step-00000010")


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove", "manifest"])
def test_a_damaged_checkpoint_is_renamed_so_no_reader_takes_it(tmp_path, damage):
    save(tmp_path, 5)
    save(tmp_path, 10)
    target = tmp_path / "step-00000010" / ("manifest.json" if damage == "manifest" else "model.bin")
    data = target.read_bytes()
    if damage == "flip":
        target.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    elif damage == "truncate":
        target.write_bytes(data[:-1])
    elif damage == "remove":
        target.unlink()
    else:
        target.write_text("{not json")

    check = verify_checkpoints(tmp_path)

    assert check.valid == ("step-00000005",)
    assert [name for name, _ in check.damaged] == ["step-00000010"]
    assert (tmp_path / f"step-00000010{DAMAGED_SUFFIX}").is_dir()
    assert not (tmp_path / "step-00000010").exists()
    # `latest` still names it: the checkpoint manager falls back to the newest that verifies
    found, warnings = CheckpointManager(str(tmp_path)).latest_valid()
    assert found.name == "step-00000005"
    assert warnings


def test_a_download_that_fails_half_way_leaves_nothing_in_place(tmp_path):
    def half_then_fail(staging: Path) -> None:
        (staging / "artifacts" / "outputs").mkdir(parents=True)
        (staging / "artifacts" / "outputs" / "a.txt").write_text("a")
        raise ConnectionError("dropped")

    with pytest.raises(ConnectionError):
        download("digits_7", "v2", tmp_path, None, half_then_fail)

    assert list(tmp_path.iterdir()) == []


def test_a_part_there_already_is_refused_before_the_download_starts(tmp_path):
    (tmp_path / "artifacts").mkdir()
    started = []

    with pytest.raises(JobError, match=r"artifacts exists: remove it, or download into another folder"):
        download("digits_7", "v2", tmp_path, None, started.append)

    assert started == []


def test_an_output_that_brought_no_files_is_refused_and_leaves_nothing(tmp_path):
    with pytest.raises(JobError, match=r"^job digits_7: output 'ckpt' holds no files \(nothing downloaded"):
        download("digits_7", "v2", tmp_path, "ckpt", lambda staging: None)

    assert list(tmp_path.iterdir()) == []


def test_a_damaged_checkpoint_fails_the_download_in_one_line_after_the_files_are_in_place(tmp_path):
    def fetch(staging: Path) -> None:
        checkpoints = staging / "named-outputs" / "ckpt"
        save(checkpoints, 5)
        save(checkpoints, 10)
        (checkpoints / "step-00000010" / "model.bin").write_bytes(b"x")

    downloaded = download("digits_7", "v2", tmp_path / "d", "ckpt", fetch)

    failure = downloaded.failure()
    checkpoints = tmp_path / "d" / "named-outputs" / "ckpt"
    assert failure.startswith(f"job digits_7: checkpoint step-00000010 in {checkpoints} is damaged (")
    assert failure.endswith("renamed step-00000010.damaged, which no reader takes for a checkpoint; newest "
                            "valid checkpoint there: step-00000005")
    assert "\n" not in failure
    assert (tmp_path / "d" / "named-outputs" / "ckpt" / "step-00000010.damaged").is_dir()
    assert json.loads(json.dumps(downloaded.as_dict()))["checkpoints"][0]["damaged"][0]["checkpoint"] == \
        "step-00000010"
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["named-outputs"]  # the staging folder is gone


def _reader(directory: Path):
    def read(relative: str) -> bytes | None:
        path = directory / relative
        return path.read_bytes() if path.is_file() else None

    return read
