"""mpi4py and Horovod must be linked to one libmpi for `hvdazure sweep`; hvdazure.launch.mpi_libraries says
whether they are, without starting MPI."""

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path

from version_pins import requirement_pins

from hvdazure import doctor
from hvdazure.doctor import HorovodBuild
from hvdazure.launch.mpi_libraries import (
    MPI4PY_VERSION,
    MpiLibraries,
    libmpi_in_ldd,
    libmpi_problem,
    mpi4py_problem,
    mpi_libraries,
)

ROOT = Path(__file__).resolve().parents[3]
LDD = """\
\tlinux-vdso.so.1 (0x00007ffd5a1f2000)
\tlibmpi.so.40 => {libmpi} (0x00007f0ab26a2000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0ab221e000)
\tlibtensorflow_framework.so.2 => not found
"""


HOROVOD_WITH_MPI = HorovodBuild(["PyTorch"], ["MPI", "Gloo"], ["MPI", "Gloo"])


def find_spec_where(package: str, spec: importlib.machinery.ModuleSpec | None):
    """importlib.util.find_spec, except that it answers `spec` for `package`."""
    return lambda name: spec if name == package else importlib.util.find_spec(name)


def without(package: str):
    """importlib.util.find_spec, as it answers where `package` is not installed."""
    return find_spec_where(package, None)


def test_the_installed_mpi4py_is_linked_to_horovods_libmpi():
    libraries = mpi_libraries()

    assert libraries.problem is None
    assert libraries.same_library
    assert libraries.mpi4py_libmpi == libraries.horovod_libmpi
    assert Path(libraries.mpi4py_libmpi).name.startswith("libmpi.so")
    assert mpi4py_problem() is None


def test_the_check_does_not_start_mpi():
    code = ("import sys; from hvdazure.launch.mpi_libraries import mpi4py_problem; mpi4py_problem(); "
            "print('mpi4py.MPI' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)

    assert proc.stdout.strip() == "False", proc.stderr


def test_different_libmpis_are_one_line_naming_both_and_the_rebuild():
    problem = libmpi_problem("/opt/mpich/lib/libmpi.so.12.4.3", "/usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4")

    assert "\n" not in problem
    assert "mpi4py links /opt/mpich/lib/libmpi.so.12.4.3" in problem
    assert "Horovod links /usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4" in problem
    assert f"--no-binary mpi4py --force-reinstall mpi4py=={MPI4PY_VERSION}" in problem


def test_one_libmpi_is_no_problem():
    assert libmpi_problem("/usr/lib/libmpi.so.40.30.4", "/usr/lib/libmpi.so.40.30.4") is None


def test_ldd_names_the_libmpi_behind_its_symlinks(tmp_path):
    (tmp_path / "libmpi.so.40.30.4").touch()
    (tmp_path / "libmpi.so.40").symlink_to("libmpi.so.40.30.4")

    linked = libmpi_in_ldd(LDD.format(libmpi=tmp_path / "libmpi.so.40"))

    assert linked == ("libmpi.so.40", str(tmp_path / "libmpi.so.40.30.4"))


def test_ldd_tells_a_libmpi_the_loader_cannot_find_from_none():
    assert libmpi_in_ldd(LDD.format(libmpi="not found")) == ("libmpi.so.40", None)
    assert libmpi_in_ldd("\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0ab221e000)\n") is None


def test_libmpi_cxx_is_not_taken_for_libmpi():
    output = "\tlibmpi_cxx.so.40 => /lib/libmpi_cxx.so.40 (0x1)\n" + LDD.format(libmpi="/lib/libmpi.so.40")

    assert libmpi_in_ldd(output)[0] == "libmpi.so.40"


def test_missing_mpi4py_is_one_line_with_the_install_command():
    problem = mpi4py_problem(find_spec=without("mpi4py"))

    assert problem.startswith("mpi4py is not installed; hvdazure sweep needs it built against Horovod's MPI")
    assert "MPICC=" in problem and "pip install --no-binary mpi4py" in problem
    assert "\n" not in problem
    assert mpi_libraries(find_spec=without("mpi4py")).mpi4py_version is None


def test_pypis_binary_wheel_is_a_problem_though_one_of_its_variants_may_match(tmp_path):
    for abi in ("mpich", "openmpi"):  # what `pip install mpi4py` unpacks: one module per MPI ABI
        (tmp_path / f"MPI.{abi}{importlib.machinery.EXTENSION_SUFFIXES[0]}").touch()
    wheel = importlib.machinery.ModuleSpec("mpi4py", None, is_package=True)
    wheel.submodule_search_locations = [str(tmp_path)]

    problem = mpi4py_problem(find_spec=find_spec_where("mpi4py", wheel))

    assert problem.startswith("mpi4py is PyPI's binary wheel")
    assert "--no-binary mpi4py" in problem


def test_missing_horovod_is_a_problem_too():
    assert mpi4py_problem(find_spec=without("horovod")).startswith("horovod is not installed")


def test_the_suggested_version_is_requirements_pin():
    assert requirement_pins(ROOT / "requirements/base.txt")["mpi4py"] == MPI4PY_VERSION


def test_doctor_reports_mpi4py_and_its_libmpi(monkeypatch):
    monkeypatch.setattr(doctor, "horovod_build", lambda packages: (HOROVOD_WITH_MPI, None))

    report = doctor.collect()

    assert report.mpi4py == mpi_libraries()
    assert doctor.as_dict(report)["mpi4py"]["same_library"] is True
    assert (f"mpi4py       {report.mpi4py.mpi4py_version} with {report.mpi4py.mpi4py_libmpi} (Horovod's too)"
            in doctor.format_report(report).splitlines())


def test_doctor_makes_a_libmpi_mismatch_a_problem(monkeypatch):
    mismatch = MpiLibraries("4.1.2", "/opt/x/libmpi.so.12", "/usr/lib/libmpi.so.40", False,
                            libmpi_problem("/opt/x/libmpi.so.12", "/usr/lib/libmpi.so.40"))
    monkeypatch.setattr(doctor, "horovod_build", lambda packages: (HOROVOD_WITH_MPI, None))
    monkeypatch.setattr(doctor, "mpi_libraries", lambda: mismatch)

    report = doctor.collect()

    assert mismatch.problem in report.problems
    assert "mpi4py       4.1.2 with /opt/x/libmpi.so.12 (not Horovod's /usr/lib/libmpi.so.40)" in (
        doctor.format_report(report).splitlines())
    assert report.ok  # Horovod itself can still run; only hvdazure sweep cannot


def test_doctor_says_mpi4py_is_not_installed():
    assert doctor.describe_mpi4py(mpi_libraries(find_spec=without("mpi4py"))) == "not installed"
