"""A TorchTrainer job for what `compression` and `precision` do to the numbers: linear regression on
torch_job.py's synthetic data, with the model in extra.dtype.

Each rank reports its parameters after training, the gradient of its own loss in the first step (before
Horovod exchanges it), the dtype of the model's output inside training_step (autocast's doing), the
history, and at every optimizer step the loss scaler's scale before and after it and the parameters after it
(precision fp16). training_step also returns the metric "known": 0.1 on every batch, in the dtype of the
model's output (0.10009765625 in bfloat16), so its mean over any number of batches is known exactly.

extra: n_train, features, dtype (float64 or float32), zero_init (every parameter starts at 0: after one SGD
step with lr 1 the parameters are exactly minus the gradient Horovod exchanged), overflow_rank +
overflow_step (in that optimizer step, counted from 1, that rank's float16 gradients overflow: the gradient
of the model's output is multiplied by 1e30 on its way back, an overflow as a too-high loss scale makes one;
the loss and its metric stay as they were).
Several trainings in one job: `precision_job.py --runs RUNS.json` (workers/_report.py `main`).
"""

import torch
from _report import main, report_rank
from torch_job import Regression

from hvdazure import Callback, TrainConfig
from hvdazure.core.training_loop import loop_of
from hvdazure.torch import TorchTrainer


class ScaleRecorder(Callback):
    """The loss scaler's scale before and after each optimizer step, and the parameters after it."""

    def __init__(self) -> None:
        self.before: list[float] = []
        self.after: list[float] = []
        self.params: list[list[float]] = []

    @staticmethod
    def scale(trainer) -> float | None:
        scaler = loop_of(trainer).backend.scaler
        return None if scaler is None else scaler.get_scale()

    def on_step_begin(self, trainer) -> None:
        self.before.append(self.scale(trainer))

    def on_step_end(self, trainer) -> None:
        self.after.append(self.scale(trainer))
        self.params.append([v for p in trainer.model.parameters() for v in p.detach().flatten().tolist()])


class PrecisionTrainer(TorchTrainer):
    first_gradient: list[list[float]] | None = None
    forward_dtype: str | None = None

    def __init__(self, config: TrainConfig) -> None:
        self.scales = ScaleRecorder()
        super().__init__(config, callbacks=[self.scales])

    def build_model(self):
        extra = self.config.extra
        dtype = getattr(torch, extra.get("dtype", "float64"))
        model = torch.nn.Linear(extra.get("features", 3), 1, dtype=dtype)
        if extra.get("zero_init"):
            for parameter in model.parameters():
                torch.nn.init.zeros_(parameter)
        return model

    def build_optimizer(self, params, lr):
        return torch.optim.SGD(params, lr=lr)

    def train_dataset(self):
        return Regression(self.config.extra.get("n_train", 8), self.config.extra.get("features", 3), seed=1)

    def training_step(self, model, batch):
        _, x, y = batch
        dtype = model.weight.dtype
        prediction = model(x.to(dtype))
        self.forward_dtype = str(prediction.dtype)
        extra = self.config.extra
        if self.rank == extra.get("overflow_rank") and self.state.step + 1 == extra.get("overflow_step"):
            prediction.register_hook(lambda gradient: gradient * 1e30)  # inf in float16
        loss = torch.nn.functional.mse_loss(prediction.to(dtype), y.to(dtype))
        if self.first_gradient is None:  # this rank's own gradient; grad() leaves .grad and Horovod alone
            gradients = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
            self.first_gradient = [g.flatten().tolist() for g in gradients]
        return {"loss": loss, "known": torch.tensor(0.1, dtype=prediction.dtype)}


def train_and_report(argv: list[str] | None = None) -> None:
    trainer = PrecisionTrainer(TrainConfig.from_cli(argv, progress_bar=False))
    history = trainer.fit()
    report_rank(trainer.rank, {
        "params": [p.detach().flatten().tolist() for p in trainer.model.parameters()],
        "first_gradient": trainer.first_gradient,
        "forward_dtype": trainer.forward_dtype,
        "history": history,
        "scale_before": trainer.scales.before,
        "scale_after": trainer.scales.after,
        "step_params": trainer.scales.params,
    })


if __name__ == "__main__":
    main(train_and_report)
