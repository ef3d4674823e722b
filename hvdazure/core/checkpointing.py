"""Checkpoints of a running Trainer: what goes into them, when they are written, and how a run resumes.

Rank 0 alone touches storage (core/checkpoint.py's CheckpointManager); every collective sits outside the
rank-0-only code. A save is entered by all ranks at the same step: they gather their RNG states, rank 0
writes, and the outcome (the checkpoint's name, or the error) is broadcast, so a failing save is an
error on every rank rather than a hang. A resume is decided, read, verified, loaded and applied by rank 0
before it tells the other ranks anything; it then broadcasts the small JSON state (or the error, which
every rank raises), and the model and optimizer are broadcast from rank 0: other ranks never need access to
the files (multi-node without shared storage), and none is left waiting in a collective when rank 0 cannot
resume.
"""

from __future__ import annotations

import contextlib
import json
import platform
import random
import threading
from collections.abc import Callable, Iterator
from copy import deepcopy
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from hvdazure._version import __version__
from hvdazure.core.callbacks import Callback
from hvdazure.core.checkpoint import (
    MANIFEST,
    Checkpoint,
    CheckpointError,
    CheckpointManager,
    pointer_directory,
)
from hvdazure.core.cluster import detect_environment
from hvdazure.core.rank_logging import logger

if TYPE_CHECKING:
    from hvdazure.core.trainer import Trainer

STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.json"
# What a resume reads besides the files: (file or manifest, keys it needs there)
_NEEDED_KEYS = ((MANIFEST, ("world_size", "global_batch_size", "scaled_lr")),
                (STATE_FILE, ("state", "epoch_train", "callbacks", "framework")))


