"""scripts/torch_index.py: setup installs PyTorch's CPU build where there is no NVIDIA GPU, unless told
otherwise or a wheel satisfying the pin is already at hand (CI machines, which cannot reach PyTorch's
index)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "torch_index.py"
_spec = importlib.util.spec_from_file_location("torch_index", SCRIPT)
torch_index = sys.modules["torch_index"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(torch_index)

PIN = "torch==2.13.0"


def _never(*_args):
    raise AssertionError("checked although the answer was already known")


def _choose(env=None, gpu=False, at_hand=False):
    return torch_index.choose(PIN, env or {}, lambda: gpu, lambda requirement: at_hand)


def test_without_a_gpu_or_a_wheel_at_hand_torch_comes_from_the_cpu_index():
    choice = _choose()

    assert choice.pip_args() == ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    assert "no NVIDIA GPU" in choice.reason and "HVDAZURE_TORCH_INDEX=pypi" in choice.reason


def test_with_an_nvidia_gpu_torch_comes_from_the_default_index():
    choice = _choose(gpu=True)

    assert choice.pip_args() == []
    assert "CUDA" in choice.reason and "GPU is present" in choice.reason


def test_a_wheel_at_hand_is_used_without_asking_any_other_index():
    choice = _choose(at_hand=True)

    assert choice.pip_args() == []
    assert "already at hand" in choice.reason


@pytest.mark.parametrize("value", ["pypi", "", " pypi "])
def test_the_variable_can_ask_for_the_default_index(value):
    choice = torch_index.choose(PIN, {"HVDAZURE_TORCH_INDEX": value}, _never, _never)

    assert choice.pip_args() == []
    assert "HVDAZURE_TORCH_INDEX" in choice.reason


def test_the_variable_can_name_any_index():
    url = "https://mirror.example/whl/cu126"
    choice = torch_index.choose(PIN, {"HVDAZURE_TORCH_INDEX": url}, _never, _never)

    assert choice.pip_args() == ["--extra-index-url", url]


def _fake_nvidia_smi(tmp_path, listing, code=0):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '%s\\n' '{listing}'\nexit {code}\n")
    smi.chmod(0o755)
    return str(bin_dir)


def test_a_gpu_is_found_through_nvidia_smi(tmp_path):
    path = _fake_nvidia_smi(tmp_path, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1234)")

    assert torch_index.nvidia_gpu_present(path=path, proc_root=tmp_path / "proc")


def test_nvidia_smi_without_a_gpu_or_driver_is_no_gpu(tmp_path):
    path = _fake_nvidia_smi(tmp_path, "NVIDIA-SMI has failed because it couldn't communicate with the driver",
                            code=9)

    assert not torch_index.nvidia_gpu_present(path=path, proc_root=tmp_path / "proc")


def test_a_gpu_is_found_through_the_driver_in_proc(tmp_path):
    gpus = tmp_path / "proc" / "driver" / "nvidia" / "gpus"
    gpus.mkdir(parents=True)
    assert not torch_index.nvidia_gpu_present(path=str(tmp_path), proc_root=tmp_path / "proc")

    (gpus / "0000:00:1e.0").mkdir()
    assert torch_index.nvidia_gpu_present(path=str(tmp_path), proc_root=tmp_path / "proc")


def test_pip_is_asked_whether_a_requirement_is_at_hand_without_any_index():
    assert torch_index.available_here("pip")  # installed
    assert not torch_index.available_here("hvdazure-no-such-distribution==0.0.1")


def test_the_script_prints_the_pip_arguments_and_says_why_on_stderr():
    env = {**os.environ, "HVDAZURE_TORCH_INDEX": "https://mirror.example/whl/cpu"}
    proc = subprocess.run([sys.executable, str(SCRIPT), PIN], capture_output=True, text=True, env=env,
                          check=True)

    assert proc.stdout == "--extra-index-url https://mirror.example/whl/cpu\n"
    assert proc.stderr == f"[setup] {PIN} from https://mirror.example/whl/cpu: HVDAZURE_TORCH_INDEX says so\n"


def test_setup_installs_torch_with_the_arguments_the_script_chose():
    setup_env = (SCRIPT.parent / "setup_env.sh").read_text()

    assert 'torch_index=$("$py" scripts/torch_index.py "torch==${TORCH_VERSION}")' in setup_env
    install = ('pip_install ${torch_index_args[@]+"${torch_index_args[@]}"} --no-binary mpi4py \\\n'
               '  "torch==${TORCH_VERSION}"')
    assert install in setup_env
    assert "scripts/torch_index.py | sha256sum" in setup_env  # a change to the choice re-runs the install
