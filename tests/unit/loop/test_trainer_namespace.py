"""The user's namespace: a trainer subclass sees its hooks, a few read-only properties and fit/evaluate-style
methods; the loop's state and machinery sit in one name-mangled TrainingLoop (core/training_loop.py). That a
subclass using every old loop name still trains exactly is proven on real ranks (workers/squatter.py, in
test_torch_trainer.py and test_tf_trainer.py); here: what the class and its instances hold, and that fit()
leaves the process's sys.excepthook alone.
"""

from __future__ import annotations

import sys
from types import TracebackType

import pytest
from fakes.fake_backend import FakeTrainer, LinearProblem, ThreadWorld

from hvdazure.core.config import TrainConfig
from hvdazure.core.trainer import Trainer, loop_of
from hvdazure.core.training_loop import TrainingLoop

READ_ONLY = ("state", "rank", "world_size", "local_rank", "comm", "collectives", "sample_plan", "shard_plan",
             "schedule", "callbacks", "is_main", "global_batch_size", "steps_per_epoch", "schedule_step",
             "micro_batch", "finished")


def _own_private_names(cls: type) -> list[str]:
    """Single-underscore names a class and its bases up to Trainer define (name-mangled ones excluded)."""
    return [f"{klass.__name__}.{name}" for klass in cls.__mro__ if klass is not object
            for name in vars(klass) if name.startswith("_") and not name.startswith("__")
            and not name.startswith(f"_{klass.__name__}__")]


def _binding_trainers() -> list[type]:
    classes: list[type] = [Trainer]
    try:
        from hvdazure.torch import TorchTrainer
        classes.append(TorchTrainer)
    except ImportError:
        pass
    try:
        from hvdazure.tensorflow import TensorFlowTrainer
        classes.append(TensorFlowTrainer)
    except ImportError:
        pass
    return classes


@pytest.mark.parametrize("cls", _binding_trainers(), ids=lambda cls: cls.__name__)
def test_a_trainer_class_defines_no_private_name_a_subclass_could_take(cls: type) -> None:
    # was: 27 private methods (`_build`, `_prepare`, `_emit`, ...) that a user's helper of the same name
    # silently replaced
    assert _own_private_names(cls) == []


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_a_trainer_instance_holds_only_the_loop_and_its_backend_under_mangled_names(framework: str) -> None:
    if framework == "torch":
        from hvdazure.torch import TorchTrainer as Base
    else:
        Base = pytest.importorskip("hvdazure.tensorflow").TensorFlowTrainer

    class UserTrainer(Base):  # type: ignore[misc, valid-type]
        pass

    trainer = UserTrainer(TrainConfig())
    assert sorted(vars(trainer)) == sorted(["_Trainer__loop", f"_{Base.__name__}__backend"])
    assert isinstance(loop_of(trainer), TrainingLoop)


@pytest.mark.parametrize("name", READ_ONLY)
def test_the_runs_facts_are_read_only_properties(name: str) -> None:
    # was: plain attributes that fit() overwrote (collectives, shard_plan, schedule, callbacks)
    trainer = FakeTrainer(ThreadWorld(1), 0, LinearProblem.make(8), TrainConfig())
    with pytest.raises(AttributeError):
        setattr(trainer, name, "the user's")


def test_config_may_be_replaced_between_fits() -> None:
    trainer = FakeTrainer(ThreadWorld(1), 0, LinearProblem.make(8), TrainConfig())
    trainer.config = trainer.config.replace(epochs=3)
    assert loop_of(trainer).config.epochs == 3


def test_fit_leaves_the_processs_excepthook_as_it_found_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # was: fit() wrapped whatever hook the program had set in hvdazure's own, for the whole process
    def programs_hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        pass

    monkeypatch.setattr(sys, "excepthook", programs_hook)
    world = ThreadWorld(1)
    trainer = FakeTrainer(world, 0, LinearProblem.make(8),
                          TrainConfig(lr=0.05, batch_size=2, epochs=1, progress_bar=False))
    world.run([trainer.fit])
    assert sys.excepthook is programs_hook
