"""A user's trainer that defines, for its own use, every name the loop used to keep on the trainer itself
(before the loop's state moved into core/training_loop.py): 27 private methods, 13 private attributes. The
loop must neither call the user's methods nor read or overwrite the user's attributes, so this trainer
trains exactly as the class it extends; `squat_intact()` says whether the user's attributes survived fit().

Used by torch_job.py and tf_job.py with `--set extra.squat=true` (test_torch_trainer.py, test_tf_trainer.py).
"""

from typing import Any

# what core/trainer.py's Trainer defined as its own private methods and attributes, up to hvdazure 0.9
LOOP_METHODS = (
    "_build", "_check_global_batch", "_check_micro_batch_sizes", "_check_validation_step", "_continue_from",
    "_continue_run", "_create_backend", "_default_callbacks", "_emit", "_end_schedule_at_max_steps",
    "_eval_due", "_finished", "_gather_names", "_manifest", "_max_steps_reached", "_new_meter", "_prepare",
    "_rank_step", "_reduce_metrics_and_votes", "_reopen_cut_epoch", "_run_evaluation", "_start",
    "_stop_for_signal", "_stop_signals_caught", "_stop_vote", "_train_epoch", "_trainer_checkpoints")
LOOP_ATTRIBUTES = (
    "_backend", "_checkpoints", "_context", "_data_order", "_epoch_means", "_fitted", "_meter",
    "_ranks_averaged", "_rng", "_signal", "_signal_reason", "_step_batches", "_user_callbacks")


def _user_method(name: str) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the loop called the user's own {name}()")

    method.__name__ = name
    return method


def squatting(base: type) -> type:
    """A subclass of the user's trainer `base` with every old loop name taken by the user."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        self._user_values()
        base.__init__(self, *args, **kwargs)
        self._user_values()

    def _user_values(self: Any) -> None:
        for name in LOOP_ATTRIBUTES:
            setattr(self, name, f"the user's {name}")

    def build_model(self: Any) -> Any:
        self._user_values()  # set again once fit() has started: the loop must not read them either
        return base.build_model(self)

    def squat_intact(self: Any) -> bool:
        return all(getattr(self, name) == f"the user's {name}" for name in LOOP_ATTRIBUTES)

    namespace = {name: _user_method(name) for name in LOOP_METHODS}
    namespace.update(__init__=__init__, _user_values=_user_values, build_model=build_model,
                     squat_intact=squat_intact)
    return type(f"Squatting{base.__name__}", (base,), namespace)
