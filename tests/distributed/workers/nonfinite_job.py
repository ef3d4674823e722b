"""torch_job.py's or tf_job.py's regression (first argument: torch or tensorflow) whose loss turns NaN on one
rank from one step on, for the tests of config field on_nan_loss (tests/distributed/test_nonfinite.py).

extra: nan_rank, nan_step, nan_steps (for nan_steps optimizer steps from step nan_step on, counted from 1;
every step from it when not given, rank nan_rank's training_step returns its loss times NaN, which makes its
gradients NaN too; on TensorFlow through a variable the compiled step reads). The rest as the job it borrows
from (`--set ...`, `--runs RUNS.json`). Each rank reports its final weights, whether they are finite, and the
history; a fit() that raises reports nothing and ends the script as a user's would.
"""

import math
import sys

import numpy as np
from _report import main, report_rank

from hvdazure import Callback, TrainConfig

FRAMEWORK = sys.argv.pop(1)


class Poison(Callback):
    """Sets the trainer's `poison` before each step (the loss is multiplied by 1 + poison): NaN on nan_rank
    from nan_step on."""

    def on_step_begin(self, trainer) -> None:
        extra = trainer.config.extra
        first = extra.get("nan_step", math.inf)
        poisoned = trainer.rank == extra.get("nan_rank", 0) and (
            first <= trainer.state.step + 1 < first + extra.get("nan_steps", math.inf))
        trainer.set_poison(math.nan if poisoned else 0.0)


if FRAMEWORK == "torch":
    from torch_job import RegressionTrainer

    class Trainer(RegressionTrainer):
        poison = 0.0

        def set_poison(self, value: float) -> None:
            self.poison = value

        def training_step(self, model, batch):
            return super().training_step(model, batch) * (1.0 + self.poison)  # its gradients NaN too

        def weights(self) -> list[np.ndarray]:
            return [p.detach().numpy() for p in self.model.parameters()]
else:
    import tensorflow as tf
    from tf_job import RegressionTrainer

    class Trainer(RegressionTrainer):
        def __init__(self, config, callbacks=()) -> None:
            super().__init__(config, callbacks)
            self.poison = tf.Variable(0.0, dtype=tf.float64)

        def set_poison(self, value: float) -> None:
            self.poison.assign(value)

        def training_step(self, model, batch):
            return super().training_step(model, batch) * (1.0 + self.poison)  # its gradients NaN too

        def weights(self) -> list[np.ndarray]:
            return self.model.get_weights()


def train_and_report(argv: list[str] | None = None) -> None:
    config = TrainConfig.from_cli(argv, log_every=1, progress_bar=False)
    trainer = Trainer(config, callbacks=[Poison()])
    history = trainer.fit()
    weights = trainer.weights()
    report_rank(trainer.rank, {
        "params": [w.flatten().tolist() for w in weights],
        "finite": all(bool(np.isfinite(w).all()) for w in weights),
        "history": history,
    })


if __name__ == "__main__":
    main(train_and_report)
