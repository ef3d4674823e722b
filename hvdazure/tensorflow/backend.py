"""TensorFlowBackend: the framework's side of core/trainer.py's loop, on TensorFlow 2 / Keras 3 and
horovod.tensorflow.

What Horovod's Keras integration did before Keras 3 broke it (Horovod issue #4290), done on Horovod's
TensorFlow collectives instead: hvd.init and device placement, thread limits on CPU, one grouped allreduce
of the gradients per optimizer step inside a compiled step (compression, op, predivide), gradient
accumulation, clipping after the allreduce, broadcast of model and optimizer variables from rank 0, the
core's exact data plan over random-access arrays, and mixed precision through Keras policies. The user's
hooks (build_model, training_step, ...) are the TensorFlowTrainer's (tensorflow/trainer.py), called through
`KerasHooks`: this module does not import the trainer.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import horovod
import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdazure.core.backend import Backend, RankStep, UserHooks
from hvdazure.core.config import ConfigError
from hvdazure.core.metrics import HookReturnError, MetricAccumulator, check_metric_shape
from hvdazure.core.nonfinite import FIRST_GRADIENTS_STEP, FIRST_LOSS, FIRST_LOSS_STEP, RECORD, SKIPPED_STEPS
from hvdazure.core.sample_plan import SampleOrder, eval_range, first_eval_batch
from hvdazure.core.script.model_export import ExportError
from hvdazure.core.step_batches import StepCursor, loaded_cells
from hvdazure.core.step_times import no_device
from hvdazure.data.prediction_output import PredictionShards
from hvdazure.tensorflow.checkpoint_content import (
    MODEL_FILE,
    KerasCheckpointContent,
    broadcast_variables,
    load_variables,
    model_weights,
)
from hvdazure.tensorflow.collectives import TensorFlowCollectives, start_horovod
from hvdazure.tensorflow.data import DataView, data_view, output_as_numpy
from hvdazure.tensorflow.gradients import (
    allreduce_gradients,
    allreduce_options,
    dense_gradients,
    not_converted,
    refuse_zero_stage,
)
from hvdazure.tensorflow.model_export import FORMATS
from hvdazure.tensorflow.profiler import TensorFlowProfiler, gpu_stats
from hvdazure.tensorflow.sync_batchnorm import convert_sync_batchnorm, has_sync_batchnorm

_POLICIES = {"bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


class KerasHooks(UserHooks, Protocol):
    """The user's hooks TensorFlowBackend calls: core's UserHooks and Keras's build_optimizer.
    TensorFlowTrainer (tensorflow/trainer.py) fills it."""

    def build_optimizer(self, lr: float) -> keras.optimizers.Optimizer: ...


class TensorFlowBackend(Backend):
    """Runs a TensorFlowTrainer's hooks on horovod.tensorflow, in compiled steps."""

    framework_name = "tensorflow"

    def __init__(self, user: KerasHooks) -> None:
        self.user = user
        self.model: keras.Model
        self.optimizer: keras.optimizers.Optimizer
        self._eval_data: DataView | None = None

    def _start(self, comm: Any) -> TensorFlowCollectives:
        placement = start_horovod(comm)
        refuse_zero_stage(self.config.zero_stage, "TensorFlowTrainer")  # before the data is read
        self._on_gpu = placement.on_gpu
        self.device_layout = placement.layout(hvd.size(), hvd.cross_size())
        self.collectives = TensorFlowCollectives()
        return self.collectives

    def shutdown(self) -> None:
        hvd.shutdown()

    def load_datasets(self) -> SampleOrder:
        self._train_data = data_view(self.user.train_dataset(), "train_dataset()")
        eval_data = self.user.eval_dataset()
        self._eval_data = data_view(eval_data, "eval_dataset()") if eval_data is not None else None
        return self._train_data.order

    def data_fingerprint(self) -> str | None:
        return self._train_data.data_fingerprint

    def build(self, peak_lr: float) -> KerasCheckpointContent:
        c = self.config
        if c.grad_allreduce == "overlap":
            raise ConfigError("config field 'grad_allreduce': 'overlap' is PyTorch's only; the TensorFlow "
                              "binding allreduces the gradients after backward ('auto' or 'after_backward')")
        keras.utils.set_random_seed(c.seed)  # the same initial weights on every rank (rank 0's are sent)
        with _policy(c.precision):
            self.model = self.user.build_model()
            if not self.model.built:
                raise TypeError("build_model() must return a built model: start it with keras.Input(shape) "
                                "or call model.build(input_shape)")
            if c.sync_batchnorm:
                convert_sync_batchnorm(self.model)
        # Synchronized BatchNorm layers meet across ranks in every forward pass: a rank without samples in a
        # micro-batch runs one on an empty batch (loss weight 0) instead of none.
        self._forward_empty = hvd.size() > 1 and has_sync_batchnorm(self.model)
        optimizer = self.user.build_optimizer(peak_lr)
        # A LossScaleOptimizer of the user's own (its initial_scale, dynamic_growth_steps) is used as it is:
        # wrapped again, the gradients would be unscaled twice. on_nan_loss 'skip' skips a step whose
        # gradients are not finite the way fp16's loss scaling skips an overflowing one: by a
        # LossScaleOptimizer, held at a scale of 1 outside fp16. One mechanism, not two.
        own_scaler = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        self._scale_of_one = c.on_nan_loss == "skip" and c.precision != "fp16" and not own_scaler
        if c.precision == "fp16" and not own_scaler:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        elif self._scale_of_one:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=1.0)
        optimizer.build(self.model.trainable_variables)  # Keras makes its variables lazily: make them now
        self.optimizer = optimizer
        self._compiled = _CompiledSteps(self)
        return KerasCheckpointContent(self.model, self.optimizer)

    def broadcast_model_and_optimizer(self) -> None:
        broadcast_variables([*model_weights(self.model), *self.optimizer.variables])

    def set_lr(self, lr: float) -> None:
        try:
            self.optimizer.learning_rate.assign(lr)
        except AttributeError:
            raise ConfigError("build_optimizer must give the optimizer a number as learning_rate, not a "
                              "schedule: hvdazure applies warmup and the config's schedule") from None

    def epoch_batches(self, steps: StepCursor) -> Iterator[Any]:
        return self._train_data.batches(loaded_cells(self._train_data.reading_ahead(steps)))

    def run_step(self, step: RankStep, meter: MetricAccumulator, stop_vote: float | None) -> float:
        with_vote, vote = stop_vote is not None, _float64(stop_vote or 0.0)
        steps, times = self._compiled, self.clock
        work = list(step)  # the batches, each wait timed as it is taken (data)
        since = times.now()  # then forward, backward, exchange and update: one compiled step, one phase
        if self._forward_empty:  # synchronized BatchNorm layers must meet the other ranks' here too
            work = [(mb, self._train_data.take([]) if batch is None else batch, w) for mb, batch, w in work]
        number = tf.constant(step.number, tf.float64)
        if len(work) == 1 and work[0][1] is not None:  # forward, backward and update in one call
            micro_batch, batch, weight = work[0]
            self.micro_batch = micro_batch
            metrics, votes = steps.train(batch, _float64(weight), vote, with_vote, number)
            if not micro_batch.is_empty:  # an empty batch's mean loss is NaN, and counts for nothing
                self._add(meter, metrics, len(micro_batch.indices))
        else:
            total = None
            for micro_batch, batch, weight in work:
                if batch is None:  # no forward pass; this rank's zeros still join the allreduce
                    continue
                self.micro_batch = micro_batch
                gradients, metrics = steps.gradients(batch, _float64(weight), number)
                total = gradients if total is None else [
                    a + g for a, g in zip(total, gradients, strict=True)]
                if not micro_batch.is_empty:
                    self._add(meter, metrics, len(micro_batch.indices))
            if total is None:
                total = [tf.zeros_like(v) for v in self.model.trainable_variables]
            votes = steps.apply(total, vote, with_vote, number)
        vote_sum = float(votes) if with_vote else 0.0
        times.add("step", since)
        return vote_sum

    def _add(self, meter: MetricAccumulator, metrics: dict[str, tf.Tensor], count: int) -> None:
        """A micro-batch's metrics into the meter; with on_nan_loss 'skip', those of a finite loss only."""
        if self.config.on_nan_loss != "skip" or math.isfinite(float(metrics["loss"])):
            meter.add(metrics, count)

    def evaluate(self, meter: MetricAccumulator, first_batch_only: bool = False, data: Any = None) -> bool:
        data = data if data is not None else self._eval_data
        if data is None:
            return False
        size, ranks, rank = self.config.batch_size, self.collectives.size, self.collectives.rank
        mine = (first_eval_batch(len(data), size, ranks, rank) if first_batch_only else
                eval_range(len(data), ranks, rank))
        data.read_ahead(np.arange(mine.start, mine.stop))  # sharded: its first shards, now
        for start in range(mine.start, mine.stop, size):  # a rank with no samples runs nothing
            indices = range(start, min(start + size, mine.stop))
            metrics = self._compiled.evaluate(data, data.take(indices))
            meter.add(metrics, len(indices))
        return True

    def inference_data(self, dataset: Any, purpose: str) -> DataView:
        return data_view(dataset, f"{purpose}(dataset)")

    def predict(self, data: DataView, batches: list[range]) -> Iterator[Any]:
        if batches:
            data.read_ahead(np.arange(batches[0].start, batches[-1].stop))  # sharded: its first shards, now
        return (self._compiled.predict(data, data.take(indices)) for indices in batches)

    def example_model_input(self) -> Any:
        """The model's input on the training data's first batch, as the user's own step gives it
        (predict_step's, else validation_step's, else training_step's first call of the model, run eagerly
        and caught in the model's `call`; nothing of it is kept), for checking an export."""
        if not hasattr(self, "model"):
            raise ExportError("export() needs the model built: after fit(), or predict()/test() with a "
                              "checkpoint; or use hvdazure.tensorflow.export(checkpoint, path, model)")
        data = getattr(self, "_train_data", None) or data_view(self.user.train_dataset(), "train_dataset()")
        batch = tf.nest.map_structure(tf.convert_to_tensor,
                                      data.take(range(min(len(data), max(2, self.config.batch_size)))))
        seen: list[Any] = []
        call = self.model.call

        def capture(*args: Any, **kwargs: Any) -> Any:
            if not seen:
                seen.append(args[0] if args else kwargs.get("inputs"))
            return call(*args, **kwargs)

        self.model.call = capture  # on the instance, for the steps below only
        try:
            for step in (self.user.predict_step, self.user.validation_step, self.user.training_step):
                with contextlib.suppress(NotImplementedError):
                    step(self.model, batch)
                    break
        finally:
            del self.model.call
        if not seen or seen[0] is None:
            raise ExportError("no step called the model on the training data's first batch: give export() "
                              "an example_input")
        return tf.nest.map_structure(np.asarray, seen[0])

    def output_as_numpy(self, value: Any) -> np.ndarray:
        return output_as_numpy(value)

    def prediction_writer(self, output: str) -> PredictionShards:
        return PredictionShards(output)

    model_file = MODEL_FILE
    export_formats = FORMATS

    def load_model_file(self, path: str) -> None:
        try:
            load_variables(path, model_weights(self.model), MODEL_FILE)
        except (OSError, KeyError) as exc:
            raise ValueError(f"{MODEL_FILE} is not a model of the TensorFlow binding ({exc})") from None

    def nonfinite_record(self) -> list[Any]:
        # on the host as numbers, as the metrics are there (metric_to_float64): the row stays one constant
        record = self._compiled.record
        return record if self._on_gpu else [float(v.numpy()) for v in record]

    def metric_to_float64(self, value: Any) -> Any:
        # On the host a metric is read as a Python float: the same float64 arithmetic as TensorFlow's, without
        # an eager cast, multiply and add per metric and step (~0.1 ms). On a GPU reading it would wait.
        return tf.cast(value, tf.float64) if self._on_gpu else float(value)

    def framework_versions(self) -> dict[str, str]:
        return {"tensorflow": tf.__version__, "keras": keras.__version__, "horovod": horovod.__version__}

    def step_profiler(self) -> TensorFlowProfiler:
        return TensorFlowProfiler()

    def device_stats(self) -> tuple[float, float, float]:
        return gpu_stats() if self._on_gpu else no_device()


