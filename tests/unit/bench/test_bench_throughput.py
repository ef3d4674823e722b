"""The throughput benchmark's framework-free side: the batch timer's arithmetic, the plan per framework, the
report of both frameworks side by side (and of one that was skipped), and one-line errors before any rank."""

import importlib.util

import pytest

from hvdazure.bench import throughput, throughput_workload
from hvdazure.bench.benchmark import BenchError
from hvdazure.bench.frameworks import chosen_frameworks


class FakeClock:
    """Each reading one second after the last."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_batch_timer_skips_the_warm_up_and_rates_each_batch_of_steps_after_synchronizing():
    synced = []
    timer = throughput_workload.BatchTimer(warmup=2, steps_per_batch=3, batch_size=8,
                                           synchronize=lambda: synced.append(1), clock=FakeClock())
    for _ in range(2 + 3 * 3):
        timer.on_step_end(None)

    assert timer.rates == pytest.approx([24.0, 24.0, 24.0])  # 3 steps x 8 samples per 1 s reading
    assert len(synced) == 4  # at the end of the warm-up and of each batch


def test_schedule_models_and_frameworks_are_shared_by_both_sides():
    assert throughput_workload.batch_size("cnn", quick=False) == 64
    assert throughput_workload.batch_size("cnn", quick=True) == 16
    assert throughput_workload.MODELS["resnet50"] == ((3, 224, 224), 1000, 32)
    assert chosen_frameworks("both") == ["torch", "tensorflow"]
    assert chosen_frameworks("tensorflow") == ["tensorflow"]
    schedule = throughput_workload.batch_schedule(True)
    assert schedule._asdict() == {"warmup": 2, "batches": 3, "steps_per_batch": 2}


def runs(one: float, many: float, ceiling: float) -> dict:
    return {"1 rank": {"rates_per_rank": [[one] * 4]},
            "2 ranks": {"rates_per_rank": [[many] * 4, [many] * 4]},
            "2 independent": {"rates_per_rank": [[ceiling] * 4, [ceiling] * 4]}}


def test_summary_gives_the_efficiencies_and_the_table_shows_both_frameworks_and_a_skipped_one():
    s = throughput.summarize(runs(100.0, 45.0, 90.0), 2)
    assert s["weak_scaling_efficiency"]["value"] == pytest.approx(0.45)
    assert s["ceiling_efficiency"]["value"] == pytest.approx(0.9)
    assert s["share_of_ceiling"]["value"] == pytest.approx(0.5)
    assert s["samples_per_s"]["2 ranks"]["total"]["mean"] == pytest.approx(90.0)

    result = {"model": "cnn", "threads_per_rank": 1, "rounds": 1,
              **throughput_workload.batch_schedule(True)._asdict(), "frameworks": {
        "torch": {"status": "measured", "trainer": "TorchTrainer", "summary": s},
        "tensorflow": {"status": "measured", "trainer": "TensorFlowTrainer",
                       "summary": throughput.summarize(runs(80.0, 40.0, 80.0), 2)}}}
    text = throughput.Throughput().table(result)
    assert "TorchTrainer, 2 ranks" in text and "TensorFlowTrainer, 2 independent" in text
    assert "weak-scaling efficiency total(N) / (N x total(1)): 0.450" in text
    assert "weak-scaling efficiency total(N) / (N x total(1)): 0.500" in text

    result["frameworks"]["tensorflow"] = {"status": "skipped", "reason": "tensorflow is not installed"}
    assert "tensorflow: skipped: tensorflow is not installed" in throughput.Throughput().table(result)


def test_resnet50_without_its_package_fails_in_one_line_for_the_framework_asked_for(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: None if name in ("torchvision", "keras") else real(name))
    options = {"model": "resnet50", "framework": "tensorflow"}
    benchmark = throughput.Throughput()

    with pytest.raises(BenchError, match=r"keras\.applications"):
        benchmark.check(options)
    with pytest.raises(BenchError, match="torchvision"):
        benchmark.check({**options, "framework": "torch"})
    benchmark.check({**options, "model": "cnn", "framework": "both"})
