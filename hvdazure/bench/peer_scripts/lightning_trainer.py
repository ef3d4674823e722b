"""Lightning's Trainer with the DDP strategy, as Lightning's docs write it; Lightning starts the other
ranks itself (it runs this script again for each).

    python lightning_trainer.py SPEC.json N
"""

import sys
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from hvdazure.bench.models_torch import SyntheticData, build_model, sgd
from hvdazure.bench.peers_workload import PeerSpec, StepClock


class Classifier(L.LightningModule):
    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = build_model(model)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.model(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return sgd(self.parameters())


class StepEnds(L.Callback):
    def __init__(self, clock: StepClock) -> None:
        self.clock = clock

    def on_train_batch_end(self, *args: Any) -> None:
        self.clock.step_done()


def main(spec: PeerSpec, devices: int) -> None:
    cuda = torch.cuda.is_available()
    clock = StepClock(torch.cuda.synchronize if cuda else None)
    # no checkpoint, logger, progress bar or model summary: hvdazure's run writes none of these either
    trainer = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=devices, strategy="ddp", max_epochs=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[StepEnds(clock)])
    data = SyntheticData(spec.model, spec.samples(devices))
    trainer.fit(Classifier(spec.model), DataLoader(data, batch_size=spec.batch_size, shuffle=True))
    clock.write(spec, trainer.global_rank, trainer.world_size, strategy=type(trainer.strategy).__name__)


if __name__ == "__main__":
    main(PeerSpec.read(sys.argv[1]), int(sys.argv[2]))