class _CompiledSteps:
    """The backend's tf.functions, each traced once: batches of every size share one signature."""

    def __init__(self, backend: TensorFlowBackend) -> None:
        self.backend = backend
        c = backend.config
        self._allreduce_options = allreduce_options(c.reduce_op, c.compression, c.gradient_predivide_factor)
        self._of_data: dict[tuple[str, int], tuple[Any, _FlatFunction]] = {}  # per hook and data view
        # this rank's record of non-finite steps (core/nonfinite.py's RECORD), updated inside the compiled
        # steps: on a GPU it stays there until the log interval's collective reads it
        self.record = [tf.Variable(0.0, dtype=tf.float64, trainable=False) for _ in RECORD]

    # The training functions are made at the first step: predict() and test() before any fit() have no
    # training data (the batch signature is the training data's).
    @functools.cached_property
    def _batch(self) -> Any:
        return self.backend._train_data.signature()

    @functools.cached_property
    def _gradients(self) -> _FlatFunction:
        return _FlatFunction(self._gradients_of_flat, [*tf.nest.flatten(self._batch), _SCALAR, _SCALAR])

    @functools.cached_property
    def _train(self) -> dict[bool, _FlatFunction]:
        return {with_vote: _FlatFunction(self._train_flat(with_vote),
                                         [*tf.nest.flatten(self._batch), _SCALAR, _SCALAR, _SCALAR])
                for with_vote in (False, True)}

    @functools.cached_property
    def _apply(self) -> dict[bool, _FlatFunction]:
        gradients = [tf.TensorSpec(v.shape, v.dtype) for v in self.backend.model.trainable_variables]
        return {with_vote: _FlatFunction(self._apply_flat(with_vote), [*gradients, _SCALAR, _SCALAR])
                for with_vote in (False, True)}

    # --- what the backend calls (nested batches and gradient lists; flattened for the compiled calls) -----
    def train(self, batch: Any, weight: tf.Tensor, vote: tf.Tensor, with_vote: bool,
              number: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        """One micro-batch's forward, backward and update in one call (optimizer step `number`); its metrics
        and the summed votes."""
        try:
            return self._train[with_vote](*tf.nest.flatten(batch), weight, vote, number)
        except tf.errors.InvalidArgumentError as exc:
            raise _not_compilable(exc, self.backend.config.compile) from None

    def gradients(self, batch: Any, weight: tf.Tensor,
                  number: tf.Tensor) -> tuple[list[tf.Tensor], dict[str, tf.Tensor]]:
        try:
            return self._gradients(*tf.nest.flatten(batch), weight, number)
        except tf.errors.InvalidArgumentError as exc:
            raise _not_compilable(exc, self.backend.config.compile) from None

    def apply(self, gradients: list[tf.Tensor], vote: tf.Tensor, with_vote: bool,
              number: tf.Tensor) -> tf.Tensor:
        return self._apply[with_vote](*gradients, vote, number)

    def evaluate(self, data: Any, batch: Any) -> dict[str, tf.Tensor]:
        """validation_step's metrics of `batch` of the data view `data` (a function per view's signature)."""
        return self._of(data, "validation_step", self._evaluate_nested)(*tf.nest.flatten(batch))

    def predict(self, data: Any, batch: Any) -> Any:
        """predict_step's outputs for `batch` of the data view `data`."""
        return self._of(data, "predict_step", self._predict_nested)(*tf.nest.flatten(batch))

    def _of(self, data: Any, hook: str, body: Callable[[Any], Any]) -> _FlatFunction:
        key = (hook, id(data))
        if key not in self._of_data or self._of_data[key][0] is not data:
            signature = data.signature()
            function = _FlatFunction(lambda *args: body(tf.nest.pack_sequence_as(signature, args)),
                                     tf.nest.flatten(signature))
            self._of_data[key] = (data, function)  # the view is kept: its id is not reused while cached
        return self._of_data[key][1]

    # --- the compiled bodies, on flat arguments ---------------------------------------------------------
    def _gradients_of_flat(self, *args: tf.Tensor) -> tuple[list[tf.Tensor], dict[str, tf.Tensor]]:
        return self._gradients_of(tf.nest.pack_sequence_as(self._batch, args[:-2]), args[-2], args[-1])

    def _train_flat(self, with_vote: bool) -> Callable[..., tuple[dict[str, tf.Tensor], tf.Tensor]]:
        def train(*args: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
            batch, (weight, vote, number) = tf.nest.pack_sequence_as(self._batch, args[:-3]), args[-3:]
            gradients, metrics = self._gradients_of(batch, weight, number)
            return metrics, self._update(gradients, vote, with_vote, number)
        return train

    def _apply_flat(self, with_vote: bool) -> Callable[..., tf.Tensor]:
        return lambda *args: self._update(list(args[:-2]), args[-2], with_vote, args[-1])

    def _predict_nested(self, batch: Any) -> Any:
        b = self.backend
        return b.user.predict_step(b.model, batch)

    def _evaluate_nested(self, batch: Any) -> dict[str, tf.Tensor]:
        b = self.backend
        metrics = b.user.validation_step(b.model, batch)
        if not isinstance(metrics, Mapping):
            raise HookReturnError(f"validation_step must return a dict of metrics, got "
                                  f"{type(metrics).__name__}")
        return {k: tf.cast(_batch_mean("validation_step", k, v), tf.float64) for k, v in metrics.items()}

    def _loss_and_metrics(self, batch: Any, weight: tf.Tensor) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        b = self.backend
        loss, metrics = _loss_and_metrics(b.user.training_step(b.model, batch))
        weighted = loss * tf.cast(weight, loss.dtype)
        if isinstance(b.optimizer, keras.optimizers.LossScaleOptimizer):
            weighted = b.optimizer.scale_loss(weighted)
        return weighted, {"loss": tf.cast(loss, tf.float64), **metrics}

    def _gradients_of(self, batch: Any, weight: tf.Tensor,
                      number: tf.Tensor) -> tuple[list[tf.Tensor], dict[str, tf.Tensor]]:
        gradients, metrics = self._forward_backward(batch, weight)
        self._record_loss(number, weight, metrics["loss"])
        return gradients, metrics

    @functools.cached_property
    def _forward_backward(self) -> Callable[[Any, tf.Tensor], tuple[list[tf.Tensor], dict[str, tf.Tensor]]]:
        """The forward and backward pass of a micro-batch; with `compile: true` a tf.function compiled by
        XLA (jit_compile) that the steps call: one XLA cluster inside the step's graph, no extra call from
        the host. The allreduce and the update stay outside it, as Horovod's ops cannot be compiled by XLA
        (its XLA ops are not built: scripts/build_horovod.sh)."""
        def forward_backward(batch: Any, weight: tf.Tensor) -> tuple[list[tf.Tensor], dict[str, tf.Tensor]]:
            variables = self.backend.model.trainable_variables
            with tf.GradientTape() as tape:
                weighted, metrics = self._loss_and_metrics(batch, weight)
            return dense_gradients(tape.gradient(weighted, variables), variables), metrics

        if self.backend.config.compile:
            return tf.function(forward_backward, jit_compile=True)
        return forward_backward

    @not_converted  # no user code in it
    def _record_loss(self, number: tf.Tensor, weight: tf.Tensor, loss: tf.Tensor) -> None:
        """Keep the first non-finite loss of a micro-batch with samples (weight 0: none, its mean is NaN)."""
        step, value = self.record[FIRST_LOSS_STEP], self.record[FIRST_LOSS]
        first = (step == 0) & (weight > 0) & tf.logical_not(tf.math.is_finite(loss))
        value.assign(tf.where(first, loss, value))
        step.assign(tf.where(first, number, step))

    @not_converted  # no user code in it
    def _record_gradients(self, number: tf.Tensor, gradients: list[tf.Tensor]) -> None:
        """Keep the first step whose allreduced gradients are not finite: their sum is then NaN or inf (a sum
        of finite values overflows only past ~1e38; is_finite on every value costs about twice as much)."""
        step = self.record[FIRST_GRADIENTS_STEP]
        sums = [tf.reduce_sum(tf.cast(g, tf.float32) if g.dtype.size < 4 else g) for g in gradients]
        finite = tf.math.is_finite(tf.add_n([tf.cast(total, tf.float64) for total in sums]))
        step.assign(tf.where((step == 0) & tf.logical_not(finite), number, step))

    @not_converted  # no user code in it: Horovod's and Keras's own functions, called as they are
    def _update(self, gradients: list[tf.Tensor], vote: tf.Tensor, with_vote: bool,
                number: tf.Tensor) -> tf.Tensor:
        """The step's one grouped allreduce of the gradients (and the stop vote beside it), clipping of
        the global norm, and the update; non-finite gradients recorded (or the loss scaler's skip counted).

        Horovod pairs the ranks' collectives by name, and names an unnamed one after its input tensors and
        name scope: a rank with samples runs this inside the fused train step, a rank without (the short
        last step of an epoch) inside `apply`, so the names are fixed and free of name scopes, or the two
        would wait for each other forever."""
        b = self.backend
        votes = hvd.allreduce(tf.reshape(vote, [1]), op=hvd.Sum, name="hvdazure.stop_vote",
                              ignore_name_scope=True)[0] if with_vote else vote
        gradients = allreduce_gradients(gradients, self._allreduce_options)
        scaler = b.optimizer if isinstance(b.optimizer, keras.optimizers.LossScaleOptimizer) else None
        if scaler is None:
            self._record_gradients(number, gradients)
        # a loss scaler skips a step whose gradients are not finite, and halves its scale: counted below
        scale = tf.identity(scaler.dynamic_scale.value) if scaler is not None else None
        if b.config.grad_clip_norm is not None:
            gradients = _clip(gradients, b.config.grad_clip_norm, scale)
        b.optimizer.apply_gradients(zip(gradients, b.model.trainable_variables, strict=True))
        if scaler is not None:
            skipped = self.record[SKIPPED_STEPS]
            skipped.assign_add(tf.cast(scaler.dynamic_scale.value < scale, tf.float64))
            if b._scale_of_one:
                scaler.dynamic_scale.assign(1.0)
        return votes


class _FlatFunction:
    """A tf.function of flat tensor arguments, traced on its first call and then called through its concrete
    function: TensorFlow's dispatch of a polymorphic function (binding nested arguments, finding the trace)
    costs about three times as much (~0.4 against ~0.13 ms a call on this project's 2-core machine).

    AutoGraph re-raises an error raised while tracing as a StagingError whose message lists the frames of
    the converted code; a HookReturnError (a hook returned what the loop cannot use, found at trace time
    from static shapes) is raised as it is, its one line already naming the hook."""

    def __init__(self, function: Callable[..., Any], signature: list[tf.TensorSpec]) -> None:
        self._function = tf.function(function, input_signature=signature)
        self._concrete: Any = None

    def __call__(self, *tensors: Any) -> Any:
        if self._concrete is None:
            try:
                self._concrete = self._function.get_concrete_function()
            except Exception as exc:
                cause: BaseException | None = exc
                while cause is not None and not isinstance(cause, HookReturnError):
                    cause = cause.__context__
                if cause is None:
                    raise
                raise cause from None
        return self._concrete(*tensors)


_SCALAR = tf.TensorSpec((), tf.float64)


@contextlib.contextmanager
def _policy(precision: str) -> Iterator[None]:
    """Keras's global dtype policy for `precision` while the model is built (its layers keep it), and the
    one before it again after: another fit() in the same process (a sweep's next trial) with fp32 keeps the
    user's own policy and floatx (a float64 model), not the last trial's mixed one."""
    if precision not in _POLICIES:
        yield
        return
    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(_POLICIES[precision])
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(before)


@not_converted  # no user code in it
def _clip(gradients: list[tf.Tensor], clip_norm: float, scale: tf.Tensor | None) -> list[tf.Tensor]:
    """The allreduced gradients clipped to the global norm `clip_norm`, as if unscaled first: gradients
    scaled by a loss scale are clipped to clip_norm x scale, the same clipping of the same (unscaled)
    values, exactly so for a power of two. Non-finite gradients come out NaN (their norm is not finite),
    and the loss scaler skips the step as it would have."""
    if scale is None:
        return tf.clip_by_global_norm(gradients, clip_norm)[0]
    limit = tf.cast(scale, gradients[0].dtype) * clip_norm
    return tf.clip_by_global_norm(gradients, limit)[0]


_NOT_COMPILABLE = re.compile(r"Detected unsupported operations when trying to compile graph \S+ on "
                             r"\w+: ([\w, ]+)")


def _not_compilable(error: tf.errors.InvalidArgumentError, compile: bool) -> Exception:
    """XLA's refusal of an operation of the user's step (tf.py_function, string ops, ...) with `compile:
    true`, as one line naming the operations; any other error as it is. Every rank meets it at the first
    step, when XLA compiles the forward and backward pass."""
    found = _NOT_COMPILABLE.search(error.message) if compile else None
    if found is None:
        return error
    return ConfigError(f"config field 'compile': true, but XLA cannot compile training_step's "
                       f"{found.group(1).strip()} operation (jit_compile of the forward and backward pass): "
                       "use operations XLA supports (no tf.py_function) or compile: false")


@functools.lru_cache(maxsize=64)
def _float64(value: float) -> tf.Tensor:
    """A float64 scalar tensor, made once per value: the loss weights and stop votes of a run are few."""
    return tf.constant(value, tf.float64)


def _loss_and_metrics(output: Any) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """Split training_step's output into the loss to differentiate (per-sample losses averaged) and the
    metrics to report (as float64)."""
    if isinstance(output, Mapping):
        if "loss" not in output:
            raise HookReturnError(f"training_step returned a dict without 'loss': {sorted(output)}")
        metrics = {k: tf.cast(_batch_mean("training_step", k, tf.stop_gradient(v)), tf.float64)
                   for k, v in output.items() if k != "loss"}
        return _batch_mean("training_step", "loss", output["loss"]), metrics
    if isinstance(output, tf.Tensor | np.ndarray | float):
        return _batch_mean("training_step", "loss", output), {}
    raise HookReturnError("training_step must return a loss tensor or a dict with 'loss', got "
                          f"{type(output).__name__}")


@not_converted  # no user code in it
def _batch_mean(hook: str, name: str, value: Any) -> tf.Tensor:
    """A loss or metric `hook` returned, as its mean over the batch: one number, or one per sample (as
    Keras's losses and metrics give them), averaged. Anything else (softmax probabilities, a loss per
    element) is refused from its static shape, when the step is traced."""
    tensor = tf.convert_to_tensor(value)
    shape = tensor.shape
    check_metric_shape(hook, name, None if shape.rank is None else shape.as_list(), per_sample=True)
    return tf.reduce_mean(tensor)

