"""Checkpoints of a running Trainer: what goes into them, when they are written, and how a run resumes.

Rank 0 alone touches storage (core/checkpoint.py's CheckpointManager); every collective sits outside the
rank-0-only code. A save is entered by all ranks at the same step: they gather their RNG states, rank 0
writes, and the outcome (the checkpoint's name, or the error) is broadcast, so a failing save is an
error on every rank rather than a hang. A resume is decided and read by rank 0, which broadcasts the
small JSON state and loads the tensors, then the model and optimizer are broadcast from rank 0: other
ranks never need access to the files (multi-node without shared storage).
"""

from __future__ import annotations

import copy
import json
import os
import platform
import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from hvdazure._version import __version__
from hvdazure.core.callbacks import Callback
from hvdazure.core.checkpoint import CheckpointError, CheckpointManager
from hvdazure.core.cluster import detect_cluster
from hvdazure.core.rank_logging import logger

if TYPE_CHECKING:
    from hvdazure.core.trainer import Trainer

STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.json"


def default_checkpoint_dir(checkpoint_dir: str | None) -> str | None:
    """The configured directory; inside Azure ML, ./outputs/checkpoints when none is configured."""
    if checkpoint_dir is None and detect_cluster().launcher == "azureml":
        return os.path.join("outputs", "checkpoints")
    return checkpoint_dir


