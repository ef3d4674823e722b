"""A TorchTrainer job for sharded optimizer state (zero_stage): a small MLP in float64 whose parameter count
(151, a prime) is a multiple of no world size, two param groups (no weight decay on biases) and a frozen
parameter the optimizer holds, so that slices cross tensor and group boundaries and the canonical numbering
of a checkpoint counts a parameter that is never stepped.

Configured through TrainConfig's CLI (`--set zero_stage=2 --set extra.optimizer=adamw ...`); several trainings
in one launch with `--runs RUNS.json` (workers/_report.py). extra: optimizer (sgd, momentum, adamw, adagrad,
lbfgs), n_train, step_twice_rank (that rank steps its optimizer twice per step: a defect the tests must see),
drop_state_after_resume (clears the optimizer's state before the step that begins at that step count:
the other defect they must see, a resume losing its slices' state), raise_at_step (every rank raises at the
end of that step: rank 0 then saves alone, which sharded state does not allow; the error is reported),
shared_model (build_model returns one model object for every training of the launch, its weights set as a
new one's: a model shared by trainers in one process), fail_in_backward_at_step (backward raises in that
step's last micro-batch, before any gradient is produced; the error is reported).
Each rank reports its final parameters, its optimizer's state (names, shapes, bytes) and the history.
"""

import hashlib
import warnings

import numpy as np
import torch
from _report import main, report_rank, step_times
from torch.utils.data import Dataset

from hvdazure import Callback, TrainConfig
from hvdazure.torch import TorchTrainer


class Data(Dataset):
    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(3)
        self.x = torch.tensor(rng.normal(size=(n, 7)), dtype=torch.float64)
        self.y = torch.tensor(rng.normal(size=(n, 2)), dtype=torch.float64)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class Defects(Callback):
    """The defects the tests must catch, on request: a slice stepped twice, a slice's state lost on resume."""

    def on_step_begin(self, trainer) -> None:
        extra = trainer.config.extra
        if extra.get("drop_state_after_resume") and trainer.state.step == extra["drop_state_after_resume"]:
            trainer.optimizer.state.clear()

    def on_step_end(self, trainer) -> None:
        if trainer.state.step == trainer.config.extra.get("raise_at_step"):
            raise RuntimeError(f"a planned error at step {trainer.state.step}")
        if trainer.rank == trainer.config.extra.get("step_twice_rank"):
            for group in trainer.optimizer.param_groups:  # the gradients are gone: step with the last ones
                for p in group["params"]:
                    if p.grad is None:
                        p.grad = torch.ones_like(p)
            trainer.optimizer.step()
            trainer.optimizer.zero_grad()


class Mlp(TorchTrainer):
    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config, callbacks=[Defects()])

    def build_model(self):
        model = torch.nn.Sequential(torch.nn.Linear(7, 13, dtype=torch.float64), torch.nn.Tanh(),
                                    torch.nn.Linear(13, 3, bias=False, dtype=torch.float64), torch.nn.Tanh(),
                                    torch.nn.Linear(3, 2, dtype=torch.float64))
        model.register_parameter("frozen", torch.nn.Parameter(torch.ones(2, dtype=torch.float64),
                                                              requires_grad=False))
        if not self.config.extra.get("shared_model"):
            return model
        if not SHARED:
            SHARED.append(model)
        SHARED[0].load_state_dict(model.state_dict())
        SHARED[0].zero_grad(set_to_none=True)  # the gradients a failed training left, as a new model has none
        return SHARED[0]

    def build_optimizer(self, params, lr):
        params = list(params)
        decay = [p for p in params if p.dim() > 1]
        rest = [p for p in params if p.dim() <= 1]
        # the biases at half the LR: a per-group factor the schedule (warmup) and set_lr keep
        groups = [{"params": decay}, {"params": rest, "weight_decay": 0.0, "lr": lr / 2}]
        name = self.config.extra.get("optimizer", "adamw")
        if name == "sgd":
            return torch.optim.SGD(groups, lr=lr)
        if name == "momentum":
            return torch.optim.SGD(groups, lr=lr, momentum=0.9, weight_decay=0.01)
        if name == "adagrad":
            return torch.optim.Adagrad(groups, lr=lr, initial_accumulator_value=0.1)
        if name == "lbfgs":
            return torch.optim.LBFGS(params, lr=lr)
        return torch.optim.AdamW(groups, lr=lr, weight_decay=0.05)

    def train_dataset(self):
        return Data(self.config.extra.get("n_train", 41))

    def training_step(self, model, batch):
        x, y = batch
        loss = torch.nn.functional.mse_loss(model(x) * model.frozen, y)
        if self.state.step + 1 == self.config.extra.get("fail_in_backward_at_step"):
            self.calls_in_step = getattr(self, "calls_in_step", 0) + 1
            if self.calls_in_step == self.config.grad_accum_steps:  # the last micro-batch's backward
                loss.register_hook(fail)
        return loss


def fail(gradient: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("a planned error in backward")


SHARED: list[torch.nn.Module] = []  # extra.shared_model's


def train_and_report(argv: list[str] | None = None) -> None:
    config = TrainConfig.from_cli(argv, log_every=1, progress_bar=False)
    trainer = Mlp(config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            history = trainer.fit()
        except RuntimeError as exc:  # extra.raise_at_step's, fail_in_backward_at_step's
            if not (config.extra.get("raise_at_step") or config.extra.get("fail_in_backward_at_step")):
                raise
            report_rank(trainer.rank, {"error": str(exc)})
            return
    params = [p.detach() for p in trainer.model.parameters()]
    state = trainer.optimizer.state
    report_rank(trainer.rank, {
        "params": [p.flatten().tolist() for p in params],
        "params_sha256": hashlib.sha256(b"".join(p.numpy().tobytes() for p in params)).hexdigest(),
        "optimizer_class": type(trainer.optimizer).__name__,
        "optimizer_params": [[list(p.shape) for p in g["params"]] for g in trainer.optimizer.param_groups],
        "state_bytes": sum(v.numel() * v.element_size() for s in state.values() for v in s.values()
                           if isinstance(v, torch.Tensor)),
        "history": history,
        "group_lrs": [g["lr"] for g in trainer.optimizer.param_groups],
        "warnings": [str(w.message) for w in caught],
        "step_times": step_times(trainer),
    })


if __name__ == "__main__":
    main(train_and_report)
