"""A running Trainer's checkpoints: which named stateful pieces go into them, when they are written, and how a
run resumes. The storage itself is core/checkpoint/store.py's.

The trainer hands over `CheckpointPieces` (torchtitan's Stateful parts): its train state, the epoch's
running means, the callbacks' states and the framework's extra state, each saved under its name in
trainer_state.json; the framework's model and optimizer files; this rank's RNG streams (rng.json holds
every rank's); and the manifest's description of the run. What a resume means for the run (the data
position at another world size, the RNG streams, the LR rescale) is the trainer's: it gets a `ResumePoint`.

A checkpoint directory holds one run. Every checkpoint records its run's id (core/checkpoint/store.py);
before the first step, rank 0 decides the run's id and whether the directory may be its (`start_run`): a
fresh run gets a new id and is refused, on every rank and before anything is written, if the directory
holds another run's checkpoints; a resumed run keeps the id of the checkpoint it resumed (at any world
size, from any path), and is refused if the directory holds checkpoints of another run. Checkpoints written
before run ids count as the run's that resumes one of them in its own directory. A job the scheduler runs
again (Azure ML, after a preemption) gets the same id as before (the environment's job id), so that a
fresh start finds its own checkpoints and continues them as `resume=auto` would, instead of being refused.

Rank 0 alone touches storage (CheckpointManager); every collective sits outside the rank-0-only code. A
save is entered by all ranks at the same step: they gather their RNG states, rank 0 writes, and the
outcome (the checkpoint's name, or the error) is broadcast, so a failing save is an error on every rank
rather than a hang. A resume is decided, read, verified, loaded and applied by rank 0 before it tells the
other ranks anything; it then broadcasts the small JSON state (or the error, which every rank raises), and
the trainer broadcasts the model and optimizer from rank 0: other ranks never need access to the files
(multi-node without shared storage), and none is left waiting in a collective when rank 0 cannot resume.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from copy import deepcopy
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO, Protocol

from hvdazure.core.agreement import Failure, every_rank_tries, rank0_decides
from hvdazure.core.backend import Collectives, FrameworkCheckpointContent
from hvdazure.core.callbacks import BuiltinCallback, Callback
from hvdazure.core.checkpoint.store import (
    MANIFEST,
    RUN_ID,
    Checkpoint,
    CheckpointError,
    CheckpointManager,
    new_run_id,
    pointer_directory,
    same_directory,
)
from hvdazure.core.checkpoint.weights import refuse_a_file
from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.environments import Environment
from hvdazure.core.errors import exception_line
from hvdazure.core.nonfinite import NonFiniteError
from hvdazure.core.object_store import StorageError, redact
from hvdazure.core.rank_logging import logger
from hvdazure.core.run_protocol import Run
from hvdazure.core.sample_plan import SamplePlan

STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.json"
# What a resume reads of the manifest (the trainer's ResumePoint uses them)
_MANIFEST_KEYS = ("world_size", "global_batch_size", "scaled_lr")
_RUNS_STARTED = itertools.count(1)  # the new runs this process has started (run_id_for_new_run)


def default_checkpoint_dir(checkpoint_dir: str | None, environment: Environment) -> str | None:
    """The configured directory, else the environment's own (None: no checkpoints)."""
    return checkpoint_dir if checkpoint_dir is not None else environment.default_checkpoint_dir()


def checkpoint_location(checkpoint: str, checkpoint_dir: str | None, environment: Environment,
                        what: str) -> tuple[str, str]:
    """(where, which) a `checkpoint=` of predict, test or export names: "latest" or "best" of the
    checkpoint directory (`default_checkpoint_dir`'s), or a path or URL (one checkpoint's directory, or a
    directory of them: its latest). A ConfigError naming `what` for latest/best without a directory."""
    if checkpoint not in ("latest", "best"):
        return checkpoint, "latest"
    directory = default_checkpoint_dir(checkpoint_dir, environment)
    if directory is None:
        raise ConfigError(f"{what}(checkpoint={checkpoint!r}) needs checkpoint_dir in the config, or give "
                          "the checkpoint's path")
    return directory, checkpoint


