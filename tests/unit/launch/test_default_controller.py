"""The controller a job runs on without --gloo or --mpi: MPI where mpirun is on PATH and Horovod is linked
to that MPI's library, else Gloo, each with the reason `hvdazure doctor` shows; and `hvdazure run` without
a flag starts its ranks under it."""

import subprocess
import sys

import pytest

from hvdazure.launch import controller

HERE = controller.mpi_unusable()  # this machine's answer: make setup builds Horovod with Open MPI


def fake_mpirun(tmp_path, first_line):
    script = tmp_path / "mpirun"
    script.write_text(f"#!/bin/sh\necho '{first_line}'\n")
    script.chmod(0o755)
    return lambda name: str(script) if name == "mpirun" else None


def test_without_mpirun_the_default_is_gloo_and_says_why():
    assert controller.mpi_unusable(which=lambda name: None) == "mpirun is not on PATH"
    assert controller.default_controller(which=lambda name: None) == "gloo"


def test_without_horovod_mpi_cannot_run(tmp_path):
    which = fake_mpirun(tmp_path, "mpirun (Open MPI) 4.1.4")
    assert "horovod is not installed" in controller.mpi_unusable(find_spec=lambda name: None, which=which)


@pytest.mark.skipif(HERE is not None, reason=f"MPI cannot run here: {HERE}")
def test_an_mpirun_of_another_mpi_than_horovods_is_not_used(tmp_path):
    mpich = fake_mpirun(tmp_path, "HYDRA build details:")
    assert "another MPI than HYDRA build details:'s" in controller.mpi_unusable(which=mpich)
    assert controller.default_controller(which=mpich) == "gloo"
    assert controller.default_controller(which=fake_mpirun(tmp_path, "mpirun (Open MPI) 4.1.4")) == "mpi"


@pytest.mark.distributed  # a real 2-rank job, in this file beside the unit tests of the same choice
@pytest.mark.skipif(HERE is not None, reason=f"MPI cannot run here: {HERE}")
def test_hvdazure_run_without_a_flag_starts_the_ranks_under_mpirun_where_mpi_can_run():
    probe = ("import os; print('world', os.environ.get('OMPI_COMM_WORLD_SIZE'), "
             "os.environ.get('HOROVOD_RANK'))")
    out = subprocess.run([sys.executable, "-m", "hvdazure.cli", "run", "-np", "2", "--", sys.executable, "-c",
                          probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("world 2 None") == 2  # Open MPI's variables; horovodrun would set HOROVOD_RANK


def test_doctor_names_the_default_controller():
    from hvdazure import doctor

    assert doctor.describe_default_controller().startswith("MPI" if HERE is None else "Gloo")
