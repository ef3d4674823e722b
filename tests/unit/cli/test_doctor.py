"""Parsing Horovod's build report, and the doctor's verdict."""

from hvdazure.doctor import HorovodBuild, Report, build_from_answers, horovod_build

FULL = {"mpi": True, "gloo": True, "nccl": True, "ddl": False, "ccl": False}


def test_the_build_is_what_the_first_loading_extension_says_as_check_build_reads_it():
    answers = {"TensorFlow": {**FULL, "gloo": False}, "PyTorch": FULL}
    build = build_from_answers(answers)
    assert build.frameworks == ["TensorFlow", "PyTorch"]
    assert build.controllers == ["MPI"]  # TensorFlow's answer: the first in check-build's order
    assert build.tensor_operations == ["NCCL", "MPI"]


def test_a_framework_whose_extension_does_not_load_is_not_in_the_build():
    answers = {"TensorFlow": {"error": "ImportError: Extension horovod.tensorflow has not been built"},
               "PyTorch": FULL}
    build = build_from_answers(answers)
    assert build.frameworks == ["PyTorch"]
    assert build.controllers == ["MPI", "Gloo"]
    assert build.tensor_operations == ["NCCL", "MPI", "Gloo"]
    assert build_from_answers({"PyTorch": {"error": "x"}}) == HorovodBuild()


def _report(build):
    return Report(python="3.11", platform="linux", hvdazure="0", packages={}, horovod_build=build, mpi=None,
                  gpus=[], problems=[])


def test_horovod_can_run_only_with_a_framework_and_a_controller():
    assert _report(HorovodBuild(["PyTorch"], ["Gloo"], ["Gloo"])).ok
    assert not _report(HorovodBuild(["PyTorch"], [], [])).ok
    assert not _report(HorovodBuild([], ["MPI"], ["MPI"])).ok
    assert not _report(None).ok


def test_no_loading_extension_is_one_line_naming_each_extensions_error():
    build, problem = horovod_build({"mxnet": "1.9.1"})  # not installed here: horovod.mxnet cannot load
    assert build is None
    assert problem.startswith("no Horovod framework extension loads (horovod.mxnet: ") and "\n" not in problem
    assert horovod_build({})[1].startswith("no Horovod framework extension loads (neither torch nor")
