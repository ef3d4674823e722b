"""predict() and test(), exact across ranks, and the weights they (and export) use: a checkpoint's, loaded on
rank 0 and sent to every rank, or before any fit() the model as build_model() returns it.

The loop (core/training_loop.py) holds one `Inference` and delegates to it; what inference needs of the run
is `InferenceRun`, which the loop fills (no import of the loop here: core's modules form no cycle).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from hvdazure.core.agreement import Failure, RankFailure, every_rank_tries, rank0_decides
from hvdazure.core.backend import Backend, Collectives, DataError
from hvdazure.core.checkpoint.store import CheckpointError
from hvdazure.core.checkpoint.trainer_checkpoints import checkpoint_location
from hvdazure.core.checkpoint.weights import NotACheckpoint, exported_checkpoint, refuse_a_file
from hvdazure.core.config import TrainConfig
from hvdazure.core.environments import Environment
from hvdazure.core.errors import exception_line
from hvdazure.core.metrics import MetricAccumulator
from hvdazure.core.object_store import redact
from hvdazure.core.predictions import (
    Outputs,
    PredictionWriter,
    checked_outputs,
    gather_in_order,
    join_batches,
    prediction_batches,
)
from hvdazure.core.rank_logging import logger

# predict()/test() before any fit() and without checkpoint=: the model build_model() made (it may have loaded
# pretrained weights), rank 0's weights on every rank
_AS_BUILT = "as built"
_AS_BUILT_LINE = ("the model as build_model() returns it (rank 0's weights, sent to every rank); checkpoint= "
                  "loads a checkpoint's weights instead")


class InferenceRun(Protocol):
    """What inference needs of the run (core/training_loop.py's TrainingLoop fills it)."""

    trainer: Any  # the user's trainer: its predict_dataset() and test_dataset() hooks
    config: TrainConfig
    backend: Backend

    @property
    def collectives(self) -> Collectives:
        """The backend's collectives over all ranks (once the ranks started)."""

    @property
    def environment(self) -> Environment:
        """The environment that started this process (once the ranks started)."""

    @property
    def rank(self) -> int:
        """This rank's place in the job."""

    @property
    def world_size(self) -> int:
        """The number of ranks."""

    @property
    def fit_started(self) -> bool:
        """Whether a fit() started the ranks and built the model (and may have trained it)."""

    def start_ranks(self) -> None:
        """Start the backend's ranks; this rank's place in them."""

    def new_meter(self, hook: str = "training_step") -> MetricAccumulator:
        """An empty meter of `hook`'s metrics."""

    def gather_names(self, names: list[str]) -> list[list[str]]:
        """Every rank's `names`, in rank order (a collective)."""


class Inference:
    """predict(), test() and the weights they use, for one run; holds what an earlier call loaded."""

    def __init__(self, run: InferenceRun) -> None:
        self._run = run
        self._built = False  # a predict()/test() before any fit() started ranks, built a model
        self._weights: str | None = None  # before any fit(): what that model holds, on every rank

    def predict(self, dataset: Any, checkpoint: str | None, output: str | None = None) -> Any:
        """predict_step over every sample of `dataset` once (the trainer's predict_dataset() if None), the
        outputs in dataset order on every rank (core/predictions.py); from `checkpoint`'s weights if given.
        With `output`, written as shards there instead (each rank its part, then the index) and the
        dataset returned."""
        run = self._run
        writer = run.backend.prediction_writer(output) if output is not None else None
        self.ready("predict", checkpoint)
        if writer is not None:
            rank0_decides(run.collectives, writer.check_empty, _predict_failure(output))
        data = run.backend.inference_data(self._dataset_for("predict", dataset), "predict")
        if not len(data):
            raise DataError("predict(): the dataset holds no samples")
        batches = prediction_batches(len(data), run.config.batch_size, run.world_size, run.rank)
        outputs = checked_outputs("predict_step", run.backend.predict(data, batches), batches,
                                  run.backend.output_as_numpy)
        if writer is None:
            return gather_in_order(join_batches("predict_step", outputs), run.collectives.allgather_bytes,
                                   len(data))
        return self._write_predictions(writer, output or "", outputs)

    def _write_predictions(self, writer: PredictionWriter, output: str, batches: Iterator[Outputs]) -> Any:
        """Every rank writes its part; all learn whether every part was written (a rank that failed raises
        its own error, the others one line naming it); rank 0 then writes the index."""
        run = self._run

        def refused(failed: list[RankFailure]) -> DataError:
            return DataError(f"predict(output={output!r}): rank {failed[0].rank} could not write its "
                             f"predictions ({failed[0].error}); the directory has no index: predict into a "
                             "new one")

        parts = every_rank_tries(run.collectives, lambda: writer.write_part(run.rank, batches).decode(),
                                 exception_line, refused, own_error=True)
        rank0_decides(run.collectives, lambda: writer.commit([part.encode() for part in parts]),
                      _predict_failure(output))
        logger.info(f"predict(): wrote the predictions as shards to {output}")
        return writer.open()

    def test(self, dataset: Any, checkpoint: str | None) -> dict[str, float]:
        """validation_step's metrics over `dataset` (the trainer's test_dataset() if None), the exact means
        over all its samples as an evaluation in fit() computes them; from `checkpoint`'s weights if given."""
        run = self._run
        self.ready("test", checkpoint)
        data = run.backend.inference_data(self._dataset_for("test", dataset), "test")
        meter = run.new_meter("validation_step")
        run.backend.evaluate(meter, data=data)
        reduced = meter.reduce(run.collectives.allgather_floats, run.gather_names)
        if not reduced.count:
            raise DataError("test(): the dataset holds no samples")
        return reduced.means

    def _dataset_for(self, purpose: str, dataset: Any) -> Any:
        """`dataset`, or the trainer's predict_dataset() / test_dataset() hook's; a DataError for none."""
        if dataset is None:
            trainer = self._run.trainer
            dataset = trainer.predict_dataset() if purpose == "predict" else trainer.test_dataset()
            if dataset is None:
                raise DataError(f"{purpose}() needs a dataset: pass one, or implement {purpose}_dataset()")
        return dataset

    def ready(self, what: str, checkpoint: str | None) -> str | None:
        """The ranks started and the model built (by a fit() or here, without the training data), and the
        weights of `checkpoint` loaded on rank 0 and sent to every rank; returns the URL of the checkpoint
        loaded (None: none). For predict, test and export.

        Without a checkpoint before any fit(), the model is the one build_model() returns, with rank 0's
        weights sent to every rank: build_model may load pretrained weights (a Hugging Face model, a file),
        so the model as built is not taken to be untrained; one log line says which weights are used."""
        run = self._run
        if not run.fit_started and not self._built:
            run.start_ranks()
            run.backend.build(run.config.lr)
            self._built = True
        if checkpoint is not None:
            self._weights = None  # until loaded: a load that fails midway leaves rank 0's alone
            self._weights = self._load_weights(checkpoint, what)
            return self._weights
        if not run.fit_started:
            if self._weights is None:  # rank 0's, as built: every rank predicts with the same model
                run.backend.broadcast_model_and_optimizer()
                self._weights = _AS_BUILT
            loaded = f"the model's weights of checkpoint {self._weights}, loaded by an earlier call"
            logger.info(f"{what}(): " + (_AS_BUILT_LINE if self._weights == _AS_BUILT else loaded))
        return None

    def _load_weights(self, checkpoint: str, what: str) -> str:
        """Rank 0 loads the model's weights of `checkpoint` ("latest"/"best" of the checkpoint directory, or a
        path or URL) and every rank gets them; a checkpoint that cannot be used is one line on every rank.
        Returns the checkpoint's URL (redacted; rank 0's)."""
        run = self._run
        where, which = checkpoint_location(checkpoint, run.config.checkpoint_dir, run.environment, what)
        then = "" if what == "export" else f"; then {what}() without checkpoint= uses that model"
        rank0_decides(run.collectives, lambda: refuse_a_file(where, then),
                      Failure(NotACheckpoint, NotACheckpoint))
        loaded = {"url": ""}  # rank 0's, for its log line

        def load() -> None:
            with exported_checkpoint(where, which, run.backend.model_file) as (chosen, path):
                try:
                    run.backend.load_model_file(path)
                except ValueError as exc:
                    raise CheckpointError(f"{redact(where)}: its model does not fit this trainer's "
                                          f"build_model(): {exc}") from None
            loaded["url"] = redact(chosen.url)

        rank0_decides(run.collectives, load, Failure(CheckpointError, CheckpointError))
        run.backend.broadcast_model_and_optimizer()
        logger.info(f"{what}(): the model's weights of checkpoint {loaded['url']}")
        return loaded["url"]


def _predict_failure(output: str | None) -> Failure:
    """How rank 0's storage failure in predict(output=...) (a ValueError or OSError: shards there already,
    an index that cannot be written) is one DataError on every rank."""
    return Failure((ValueError, OSError), DataError, lambda exc: f"predict(output={output!r}): {exc}")
