"""Parsing Horovod's build report, and the doctor's verdict."""

from hvdazure.doctor import HorovodBuild, Report, parse_check_build

CHECK_BUILD = """Horovod v0.28.1:

Available Frameworks:
    [X] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [X] MPI
    [ ] Gloo

Available Tensor Operations:
    [X] NCCL
    [ ] DDL
    [ ] CCL
    [X] MPI
    [ ] Gloo
"""


def test_check_build_report_is_parsed_by_section():
    build = parse_check_build(CHECK_BUILD)
    assert build.frameworks == ["TensorFlow", "PyTorch"]
    assert build.controllers == ["MPI"]
    assert build.tensor_operations == ["NCCL", "MPI"]


def _report(build):
    return Report(python="3.11", platform="linux", hvdazure="0", packages={}, horovod_build=build, mpi=None,
                  gpus=[], problems=[])


def test_horovod_can_run_only_with_a_framework_and_a_controller():
    assert _report(HorovodBuild(["PyTorch"], ["Gloo"], ["Gloo"])).ok
    assert not _report(HorovodBuild(["PyTorch"], [], [])).ok
    assert not _report(HorovodBuild([], ["MPI"], ["MPI"])).ok
    assert not _report(None).ok
