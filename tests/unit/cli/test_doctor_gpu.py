"""The doctor's GPU lines: torch's CUDA version, the GPUs torch sees, and "no GPU visible" as a note (never a
problem) for a CUDA build on a machine without a GPU, as in the environment `make horovod-gpu` builds here."""

import re

from hvdazure import doctor
from hvdazure.doctor import HorovodBuild, Report, format_report, gpu_notes, missing_frameworks

# Horovod as scripts/build_horovod_gpu.sh builds it: PyTorch only, NCCL for GPU tensors, MPI and Gloo.
NCCL_BUILD = HorovodBuild(["PyTorch"], ["MPI", "Gloo"], ["NCCL", "MPI", "Gloo"])
CPU_BUILD = HorovodBuild(["TensorFlow", "PyTorch"], ["MPI", "Gloo"], ["MPI", "Gloo"])


def test_a_cuda_torch_without_a_gpu_is_a_note_naming_its_cuda_and_the_unused_nccl():
    [note] = gpu_notes("13.0", 0, NCCL_BUILD)
    assert note.startswith("no GPU visible: torch is compiled with CUDA 13.0 but "
                           "torch.cuda.is_available() is False")
    assert "NCCL operations are built but unused here" in note
    [note] = gpu_notes("13.0", 0, CPU_BUILD)
    assert "NCCL" not in note


def test_no_note_with_a_gpu_for_a_cpu_torch_or_when_torch_was_not_asked():
    assert gpu_notes("13.0", 1, NCCL_BUILD) == []
    assert gpu_notes(None, None, CPU_BUILD) == []  # torch's CPU build: no GPU expected
    assert gpu_notes("13.0", None, NCCL_BUILD) == []  # torch gave no answer in time


def test_a_framework_missing_beside_the_other_is_a_note_and_both_missing_are_problems():
    problems, notes = missing_frameworks({"torch": "2.13.0", "tensorflow": None})
    assert problems == []
    assert notes == ["tensorflow is not installed: hvdazure.tensorflow is unavailable "
                     "(a torch-only environment)"]
    problems, notes = missing_frameworks({"torch": None, "tensorflow": None})
    assert notes == [] and [p.split(":")[0] for p in problems] == ["torch is not installed",
                                                                  "tensorflow is not installed"]
    assert missing_frameworks({"torch": "2.13.0", "tensorflow": "2.21.0"}) == ([], [])


def test_the_report_of_a_torch_cuda_environment_without_a_gpu_can_run_and_shows_notes_not_problems():
    problems, notes = missing_frameworks({"torch": "2.13.0", "tensorflow": None})
    report = Report(python="3.11", platform="linux", hvdazure="0",
                    packages={"torch": "2.13.0", "tensorflow": None, "horovod": "0.28.1"},
                    horovod_build=NCCL_BUILD, mpi="mpirun (Open MPI) 4.1.4", gpus=[], problems=problems,
                    torch_cuda="13.0", torch_gpus=0, notes=gpu_notes("13.0", 0, NCCL_BUILD) + notes)
    text = format_report(report)
    lines = text.splitlines()
    assert "torch cuda   13.0 (compiled with), GPUs torch sees: 0" in lines
    assert "  tensor operations  NCCL, MPI, Gloo" in lines
    assert "problems:" not in lines
    assert lines[lines.index("notes:") + 1].startswith("  - no GPU visible: torch is compiled with CUDA 13.0")
    assert text.endswith("verdict: horovod can run")
    assert doctor.as_dict(report)["torch_cuda"] == "13.0"


def test_torch_cuda_and_the_gpus_torch_sees_are_read_from_the_installed_torch():
    packages = {"torch": doctor.package_version("torch")}
    cuda = doctor.torch_cuda_version(packages)
    import torch  # the installed torch: whatever build it is, the doctor reads the same without importing it

    assert cuda == torch.version.cuda
    assert cuda is None or re.fullmatch(r"\d+\.\d+", cuda)
    assert doctor.torch_cuda_version({"torch": None}) is None
    expected = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert doctor.torch_gpu_count(doctor.start_torch_gpu_count()) == expected
