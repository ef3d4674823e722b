"""`Trainer.main()` on real ranks: torch_job.py's regression trainer with predict_job.py's predict_step
and prediction set (101 samples), its command line dispatched by main (fit | test | predict)."""

import torch_job

from hvdazure.torch import TorchTrainer  # noqa: F401  (the binding main runs on)


class Predicting(torch_job.RegressionTrainer):
    def predict_step(self, model, batch):
        index, x, _ = batch
        return {"index": index, "y": model(x)}

    def predict_dataset(self):
        return torch_job.Regression(101, 3, seed=3)


if __name__ == "__main__":
    Predicting.main(epochs=1, batch_size=8, lr=0.05, log_every=1, progress_bar=False,
                    extra={"n_train": 37, "n_eval": 23})
