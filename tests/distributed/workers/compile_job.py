"""torch_job.py's regression with the model compiled: by config field `compile` (the trainer compiles it), or
by build_model itself (extra.user_compile: build_model returns torch.compile(model), as a user may write).

Each rank reports its final parameters, the history, and what the model the steps were given is: whether it is
torch.compile's wrapper, and what that wrapper holds (a Linear; another wrapper would be a double compile).
The rest as torch_job.py (`--set ...`, `--runs RUNS.json`).
"""

import torch
from _report import main, report_rank
from torch_job import RegressionTrainer

from hvdazure import TrainConfig


class CompiledRegression(RegressionTrainer):
    def build_model(self):
        model = super().build_model()
        return torch.compile(model) if self.config.extra.get("user_compile") else model


def train_and_report(argv: list[str] | None = None) -> None:
    trainer = CompiledRegression(TrainConfig.from_cli(argv, progress_bar=False))
    history = trainer.fit()
    inner = getattr(trainer.model, "_orig_mod", None)
    report_rank(trainer.rank, {
        "params": [p.detach().flatten().tolist() for p in trainer.model.parameters()],
        "history": history,
        "compiled": inner is not None,
        "inner": type(inner).__name__ if inner is not None else None,
    })


if __name__ == "__main__":
    main(train_and_report)
