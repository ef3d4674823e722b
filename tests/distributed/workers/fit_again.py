"""fit() twice on one real trainer, in one process (1 rank): `python fit_again.py torch|tensorflow [F=V]`
(F=V: an integer config field for both trainers, e.g. zero_stage=2).

The regression trainer of torch_job.py or tf_job.py runs 1 epoch, then, with `epochs` raised to 3, fit()
again; a second trainer runs the 3 epochs in one fit() (no checkpoints). Reports both runs' weights, LRs
and histories, the run ids of the first trainer's checkpoints, and the one line a third fit() (nothing left
to train) raises.
"""

import gc
import hashlib
import importlib
import os
import sys
import weakref
from pathlib import Path

from _report import report_rank

from hvdazure import TrainConfig
from hvdazure.core.checkpoint.store import CheckpointManager
from hvdazure.core.config import ConfigError
from hvdazure.core.training_loop import loop_of


def weights_sha256(trainer) -> str:
    if sys.argv[1] == "torch":
        return hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in trainer.model.parameters())
                              ).hexdigest()
    return hashlib.sha256(b"".join(w.tobytes() for w in trainer.model.get_weights())).hexdigest()


if __name__ == "__main__":
    job = importlib.import_module({"torch": "torch_job", "tensorflow": "tf_job"}[sys.argv[1]])
    checkpoints = Path(os.environ["HVDAZURE_TEST_OUT"]) / "ckpt"
    config = TrainConfig(epochs=1, batch_size=4, lr=0.05, warmup_steps=4, log_every=1, progress_bar=False,
                         checkpoint_dir=str(checkpoints), extra={"n_train": 37, "n_eval": 5})
    if len(sys.argv) > 2:
        field, value = sys.argv[2].split("=")
        config = config.replace(**{field: int(value)})
    again = job.RegressionTrainer(config)
    again.fit()
    again.config = again.config.replace(epochs=3)
    history = again.fit()
    try:
        again.fit()
        refused = None
    except ConfigError as exc:
        refused = str(exc)
    whole = job.RegressionTrainer(config.replace(epochs=3, checkpoint_dir=None))
    whole_history = whole.fit()
    whole_report = {"params_sha256": weights_sha256(whole), "history": whole_history,
                    "lrs": whole.recorder.lrs}
    # the trainers gone, their models and optimizers are freed (a sweep runs trial after trial in one process)
    sharded = weakref.ref(loop_of(whole).backend.sharded) if config.zero_stage else None
    del whole
    gc.collect()
    report_rank(0, {
        "again": {"params_sha256": weights_sha256(again), "history": history, "lrs": again.recorder.lrs},
        "whole": whole_report,
        "run_ids": [c.run_id for c in CheckpointManager(str(checkpoints)).checkpoints()],
        "refused": refused,
        "sharded_optimizer_freed": sharded is None or sharded() is None,
    })