def run_id_for_new_run(job_id: str | None) -> str:
    """The id of a run that starts afresh (on rank 0). In a job the scheduler may run again (the environment
    has a job id: Azure ML's), the job's id and the run's number in this process: the same again when the
    job is run again after a preemption, so that it finds its own checkpoints. Else a new one."""
    number = next(_RUNS_STARTED)
    return f"{job_id}.{number}" if job_id else new_run_id()


def another_run(directory: str, others: Sequence[Checkpoint]) -> str:
    """How the newest of another run's checkpoints in `directory` is named in a refusal."""
    newest = max(others, key=lambda c: (c.step, c.name))
    run = f"run {newest.run_id}" if newest.run_id else "written before run ids"
    return f"{redact(directory)} holds the checkpoints of another run ({run}, newest {newest.name})"


class Stateful(Protocol):
    """A piece of a checkpoint: its JSON-ready state, and how to take it back."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class CallbackStates:
    """The callbacks whose state a checkpoint keeps, by a key stable across runs (class name and index)."""

    def __init__(self, callbacks: Callable[[], Sequence[Callback]]) -> None:
        self._callbacks = callbacks

    def keyed(self) -> dict[str, Callback]:
        keyed: dict[str, Callback] = {}
        for callback in self._callbacks():
            if not callback.main_only:
                name = type(callback).__name__
                keyed[f"{name}#{sum(k.startswith(name + '#') for k in keyed)}"] = callback
        return keyed

    def state_dict(self) -> dict[str, Any]:
        return {key: callback.state_dict() for key, callback in self.keyed().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        callbacks = self.keyed()
        for key, saved in state.items():
            if key in callbacks:
                callbacks[key].load_state_dict(saved)


@dataclass(frozen=True)
class CheckpointPieces:
    """What a trainer's checkpoint saves and a resume loads."""

    stateful: Mapping[str, Stateful]  # trainer_state.json: each piece's state_dict under its name
    framework: FrameworkCheckpointContent  # the model and optimizer files (rank 0)
    rng: Stateful  # this rank's RNG streams; rng.json holds every rank's, in rank order
    manifest: Callable[[str], dict[str, Any]]  # the run at this step, given the save's reason


@dataclass(frozen=True)
class ResumePoint:
    """What a resume found and restored: the checkpoint, its manifest, and every rank's saved RNG states
    (which the trainer restores, or not: at another world size none belongs to a rank)."""

    name: str
    url: str
    step: int
    manifest: dict[str, Any]
    rngs: list[dict[str, Any]]


@dataclass(frozen=True)
class WriteOutcome:
    """How rank 0's latest write ended: the checkpoint's name, or the error; both None when none ran."""

    name: str | None = None
    error: str | None = None
    nonfinite: bool = False  # the error: rank 0 found the weights not finite, and wrote nothing


