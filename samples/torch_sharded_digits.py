"""Train the digits MLP of samples/torch_digits.py on shards (hvdazure.data.ShardedDataset): the same
training, for data that does not fit in memory. Write the shards first with samples/pack_digits.py.

    python samples/pack_digits.py data/digits
    hvdazure run -np 2 samples/torch_sharded_digits.py --set extra.data=data/digits
    hvdazure run -np 2 samples/torch_sharded_digits.py --set extra.data=abfs://CONTAINER/digits

Each rank reads few whole shards per epoch (on Blob: downloaded once per node into the cache, the next
ones fetched while it trains), every sample once per epoch, the same steps at any world size; a resume on
another number of ranks continues exactly.
"""

from __future__ import annotations

import torch

from hvdazure import TrainConfig
from hvdazure.data import ShardedDataset
from hvdazure.data.formats import default_decode
from hvdazure.torch import TorchTrainer

tar_decode = default_decode("tar")  # {"image.npy": b"...", "label.cls": b"3"} -> {"image": array, "label": 3}


def image_and_label(raw: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """A raw tar sample -> (image, label) tensors; module-level, so that DataLoader workers can pickle it."""
    sample = tar_decode(raw)
    return torch.from_numpy(sample["image"].reshape(64)), torch.tensor(sample["label"])


def digits(split: str, data: str) -> ShardedDataset:
    return ShardedDataset(f"{data.rstrip('/')}/{split}", image_and_label)


class ShardedDigitsTrainer(TorchTrainer):
    def build_model(self) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))

    def build_optimizer(self, params, lr):
        return torch.optim.SGD(params, lr=lr, momentum=0.9)

    def train_dataset(self):
        return digits("train", self.config.extra["data"])

    def eval_dataset(self):
        return digits("eval", self.config.extra["data"])

    def training_step(self, model, batch):
        x, y = batch
        logits = model(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, y),
                "accuracy": (logits.argmax(dim=1) == y).float().mean()}

    def validation_step(self, model, batch):
        return self.training_step(model, batch)


if __name__ == "__main__":
    config = TrainConfig.from_cli(epochs=15, batch_size=32, lr=0.05, warmup_epochs=1, schedule="cosine",
                                  log_every=10, num_workers=2, extra={"data": "data/digits"})
    trainer = ShardedDigitsTrainer(config)
    final = trainer.fit()[-1]
    if trainer.is_main:
        print(f"final: eval accuracy {final['eval_accuracy']:.4f}, eval loss {final['eval_loss']:.4f}, "
              f"train loss {final['train_loss']:.4f}", flush=True)