def default_checkpoint_dir(checkpoint_dir: str | None) -> str | None:
    """The configured directory, else the detected environment's own (None: no checkpoints)."""
    return checkpoint_dir if checkpoint_dir is not None else detect_environment().default_checkpoint_dir()


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
                                         monitor=c.monitor, mode=c.monitor_mode,
                                         hash=c.checkpoint_hash) if trainer.is_main else None
        self.last_saved_step: int | None = None
        self._pending: threading.Thread | None = None  # rank 0's write in progress
        self._durable = threading.Event()  # rank 0: the pending write's checkpoint is complete, or it failed
        self._outcome: dict[str, Any] = {}  # rank 0: how the last write ended

    # --- saving ------------------------------------------------------------------------------------------
    def save(self, reason: str, wait: bool = True) -> str | None:
        """Checkpoint the current step; called by all ranks together. Rank 0 writes it in a background
        thread; when `wait` is False, from a copy in memory while training goes on (the outcome is
        collected, on every rank, at the next save or `finish_pending`: one write at a time, so a save due
        while the previous one is still being written waits for it); when True, from the live state,
        waited for until the checkpoint is durable and `latest` names it (the deletion of older ones by
        retention goes on in the background). Returns the name once written."""
        t = self.trainer
        self.finish_pending()
        rngs = [json.loads(b) for b in t.comm.allgather_bytes(json.dumps(self._rng_state()).encode())]
        if t.is_main:
            try:
                step, files, manifest = self._snapshot(reason, rngs, copy=not wait)
                self._durable.clear()
                self._pending = threading.Thread(target=self._write, args=(step, files, manifest, reason),
                                                 name="hvdazure-checkpoint", daemon=True)
                self._pending.start()
            except Exception as exc:  # reported on every rank by finish_pending, never a hang
                self._outcome = {"error": f"saving a checkpoint to {self.directory} failed: {exc}"}
        self.last_saved_step = t.state.step
        if not wait:
            return None
        if t.is_main and self._pending is not None:
            self._durable.wait()
        return self._share_outcome()

    def finish_pending(self) -> str | None:
        """Wait for rank 0's write in progress (if any), retention included, and share its outcome; every
        rank calls this at the same point. Raises CheckpointError on every rank if the write failed."""
        if self.trainer.is_main:
            self._join()
        return self._share_outcome()

    def _share_outcome(self) -> str | None:
        """Broadcast rank 0's outcome of the last write: its checkpoint's name, or its error raised here on
        every rank."""
        t = self.trainer
        mine = json.dumps(self._outcome).encode() if t.is_main else None
        outcome = json.loads(t.comm.broadcast_bytes(mine))
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
            step, files, manifest = self._snapshot(reason, [self._rng_state()], copy=False)
            self._write(step, files, manifest, reason)
        except Exception as exc:
            logger.error(f"could not save a checkpoint after the error: {exc}")
        return self._outcome.get("name")

    def _join(self) -> None:
        if self._pending is not None:
            self._pending.join()
            self._pending = None

    def _snapshot(self, reason: str, rngs: list[dict[str, Any]],
                  copy: bool) -> tuple[int, dict[str, Any], dict[str, Any]]:
        """Everything a checkpoint holds; model and optimizer copied now if `copy` (training goes on while
        they are written), the small JSON state always."""
        t, s = self.trainer, self.trainer.state
        state = {
            "state": s.to_dict(),
            "epoch_train": t.epoch_train.to_dict(),
            "callbacks": {key: cb.state_dict() for key, cb in t.stateful_callbacks().items()},
            "framework": t.state_io.save_extra(),
        }
        files = {**t.state_io.save_files(copy), STATE_FILE: _json_writer(deepcopy(state)),
                 RNG_FILE: _json_writer(rngs)}
        metrics = {**{f"train_{k}": v for k, v in s.train_metrics.items()},
                   **{f"eval_{k}": v for k, v in s.eval_metrics.items()}}
        manifest = deepcopy({
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
        """Rank 0's storage work (no collectives): its outcome is kept for finish_pending, and set (with
        `_durable`) as soon as the checkpoint is durable, before retention deletes older ones."""
        assert self.manager is not None

        def durable(checkpoint: Checkpoint) -> None:
            logger.info(f"saved checkpoint {checkpoint.name} ({reason})")
            self._outcome = {"name": checkpoint.name}
            self._durable.set()

        try:
            self.manager.save(step, files, manifest, on_durable=durable)
        except Exception as exc:
            if not self._durable.is_set():  # after that, the checkpoint is safe (retention only warns)
                self._outcome = {"error": f"saving a checkpoint to {self.directory} failed: {exc}"}
        finally:
            self._durable.set()

    def _rng_state(self) -> dict[str, Any]:
        return {**python_rng_state(), "framework": self.trainer.state_io.save_rng()}

    # --- resuming ---------------------------------------------------------------------------------------
    def resume(self, which: str) -> bool:
        """Restore the checkpoint `which` on every rank: "auto" (the newest valid one in the checkpoint
        directory; False if there is none), a checkpoint's path, or a `latest` pointer file's path (the
        newest valid checkpoint of its directory). Any failure is one CheckpointError, raised on every rank.
        """
        t = self.trainer
        outcome = self._resume_on_main(which) if t.is_main else None
        outcome = json.loads(t.comm.broadcast_bytes(json.dumps(outcome).encode() if t.is_main else None))
        if "error" in outcome:
            raise CheckpointError(outcome["error"])
        if outcome["name"] is None:
            logger.info(f"no checkpoint to resume from in {self.directory}; starting from scratch")
            return False
        message, error = outcome.get("message", ""), None
        if not t.is_main:
            try:
                message = self._apply(outcome)
            except Exception as exc:  # a value only this rank uses (its RNG state): still an error everywhere
                error = f"cannot resume from {outcome['url']} on rank {t.rank}: {_one_line(exc)}"
        errors = [json.loads(b) for b in t.comm.allgather_bytes(json.dumps(error).encode())]
        if first := next((e for e in errors if e), None):
            raise CheckpointError(first)  # every rank applied the state, or every rank raises
        t.broadcast_model_and_optimizer()
        self.last_saved_step = t.state.step
        logger.info(message)
        return True

    def _resume_on_main(self, which: str) -> dict[str, Any]:
        """Rank 0: choose, read and verify the checkpoint, load it into model and optimizer, and apply the
        trainer state, all before the other ranks hear of it. Returns what they need to apply it too, or
        {"error": one line naming the checkpoint and the problem}: any failure, not only an invalid
        checkpoint (storage, a missing key, a model of another shape), or they would wait in a collective
        for a rank 0 that is gone, or that lives on after the error (a notebook)."""
        where = self.directory if which == "auto" else which
        try:
            with self._open(which) as (checkpoint, paths):
                if checkpoint is None:
                    return {"name": None}
                where = checkpoint.url
                outcome = self._read(checkpoint, paths)
                self.trainer.state_io.load_files(paths)  # the framework's load: model, optimizer
                return {**outcome, "message": self._apply(outcome)}
        except CheckpointError as exc:
            return {"error": str(exc)}
        except Exception as exc:  # storage (permissions, authentication), a model of other layer sizes, ...
            return {"error": f"cannot resume from {where}: {_one_line(exc)}"}

    @contextlib.contextmanager
    def _open(self, which: str) -> Iterator[tuple[Checkpoint | None, dict[str, str]]]:
        """The checkpoint `which` names and its verified local files; (None, {}) when "auto" finds none."""
        assert self.manager is not None
        pointed = pointer_directory(which) if which != "auto" else None
        if which == "auto" or pointed is not None:
            manager = self.manager if which == "auto" else CheckpointManager(pointed)
            if which == "auto":
                manager.cleanup_temporaries()  # leftovers of a writer killed mid-save
            with manager.open_latest_valid() as (checkpoint, paths, warnings):
                for warning in warnings:
                    logger.warning(warning)
                if checkpoint is None and pointed is not None:
                    raise CheckpointError(f"no valid checkpoint in {pointed} (named by {which})")
                yield checkpoint, paths
            return
        checkpoint = self.manager.open(which, verify=False)  # local_files verifies each file as it reads it
        with self.manager.local_files(checkpoint) as paths:
            yield checkpoint, paths

    def _read(self, checkpoint: Checkpoint, paths: dict[str, str]) -> dict[str, Any]:
        """What every rank applies: the manifest, trainer state and RNG states; CheckpointError naming what
        is missing (a checkpoint of another framework, or written by another version of hvdazure)."""
        where, manifest = checkpoint.url, checkpoint.manifest
        framework = manifest.get("framework")
        if framework != self.trainer.framework_name:
            raise CheckpointError(f"checkpoint {where} was written by {framework!r}, not by "
                                  f"{self.trainer.framework_name!r}")
        if missing := [name for name in (STATE_FILE, RNG_FILE) if name not in paths]:
            raise CheckpointError(f"checkpoint {where} holds no {missing[0]}")
        outcome = {"name": checkpoint.name, "url": where, "manifest": manifest,
                   "state": _read_json(paths[STATE_FILE]), "rng": _read_json(paths[RNG_FILE])}
        for source, keys in _NEEDED_KEYS:
            data = manifest if source == MANIFEST else outcome["state"]
            if missing := [key for key in keys if not isinstance(data, dict) or key not in data]:
                raise CheckpointError(f"checkpoint {where}: {source} has no {missing[0]!r}, needed to resume")
        return outcome

    def _apply(self, outcome: dict[str, Any]) -> str:
        """Apply the trainer state, RNG states and data position on this rank; returns the log line."""
        t, manifest, saved = self.trainer, outcome["manifest"], outcome["state"]
        t.state.load_dict(saved["state"])
        history = t.state.history
        if t.state.samples_in_epoch and history and history[-1]["epoch"] == t.state.epoch:
            history.pop()  # the record of an epoch cut short (max_steps, a stop): it is about to go on
        t.epoch_train.load_dict(saved["epoch_train"])
        callbacks = t.stateful_callbacks()
        for key, state in saved["callbacks"].items():
            if key in callbacks:
                callbacks[key].load_state_dict(state)
        t.state_io.load_extra(saved["framework"])
        # Data continues from the samples consumed in the epoch, whatever the world size was.
        t.state.step_in_epoch = t.plan.steps_per_epoch - t.plan.steps_left(t.state.samples_in_epoch)
        rngs = outcome["rng"]
        old_world, old_batch = manifest["world_size"], manifest["global_batch_size"]
        if old_world == t.world_size and len(rngs) == t.world_size:
            set_python_rng_state(rngs[t.rank])
            t.state_io.load_rng(rngs[t.rank]["framework"])
        else:  # no saved RNG state belongs to this rank: a fresh, reproducible one
            t.seed_everything(t.config.seed * 1_000_003 + t.rank * 7919 + t.state.step)
        message = (f"resumed from {outcome['name']} at epoch {t.state.epoch + 1}, step {t.state.step} "
                   f"({t.state.samples_in_epoch} samples into the epoch)")
        if (old_world, old_batch) != (t.world_size, t.global_batch_size):
            t.state.world_size_history.append({"step": t.state.step, "world_size": t.world_size,
                                            "global_batch_size": t.global_batch_size})
            message += (f"; world size {old_world} -> {t.world_size}, global batch {old_batch} -> "
                        f"{t.global_batch_size}: LR rescaled {manifest['scaled_lr']:.6g} -> "
                        f"{t.schedule.peak_lr:.6g}")
        return message


def _read_json(path: str) -> Any:
    with open(path, "rb") as file:
        return json.load(file)


def _one_line(exc: BaseException) -> str:
    """An exception as one line: its type and its message's lines joined (torch's load_state_dict errors
    span several lines)."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