class TrainerCheckpoints:
    """Saving and resuming one Trainer's checkpoints. Created on every rank; storage is used on rank 0."""

    def __init__(self, directory: str, pieces: CheckpointPieces, collectives: Collectives,
                 config: TrainConfig, framework_name: str, job_id: str | None = None) -> None:
        """`job_id`: the environment's id of this job, the same when its scheduler runs it again (None:
        none), which new runs' ids start with."""
        c = config
        self.job_id = job_id
        self.directory, self.pieces, self.collectives = directory, pieces, collectives
        self.is_main = collectives.rank == 0
        self.framework_name = framework_name
        self.manager = CheckpointManager(directory, keep_last=c.keep_last, keep_best=c.keep_best,
                                         monitor=c.monitor, mode=c.monitor_mode,
                                         hash=c.checkpoint_hash) if self.is_main else None
        self.last_saved_step: int | None = None
        self.run_id: str | None = None  # this run's id, on every rank once `start_run` has decided it
        self._pending: threading.Thread | None = None  # rank 0's write in progress
        self._durable = threading.Event()  # rank 0: the pending write's checkpoint is complete, or it failed
        self._outcome = WriteOutcome()  # rank 0: how the last write ended
        self.newest_finite: str | None = None  # this run's newest checkpoint (its weights are finite)

    def start_run(self, which: str | None, restore: Callable[[ResumePoint], str],
                  fallback: str | None = None) -> ResumePoint | None:
        """Begin the run in the checkpoint directory, on every rank, before the first step: resume `which`
        if it is given (see `resume`), decide the run's id, and refuse (a ConfigError on every rank, before
        anything is written) a directory that holds another run's checkpoints. Listing the directory also
        fails before training, on every rank, if rank 0 cannot use it (a missing container, a wrong key, no
        permission), rather than at the first save, an epoch later; one that does not exist yet is fine
        (the first save makes it). A fresh run (`which` None) whose directory holds this very job's
        checkpoints (run again by its scheduler) resumes them as "auto" would. Where "auto" finds no
        checkpoint, `fallback` (config field resume_from) is resumed instead."""
        if which is None:
            which = self._start_fresh()
            if which is None:
                return None
        point = self.resume(which, restore)
        if point is None and fallback is not None:
            logger.info(f"no checkpoint in {redact(self.directory)} yet: going on from {redact(fallback)} "
                        "(resume_from)")
            which = fallback
            point = self.resume(which, restore)
        elif point is None:
            logger.info(f"no checkpoint to resume from in {redact(self.directory)}; starting from scratch")
        self._claim(point, which)
        return point

    def _start_fresh(self) -> str | None:
        """A fresh run's id; refused if the directory holds another run's checkpoints. "auto" when they are
        its own: the scheduler has run this job again (the environment's job id is in the run id)."""
        def decide() -> dict[str, Any]:
            run, found = run_id_for_new_run(self.job_id), self._listed()
            if others := [c for c in found if c.run_id != run]:
                raise ConfigError(f"config field 'checkpoint_dir': {another_run(self.directory, others)}; "
                                  "continue that run with resume=auto, or give this run a new checkpoint_dir")
            return {"run_id": run, "own_checkpoints": bool(found)}

        decided = rank0_decides(self.collectives, decide, *self._directory_refusals())
        self._set_run(decided["run_id"])
        if not decided["own_checkpoints"]:
            return None
        logger.info(f"{redact(self.directory)} holds this job's own checkpoints (run {self.run_id}; the job "
                    "was started again): resuming from them, as resume=auto does")
        return "auto"

    def _claim(self, point: ResumePoint | None, which: str) -> None:
        """The resumed run's id (the checkpoint's; a new one for a checkpoint from before run ids, or when
        "auto" found none to resume and the directory has no run id either); refused if the directory holds
        checkpoints of another run. Checkpoints without a run id count as this run's when it resumed from
        its own directory."""
        def decide() -> dict[str, Any]:
            found = self._listed()
            assert self.manager is not None
            run = point.manifest.get(RUN_ID) if point is not None else None
            if not (isinstance(run, str) and run):
                current = self.manager.current_run(found) if which == "auto" else None
                run = current or run_id_for_new_run(self.job_id)
            here = which == "auto" or (point is not None
                                       and same_directory(_parent(point.url), self.directory))
            if not (others := [c for c in found if c.run_id != run and not (here and c.run_id is None)]):
                return {"run_id": run}
            held = f"config field 'checkpoint_dir': {another_run(self.directory, others)}"
            if which == "auto":  # only where two runs were started into one directory at once
                raise ConfigError(f"{held} beside run {run}'s, which resume=auto continues; give this run a "
                                  "new checkpoint_dir, or remove the other run's checkpoints")
            raise ConfigError(f"{held}, not of the one resumed from {redact(which)} (run {run}); give this "
                              "run a new checkpoint_dir, or resume=auto to continue the run it holds")

        self._set_run(rank0_decides(self.collectives, decide, *self._directory_refusals())["run_id"])

    def _set_run(self, run_id: str) -> None:
        self.run_id = run_id
        if self.manager is not None:
            self.manager.run_id = run_id  # recorded in every checkpoint; retention keeps to this run's

    def _listed(self) -> list[Checkpoint]:
        """Rank 0: the checkpoints in the directory (none if it does not exist yet)."""
        assert self.manager is not None
        try:
            return self.manager.checkpoints()
        except FileNotFoundError:
            return []

    def _directory_refusals(self) -> tuple[Failure, ...]:
        """How rank 0's decision about the checkpoint directory fails on every rank: its ConfigError as it
        is, a storage failure (one line naming the operation, the URL and the cause) or any other failure as
        a CheckpointError."""
        return (Failure(ConfigError, ConfigError), Failure(StorageError, CheckpointError),
                Failure(Exception, CheckpointError,
                        lambda exc: f"checkpoint_dir {self.directory} cannot be used: {exception_line(exc)}"))

    # --- saving ------------------------------------------------------------------------------------------
    def save(self, reason: str, step: int, wait: bool = True) -> str | None:
        """Checkpoint optimizer step `step`; called by all ranks together. Rank 0 writes it in a background
        thread; when `wait` is False, from a copy in memory while training goes on (the outcome is
        collected, on every rank, at the next save or `finish_pending`: one write at a time, so a save due
        while the previous one is still being written waits for it); when True, from the live state,
        waited for until the checkpoint is durable and `latest` names it (the deletion of older ones by
        retention goes on in the background). Returns the name once written."""
        self.finish_pending()
        self.pieces.framework.collect()  # a sharded optimizer's slices, streamed to rank 0
        mine = json.dumps(self.pieces.rng.state_dict()).encode()
        rngs = [json.loads(b) for b in self.collectives.allgather_bytes(mine)]
        if self.is_main:
            try:
                files, manifest = self._snapshot(reason, rngs, copy=not wait, step=step)
                self._durable.clear()
                self._pending = threading.Thread(target=self._write, args=(step, files, manifest, reason),
                                                 name="hvdazure-checkpoint", daemon=True)
                self._pending.start()
            except NonFiniteError as exc:
                self._outcome = WriteOutcome(error=str(exc), nonfinite=True)
            except Exception as exc:  # reported on every rank by finish_pending, never a hang
                self._outcome = WriteOutcome(error=f"saving a checkpoint to {self.directory} failed: {exc}")
        self.last_saved_step = step
        if not wait:
            return None
        if self.is_main and self._pending is not None:
            self._durable.wait()
        return self._share_outcome()

    def finish_pending(self) -> str | None:
        """Wait for rank 0's write in progress (if any), retention included, and share its outcome; every
        rank calls this at the same point. Raises CheckpointError on every rank if the write failed."""
        if self.is_main:
            self._join()
        return self._share_outcome()

    def _share_outcome(self) -> str | None:
        """Broadcast rank 0's outcome of the last write: its checkpoint's name, or its error raised here on
        every rank."""
        def written() -> str | None:
            if self._outcome.nonfinite:
                raise NonFiniteError(self._outcome.error)
            if self._outcome.error is not None:
                raise CheckpointError(self._outcome.error)
            return self._outcome.name

        try:
            name = rank0_decides(self.collectives, written, Failure(NonFiniteError, NonFiniteError),
                                 Failure(CheckpointError, CheckpointError))
        except (NonFiniteError, CheckpointError):  # shared, so taken (a failed broadcast leaves it)
            self._outcome = WriteOutcome()
            raise
        self._outcome = WriteOutcome()
        self.newest_finite = name or self.newest_finite
        return name

    def newest_finite_after_pending(self) -> str | None:
        """The newest checkpoint of this run (written or resumed) with finite weights, once rank 0's write
        in progress, if any, has ended (a write that failed leaves the one before); every rank calls this
        at the same point. Every checkpoint written is finite: rank 0 checks the weights first."""
        with contextlib.suppress(CheckpointError):
            self.finish_pending()
        return self.newest_finite

    def save_emergency(self, reason: str, step: int) -> str | None:
        """Rank 0 alone, no collectives (peers may be gone): best effort after an error in the loop."""
        if not self.is_main:
            return None
        self._join()
        if self.last_saved_step == step and self._outcome.error is None:
            return None
        try:
            files, manifest = self._snapshot(reason, [self.pieces.rng.state_dict()], copy=False, step=step)
            self._write(step, files, manifest, reason)
        except Exception as exc:
            logger.error(f"could not save a checkpoint after the error: {exc}")
        return self._outcome.name

    def _join(self) -> None:
        if self._pending is not None:
            self._pending.join()
            self._pending = None

    def _snapshot(self, reason: str, rngs: list[dict[str, Any]], copy: bool,
                  step: int) -> tuple[dict[str, Callable[[BinaryIO], None]], dict[str, Any]]:
        """Everything a checkpoint holds; model and optimizer copied now if `copy` (training goes on while
        they are written), the small JSON state always. A NonFiniteError, before anything is written, for
        weights that are not finite: `latest` and `best` only ever name finite weights."""
        if (weight := self.pieces.framework.nonfinite_weight()) is not None:
            newest = f"the newest finite checkpoint is {self.newest_finite}" if self.newest_finite else \
                "no checkpoint of this run holds finite weights"
            raise NonFiniteError(f"the model's weight {weight!r} holds NaN or infinite values at step "
                                 f"{step}: no checkpoint of it written; stopped all ranks; {newest}")
        state = {name: piece.state_dict() for name, piece in self.pieces.stateful.items()}
        files = {**self.pieces.framework.save_files(copy), STATE_FILE: _json_writer(deepcopy(state)),
                 RNG_FILE: _json_writer(rngs)}
        manifest = deepcopy(self.pieces.manifest(reason))
        if layout := self.pieces.framework.manifest_record():  # a sharded optimizer's partition
            manifest["optimizer_layout"] = deepcopy(layout)
        return files, manifest

    def _write(self, step: int, files: dict[str, Callable[[BinaryIO], None]], manifest: dict[str, Any],
               reason: str) -> None:
        """Rank 0's storage work (no collectives): its outcome is kept for finish_pending, and set (with
        `_durable`) as soon as the checkpoint is durable, before retention deletes older ones."""
        assert self.manager is not None

        def durable(checkpoint: Checkpoint) -> None:
            logger.info(f"saved checkpoint {checkpoint.name} ({reason})")
            self._outcome = WriteOutcome(name=checkpoint.name)
            self._durable.set()

        try:
            self.manager.save(step, files, manifest, on_durable=durable)
        except Exception as exc:
            if not self._durable.is_set():  # after that, the checkpoint is safe (retention only warns)
                self._outcome = WriteOutcome(error=f"saving a checkpoint to {self.directory} failed: {exc}")
        finally:
            self._durable.set()

    # --- resuming ---------------------------------------------------------------------------------------
    def resume(self, which: str, restore: Callable[[ResumePoint], str]) -> ResumePoint | None:
        """Restore the checkpoint `which` on every rank: "auto" (the newest valid one in the checkpoint
        directory; None if there is none), a checkpoint's path, or a `latest` pointer file's path (the
        newest valid checkpoint of its directory). Each rank loads the named pieces, then `restore` (the
        trainer's: what the resume means for the run; returns the log line). Any failure is one
        CheckpointError, raised on every rank. The caller broadcasts model and optimizer from rank 0.
        """
        found = rank0_decides(self.collectives, lambda: self._resume_on_main(which, restore),
                              Failure(CheckpointError, CheckpointError))
        if found["point"] is None:  # "auto" found none (start_run says what happens next)
            return None
        point, message = ResumePoint(**found["point"]), found.get("message", "")

        def load() -> None:  # rank 0 has: the others apply the state it sent
            nonlocal message
            if not self.is_main:
                message = self._load(point, found["state"], restore)

        # a value only one rank uses (its RNG state) may fail there: still an error everywhere; every rank
        # applied the state, or every rank raises (the first failed rank's error)
        every_rank_tries(self.collectives, load,
                         lambda exc: f"cannot resume from {point.url} on rank {self.collectives.rank}: "
                                     f"{exception_line(exc)}",
                         lambda failed: CheckpointError(failed[0].error))
        self.last_saved_step = point.step
        self.newest_finite = point.name if found.get("finite", True) else None
        logger.info(message)
        return point

    def _resume_on_main(self, which: str, restore: Callable[[ResumePoint], str]) -> dict[str, Any]:
        """Rank 0: choose, read and verify the checkpoint, load it into model and optimizer, and apply the
        pieces, all before the other ranks hear of it. Returns what they need to apply it too, or raises a
        CheckpointError (shared with every rank), one line naming the checkpoint and the problem: for
        any failure, not only an invalid checkpoint (storage, a missing key, a model of another shape), or
        they would wait in a collective for a rank 0 that is gone, or that lives on after the error (a
        notebook)."""
        where = self.directory if which == "auto" else which
        try:
            with self._open(which) as (checkpoint, paths):
                if checkpoint is None:
                    return {"point": None}
                where = checkpoint.url
                point, state = self._read(checkpoint, paths)
                self.pieces.framework.load_files(paths)  # the framework's load: model, optimizer
                message = self._load(point, state, restore)
                finite = self.pieces.framework.nonfinite_weight() is None  # (written before hvdazure checked)
                return {"point": asdict(point), "state": state, "message": message, "finite": finite}
        except CheckpointError:
            raise
        except Exception as exc:  # storage (permissions, authentication), a model of other layer sizes, ...
            raise CheckpointError(f"cannot resume from {where}: {exception_line(exc)}") from exc

    @contextlib.contextmanager
    def _open(self, which: str) -> Iterator[tuple[Checkpoint | None, dict[str, str]]]:
        """The checkpoint `which` names and its verified local files; (None, {}) when "auto" finds none."""
        assert self.manager is not None
        pointed = pointer_directory(which) if which != "auto" else None
        if which == "auto" or pointed is not None:
            manager = self.manager if pointed is None else CheckpointManager(pointed)
            if which == "auto":
                manager.cleanup_temporaries()  # leftovers of a writer killed mid-save
            with manager.open_latest_valid() as (checkpoint, paths, warnings):
                for warning in warnings:
                    logger.warning(warning)
                if checkpoint is None and pointed is not None:
                    raise CheckpointError(f"no valid checkpoint in {pointed} (named by {which})")
                yield checkpoint, paths
            return
        refuse_a_file(which, "; resume= goes on from an hvdazure checkpoint (a directory, or DIR/latest)")
        checkpoint = self.manager.open(which, verify=False)  # local_files verifies each file as it reads it
        with self.manager.local_files(checkpoint) as paths:
            yield checkpoint, paths

    def _read(self, checkpoint: Checkpoint, paths: dict[str, str]) -> tuple[ResumePoint, dict[str, Any]]:
        """The resume point and the pieces' saved states; CheckpointError naming what is missing (a
        checkpoint of another framework, or written by another version of hvdazure)."""
        where, manifest = checkpoint.url, checkpoint.manifest
        framework = manifest.get("framework")
        if framework != self.framework_name:
            raise CheckpointError(f"checkpoint {where} was written by {framework!r}, not by "
                                  f"{self.framework_name!r}")
        if missing := [name for name in (STATE_FILE, RNG_FILE) if name not in paths]:
            raise CheckpointError(f"checkpoint {where} holds no {missing[0]}")
        state, rngs = _read_json(paths[STATE_FILE]), _read_json(paths[RNG_FILE])
        needed = ((MANIFEST, manifest, _MANIFEST_KEYS), (STATE_FILE, state, tuple(self.pieces.stateful)))
        for source, data, keys in needed:
            if missing := [key for key in keys if not isinstance(data, dict) or key not in data]:
                raise CheckpointError(f"checkpoint {where}: {source} has no {missing[0]!r}, needed to resume")
        return ResumePoint(checkpoint.name, where, checkpoint.step, manifest, rngs), state

    def _load(self, point: ResumePoint, state: dict[str, Any], restore: Callable[[ResumePoint], str]) -> str:
        """Load the named pieces on this rank, then the trainer's `restore`; returns its log line."""
        for name, piece in self.pieces.stateful.items():
            piece.load_state_dict(state[name])
        return restore(point)


