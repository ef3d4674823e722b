"""The PyTorch binding's device placement and GPU numbers, against FakeCuda: a fake device layer at the
torch boundary (tests/unit/fake_cuda.py). No GPU ran for these tests: they check what the binding asks
torch.cuda and what it does with the answers. Placement on real ranks, under the same fake:
tests/distributed/test_collectives.py."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("horovod")

from fake_cuda import FakeCuda  # noqa: E402

from hvdazure.torch.profiler import CudaStats  # noqa: E402

UNIT = Path(__file__).resolve().parents[1]  # tests/unit, where fake_cuda.py is
GIB = 2**30

# TorchBackend.start on one rank, in a process of its own (Horovod started in the test process crashes it at
# exit): FakeCuda with argv[1] GPUs in place of torch.cuda
START = """
import json, os, sys
import pytest, torch
sys.path.insert(0, sys.argv[2])
from fake_cuda import FakeCuda
from hvdazure.core.config import TrainConfig
from hvdazure.core.step_times import StepTimes
from hvdazure.torch.backend import TorchBackend
with pytest.MonkeyPatch.context() as patch:
    cuda = FakeCuda(int(sys.argv[1])).install(patch)
    backend = TorchBackend(None, None)
    collectives = backend.start(None, TrainConfig, StepTimes(enabled=False))
    print(json.dumps({"device": str(backend.device), "current": cuda.current, "layout": backend.device_layout,
                      "stats": backend._cuda_stats is not None, "collectives": str(collectives.device)}))
"""


def _start(gpus: int, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", START, str(gpus), str(UNIT)], capture_output=True, text=True,
                          timeout=120, env={**_environment(), **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def _environment() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}


def test_one_rank_with_one_fake_gpu_is_placed_on_cuda_0_and_measures_it():
    assert _start(1) == {"device": "cuda:0", "current": 0, "layout": "1 rank on 1 node, 1 GPU each (cuda:0)",
                         "stats": True, "collectives": "cuda:0"}


def test_one_rank_with_two_fake_gpus_takes_the_first_and_says_the_other_is_idle():
    placed = _start(2, CUDA_VISIBLE_DEVICES="2,3")
    assert (placed["device"], placed["current"]) == ("cuda:0", 0)
    assert placed["layout"] == ("1 rank on 1 node, 1 GPU each (cuda:0 of CUDA_VISIBLE_DEVICES=2,3; 1 of 2 "
                                "visible GPUs idle)")


def test_without_a_gpu_the_rank_stays_on_the_cpu_and_sets_no_device():
    assert _start(0) == {"device": "cpu", "current": None, "layout": "1 rank on 1 node, CPU", "stats": False,
                         "collectives": "cpu"}


def test_cuda_stats_read_both_peaks_and_the_utilization_then_reset_the_peaks(monkeypatch):
    cuda = FakeCuda(1, utilization=87.0, peaks=[(3 * GIB, 4 * GIB), (GIB, 2 * GIB)]).install(monkeypatch)
    stats = CudaStats(torch.device("cuda", 0))
    assert stats() == (3.0 * GIB, 4.0 * GIB, 87.0)
    assert stats() == (1.0 * GIB, 2.0 * GIB, 87.0)
    assert cuda.resets == [0, 0]


def test_cuda_stats_without_pynvml_report_memory_only_and_ask_nvml_once(monkeypatch):
    cuda = FakeCuda(1, utilization=None, peaks=[(GIB, GIB)]).install(monkeypatch)
    asked = []
    monkeypatch.setattr(torch.cuda, "utilization",
                        lambda device=None: asked.append(device) or cuda.utilization())
    stats = CudaStats(torch.device("cuda", 0))
    first, second = stats(), stats()
    assert first[:2] == second[:2] == (1.0 * GIB, 1.0 * GIB)
    assert math.isnan(first[2]) and math.isnan(second[2])
    assert len(asked) == 1
