"""A TorchTrainer job for what `compression` and `precision` do to the numbers: linear regression on
torch_job.py's synthetic data, with the model in extra.dtype.

Each rank reports its parameters after training, the gradient of its own loss in the first step (before
Horovod exchanges it), the dtype of the model's output inside training_step (autocast's doing) and the
history. training_step also returns the metric "known": 0.1 on every batch, in the dtype of the model's output
(0.10009765625 in bfloat16), so its mean over any number of batches is known exactly.

extra: n_train, features, dtype (float64 or float32), zero_init (every parameter starts at 0: after one SGD
step with lr 1 the parameters are exactly minus the gradient Horovod exchanged).
"""

import torch
from _report import report_rank
from torch_job import Regression

from hvdazure import TrainConfig
from hvdazure.torch import TorchTrainer


class PrecisionTrainer(TorchTrainer):
    first_gradient: list[list[float]] | None = None
    forward_dtype: str | None = None

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
        loss = torch.nn.functional.mse_loss(prediction.to(dtype), y.to(dtype))
        if self.first_gradient is None:  # this rank's own gradient; grad() leaves .grad and Horovod alone
            gradients = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
            self.first_gradient = [g.flatten().tolist() for g in gradients]
        return {"loss": loss, "known": torch.tensor(0.1, dtype=prediction.dtype)}


if __name__ == "__main__":
    trainer = PrecisionTrainer(TrainConfig.from_cli(progress_bar=False))
    history = trainer.fit()
    report_rank(trainer.rank, {
        "params": [p.detach().flatten().tolist() for p in trainer.model.parameters()],
        "first_gradient": trainer.first_gradient,
        "forward_dtype": trainer.forward_dtype,
        "history": history,
    })