def python_rng_state() -> dict[str, Any]:
    """Python's and NumPy's global RNG states as JSON."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(internal), gauss],
            "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]}


def set_python_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def _json_writer(data: Any) -> Callable[[BinaryIO], None]:
    return lambda file: file.write(json.dumps(data).encode())


class TrainerCheckpoints:
    """Saving and resuming one Trainer's checkpoints. Created on every rank; storage is used on rank 0."""

    def __init__(self, trainer: Trainer, directory: str) -> None:
        c = trainer.config
        self.trainer = trainer
        self.directory = directory
        self.manager = CheckpointManager(directory, keep_last=c.keep_last, keep_best=c.keep_best,
                                         monitor=c.monitor, mode=c.monitor_mode) if trainer.is_main else None
        self.last_saved_step: int | None = None
        self._pending: threading.Thread | None = None  # rank 0's write in progress
        self._outcome: dict[str, Any] = {}  # rank 0: how the last write ended

    # --- saving ------------------------------------------------------------------------------------------
    def save(self, reason: str, wait: bool = True) -> str | None:
        """Checkpoint the current step; called by all ranks together. Rank 0 snapshots the state in memory
        and writes it, in a background thread when `wait` is False (training goes on meanwhile; the outcome
        is collected, on every rank, at the next save or `finish_pending`). Returns the name once written."""
        t = self.trainer
        self.finish_pending()
        rngs = [json.loads(b) for b in t._allgather_bytes(json.dumps(self._rng_state()).encode())]
        if t.is_main:
            try:
                step, files, manifest = self._snapshot(reason, rngs)
                self._pending = threading.Thread(target=self._write, args=(step, files, manifest, reason),
                                                 name="hvdazure-checkpoint", daemon=True)
                self._pending.start()
            except Exception as exc:  # reported on every rank by finish_pending, never a hang
                self._outcome = {"error": f"saving a checkpoint to {self.directory} failed: {exc}"}
        self.last_saved_step = t.state.step
        return self.finish_pending() if wait else None

    def finish_pending(self) -> str | None:
        """Wait for rank 0's write in progress (if any) and share its outcome; every rank calls this at
        the same point. Raises CheckpointError on every rank if the write failed."""
        t = self.trainer
        if t.is_main:
            self._join()
        outcome = json.loads(t._broadcast_bytes(json.dumps(self._outcome).encode() if t.is_main else None))
        self._outcome = {}
        if "error" in outcome:
            raise CheckpointError(outcome["error"])
        return outcome.get("name")

    def save_emergency(self, reason: str) -> str | None:
        """Rank 0 alone, no collectives (peers may be gone): best effort after an error in the loop."""
        if not self.trainer.is_main:
            return None
        self._join()
        if self.last_saved_step == self.trainer.state.step and "error" not in self._outcome:
            return None
        try:
            step, files, manifest = self._snapshot(reason, [self._rng_state()])
            self._write(step, files, manifest, reason)
        except Exception as exc:
            logger.error(f"could not save a checkpoint after the error: {exc}")
        return self._outcome.get("name")

    def _join(self) -> None:
        if self._pending is not None:
            self._pending.join()
            self._pending = None

    def _snapshot(self, reason: str,
                  rngs: list[dict[str, Any]]) -> tuple[int, dict[str, Any], dict[str, Any]]:
        """Everything a checkpoint holds, copied now: the model may change while it is written."""
        t, s = self.trainer, self.trainer.state
        state = {
            "state": s.to_dict(),
            "epoch_train": t._epoch_train.to_dict(),
            "callbacks": {key: cb.state_dict() for key, cb in t.stateful_callbacks().items()},
            "framework": t._framework_state(),
        }
        files = {**t._state_writers(), STATE_FILE: _json_writer(copy.deepcopy(state)),
                 RNG_FILE: _json_writer(rngs)}
        metrics = {**{f"train_{k}": v for k, v in s.train_metrics.items()},
                   **{f"eval_{k}": v for k, v in s.eval_metrics.items()}}
        manifest = copy.deepcopy({
            "framework": t.framework_name, "reason": reason, "epoch": s.epoch,
            "step_in_epoch": s.step_in_epoch, "samples_in_epoch": s.samples_in_epoch,
            "samples_seen": s.samples_seen, "world_size": t.world_size,
            "global_batch_size": t.global_batch_size, "scaled_lr": t.schedule.peak_lr, "lr": s.lr,
            "metrics": metrics, "config": t.config.to_dict(), "world_size_history": s.world_size_history,
            "versions": {"hvdazure": __version__, "python": platform.python_version(),
                         **t.framework_versions()},
        })
        return s.step, files, manifest

    def _write(self, step: int, files: dict[str, Any], manifest: dict[str, Any], reason: str) -> None:
        """Rank 0's storage work (no collectives): its outcome is kept for finish_pending."""
        assert self.manager is not None
        try:
            checkpoint = self.manager.save(step, files, manifest)
            logger.info(f"saved checkpoint {checkpoint.name} ({reason})")
            self._outcome = {"name": checkpoint.name}
        except Exception as exc:
            self._outcome = {"error": f"saving a checkpoint to {self.directory} failed: {exc}"}

    def _rng_state(self) -> dict[str, Any]:
        return {**python_rng_state(), "framework": self.trainer._framework_rng_state()}

    # --- resuming ---------------------------------------------------------------------------------------
    def resume(self, which: str) -> bool:
        """Restore the checkpoint `which` ("auto" or a path) on every rank; False if "auto" found none."""
        t = self.trainer
        decision: dict[str, Any] = {}
        files: dict[str, bytes] = {}
        if t.is_main:
            try:
                decision, files = self._choose(which)
            except CheckpointError as exc:
                decision = {"error": str(exc)}
        decision = json.loads(t._broadcast_bytes(json.dumps(decision).encode() if t.is_main else None))
        if "error" in decision:
            raise CheckpointError(decision["error"])
        for warning in decision.get("warnings", []):
            logger.warning(warning)
        if decision.get("name") is None:
            logger.info(f"no checkpoint to resume from in {self.directory}; starting from scratch")
            return False
        if t.is_main:
            t._load_state_files(files)
        t._broadcast_model_and_optimizer()
        self._restore(decision)
        return True

    def _choose(self, which: str) -> tuple[dict[str, Any], dict[str, bytes]]:
        assert self.manager is not None
        warnings: list[str] = []
        if which == "auto":
            self.manager.cleanup_temporaries()  # leftovers of a writer killed mid-save
            checkpoint, files, warnings = self.manager.read_latest_valid()
            if checkpoint is None:
                return {"name": None, "warnings": warnings}, {}
        else:
            checkpoint = self.manager.open(which, verify=False)
            files = self.manager.read_files(checkpoint)  # verifies each file as it reads it, once
        decision = {"name": checkpoint.name, "manifest": checkpoint.manifest, "warnings": warnings,
                    "state": json.loads(files[STATE_FILE]), "rng": json.loads(files[RNG_FILE])}
        return decision, files

    def _restore(self, decision: dict[str, Any]) -> None:
        t, manifest, saved = self.trainer, decision["manifest"], decision["state"]
        t.state.load_dict(saved["state"])
        history = t.state.history
        if t.state.samples_in_epoch and history and history[-1]["epoch"] == t.state.epoch:
            history.pop()  # the record of an epoch cut short (max_steps, a stop): it is about to go on
        t._epoch_train.load_dict(saved["epoch_train"])
        callbacks = t.stateful_callbacks()
        for key, state in saved["callbacks"].items():
            if key in callbacks:
                callbacks[key].load_state_dict(state)
        t._framework_load_state(saved["framework"])
        self.last_saved_step = t.state.step
        # Data continues from the samples consumed in the epoch, whatever the world size was.
        t.state.step_in_epoch = t.plan.steps_per_epoch - t.plan.steps_left(t.state.samples_in_epoch)
        rngs = decision["rng"]
        old_world, old_batch = manifest["world_size"], manifest["global_batch_size"]
        if old_world == t.world_size and len(rngs) == t.world_size:
            set_python_rng_state(rngs[t.rank])
            t._set_framework_rng_state(rngs[t.rank]["framework"])
        else:  # no saved RNG state belongs to this rank: a fresh, reproducible one
            t._seed_everything(t.config.seed * 1_000_003 + t.rank * 7919 + t.state.step)
        message = (f"resumed from {decision['name']} at epoch {t.state.epoch + 1}, step {t.state.step} "
                   f"({t.state.samples_in_epoch} samples into the epoch)")
        if (old_world, old_batch) != (t.world_size, t.global_batch_size):
            t.state.world_size_history.append({"step": t.state.step, "world_size": t.world_size,
                                            "global_batch_size": t.global_batch_size})
            message += (f"; world size {old_world} -> {t.world_size}, global batch {old_batch} -> "
                        f"{t.global_batch_size}: LR rescaled {manifest['scaled_lr']:.6g} -> "
                        f"{t.schedule.peak_lr:.6g}")
        logger.info(message)


class CheckpointCallback(Callback):
    """Saves every `every_steps` optimizer steps and/or every `every_epochs` epochs."""

    def __init__(self, checkpoints: TrainerCheckpoints, every_steps: int | None,
                 every_epochs: int | None) -> None:
        self.checkpoints, self.every_steps, self.every_epochs = checkpoints, every_steps, every_epochs

    def on_step_end(self, trainer: Trainer) -> None:
        if self.every_steps and trainer.state.step % self.every_steps == 0:
            trainer.save_checkpoint("every_steps", wait=not trainer.config.checkpoint_async)

    def on_epoch_end(self, trainer: Trainer) -> None:
        completed = trainer.state.history[-1]["epoch"] + 1
        already = self.checkpoints.last_saved_step == trainer.state.step  # e.g. by every_steps, this step
        if self.every_epochs and completed % self.every_epochs == 0 and trainer.state.samples_in_epoch == 0 \
                and not already:
            trainer.save_checkpoint("every_epochs", wait=not trainer.config.checkpoint_async)