# --- what the data order depends on: recorded in every manifest, compared on resume -----------------------
def data_order_record(plan: SamplePlan, data_fingerprint: str | None) -> dict[str, Any]:
    """The manifest's record of what the plan's epoch order depends on: its fingerprint, the parameters a
    refusal names (seed, lanes, window, shards), and the data's own fingerprint (a sharded dataset's index;
    None for data in memory)."""
    order = plan.sample_order
    described: dict[str, Any] = {"seed": plan.seed, "num_samples": order.num_samples, **order.describe()}
    return {"order_fingerprint": plan.order_fingerprint(), "order": described,
            "data_fingerprint": data_fingerprint}


def refuse_changed_data(url: str, manifest: Mapping[str, Any], now: Mapping[str, Any]) -> None:
    """CheckpointError if the checkpoint's data order or data fingerprint differs from this run's `now`
    (data_order_record): the samples already trained on this epoch would not be the ones the resumed run
    skips. A checkpoint from before these were recorded resumes as before."""
    problems = []
    saved_data = manifest.get("data_fingerprint")
    if "data_fingerprint" in manifest and saved_data != now["data_fingerprint"]:
        problems.append(f"the training data's index changed ({saved_data} -> {now['data_fingerprint']}: "
                        "shards added, removed, resized or rewritten since)")
    if "order_fingerprint" in manifest and manifest["order_fingerprint"] != now["order_fingerprint"]:
        saved, current = manifest.get("order") or {}, now["order"]
        changed = [f"{key} {saved.get(key)} -> {current.get(key)}"
                   for key in sorted(set(saved) | set(current)) if saved.get(key) != current.get(key)]
        problems.append("the sample order changed (" + (", ".join(changed) or "shard sizes") + "; it "
                        "depends on the seed, lanes, window and shard sizes)")
    if problems:
        raise CheckpointError(
            f"cannot resume from {url}: {'; and '.join(problems)}. Resume with the data and settings the "
            "checkpoint was trained with, or start a new run (another checkpoint_dir, or no resume)")


def _parent(url: str) -> str:
    """The directory above a checkpoint's path or URL (pathlib would make abfs://c/run abfs:/c)."""
    return url.rstrip("/").rpartition("/")[0] or "."


def _json_writer(data: Any) -> Callable[[BinaryIO], None]:
    def write(file: BinaryIO) -> None:
        file.write(json.dumps(data).encode())

    return write


def _read_json(path: str) -> Any:
    with open(path, "rb") as file:
        return json.load(file)


class CheckpointCallback(BuiltinCallback):
    """Saves every `every_steps` optimizer steps and/or every `every_epochs` epochs."""

    def __init__(self, checkpoints: TrainerCheckpoints, every_steps: int | None,
                 every_epochs: int | None) -> None:
        self.checkpoints, self.every_steps, self.every_epochs = checkpoints, every_steps, every_epochs

    def on_step_end(self, run: Run) -> None:
        if self.every_steps and run.state.step % self.every_steps == 0:
            run.save_checkpoint("every_steps", wait=not run.config.checkpoint_async)

    def on_epoch_end(self, run: Run) -> None:
        completed = run.state.history[-1]["epoch"] + 1
        already = self.checkpoints.last_saved_step == run.state.step  # e.g. by every_steps, this step
        if self.every_epochs and completed % self.every_epochs == 0 and run.state.samples_in_epoch == 0 \
                and not already:
            run.save_checkpoint("every_epochs", wait=not run.config.checkpoint_async)
