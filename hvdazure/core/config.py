"""TrainConfig: every training setting, typed and validated, loadable from YAML and `--set` overrides.

Validation happens in the constructor, on every rank, before any collective: a bad value is one
`ConfigError` naming the field and the value, identically on all ranks, so no rank waits for another.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import sys
import types
import typing
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from hvdazure.core.errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration value is invalid; the message names the field and the value. Uncaught, it ends the
    script with the bad-input status 2, as a bad `--set` does, whenever it is found (a batch size the plan
    cannot split is found once the world size is known), so that the launcher lets every rank name it."""


class ControllerError(ConfigError):
    """A configuration value the controller Horovod runs on cannot serve (Adasum under Gloo), found on
    every rank once Horovod has started, before training."""


@dataclass(frozen=True)
class TrainConfig:
    """Training settings, typed and validated when built. `batch_size` is per worker (per rank, per
    micro-batch); the LR is scaled for the global batch.

    Each field's meaning is the string under it: the documentation's configuration reference is generated
    from these fields, their types, defaults and strings (docs/gen/reference.py).
    """

    # length of training
    epochs: int = 1
    """Complete passes over the training data. Training ends after this many epochs or `max_steps`,
    whichever comes first, whatever the world sizes along the way."""
    max_steps: int | None = None
    """Optimizer steps in all (counted across resumes); stops earlier than `epochs` if reached."""
    # batch and learning rate
    batch_size: int = 32
    """Samples per worker per micro-batch. The global batch is `batch_size` x world size x
    `grad_accum_steps`."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; their gradients are summed and allreduced once."""
    lr: float = 1e-3
    """The learning rate tuned for `base_batch_size`; it is scaled for the global batch (`lr_scaling`)."""
    base_batch_size: int | None = None
    """The global batch `lr` was tuned for; null: `batch_size` (the LR of one process)."""
    lr_scaling: Literal["none", "linear", "sqrt"] = "linear"
    """How the LR follows the global batch: `lr` x (global batch / base batch), or its square root, or not
    at all."""
    warmup_epochs: float = 0.0
    """Goyal et al. (2017): a linear ramp from `lr` to the scaled LR over this many epochs, counted in
    optimizer steps (rounded up). Give `warmup_epochs` or `warmup_steps`, not both."""
    warmup_steps: int = 0
    """The same ramp, over this many optimizer steps."""
    schedule: Literal["constant", "cosine", "step"] = "constant"
    """The LR after warmup: constant; cosine decay to `min_lr` at the end of training; or x `step_gamma`
    every `step_size_epochs` epochs."""
    min_lr: float = 0.0
    """The floor of the cosine schedule."""
    step_size_epochs: int = 1
    """The step schedule: multiply the LR by `step_gamma` every this many epochs."""
    step_gamma: float = 0.1
    """The step schedule's factor, in (0, 1]."""
    # gradient exchange
    compression: Literal["none", "fp16"] = "none"
    """Horovod's gradient compression: `fp16` exchanges gradients rounded to float16. For bandwidth between
    nodes; on one machine's CPUs it costs more than it saves (`hvdazure bench allreduce`: 0.62x the
    uncompressed bandwidth under MPI, 0.17x under Gloo)."""
    reduce_op: Literal["average", "sum", "adasum"] = "average"
    """How gradients are combined across ranks. Adasum needs the MPI controller: under Gloo every rank
    refuses it before training (exit status 2)."""
    gradient_predivide_factor: float = 1.0
    """Split the averaging into a division before the sum and one after it (Horovod's option); 1.0 with
    Adasum."""
    grad_allreduce: Literal["auto", "overlap", "after_backward"] = "auto"
    """When the gradients are allreduced (PyTorch). `overlap`: each as backward produces it (Horovod's
    DistributedOptimizer); `after_backward`: all in one grouped allreduce after the step's backward passes;
    `auto`: overlap on GPUs (and for Adasum), after backward on CPUs, whose cores the exchange would compete
    for (`hvdazure bench peers` measures both). TensorFlow always allreduces after backward."""
    zero_stage: int = 0
    """Shard the optimizer over the ranks (PyTorch), as ZeRO does: `0` keeps the whole optimizer state on
    every rank; `1` gives each rank the state of its 1/N slice of the parameters (Adam's two moments: from 8
    to 8/N bytes per fp32 parameter), the updated slices allgathered into every rank's full weights; `2` also
    reduce-scatters the gradients into the slices, bucket by bucket as the step's last backward produces
    them, and frees the full ones. Exact at any world size; checkpoints resume at any world size and stage.
    Not Horovod's DistributedOptimizer: stage 1 allreduces after backward. PyTorch only."""
    zero_bucket_mb: float = 32.0
    """With `zero_stage`: the size of the gradient buckets, in MiB: each is reduce-scattered (stage 2: as soon
    as backward has produced it) and allgathered as one, and each rank owns 1/N of every bucket. Larger
    buckets mean fewer collectives; smaller ones start earlier during backward and hold less memory in
    flight."""
    grad_clip_norm: float | None = None
    """Clip the global gradient norm to this value after the allreduce; null: no clipping."""
    on_nan_loss: Literal["stop", "skip"] = "stop"
    """What happens when a step's loss (on any rank) or its gradients after the allreduce are NaN or
    infinite. `stop`: every rank stops at the next log interval or checkpoint, whichever comes first, with
    one line naming the step, the rank(s) and the newest checkpoint with finite weights (exit status 1).
    `skip`: the step is not applied, as fp16 loss scaling skips an overflowing step; skipped steps are
    counted in the log (it reads each loss on the host: a wait for the GPU per micro-batch). Either way, no
    checkpoint of weights that are not finite is ever written."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Mixed precision: `bf16` autocast (Keras's `mixed_bfloat16`), or `fp16` autocast with dynamic loss
    scaling (Keras's `mixed_float16`): a step whose gradients overflow is skipped on every rank alike and the
    scale halved, and checkpoints keep the scale. PyTorch: both on GPUs and CPUs (a GradScaler on the rank's
    device; float16 is slow on CPUs, where it serves to test the GPU path). TensorFlow: both, on GPUs and
    CPUs alike (a Keras LossScaleOptimizer; `grad_clip_norm` clips the unscaled gradients)."""
    sync_batchnorm: bool = False
    """BatchNorm statistics over all ranks' samples: exact at any world size, at the cost of two small
    collectives per BatchNorm layer per micro-batch."""
    compile: bool = False
    """Compile the model for faster steps. PyTorch: `torch.compile` of the model `build_model` returns,
    after it is placed on the device (and its BatchNorm layers synchronized), before the optimizer is
    wrapped; a model build_model compiled itself is used as it is. The first steps (and the first
    evaluation) wait for the compiler; checkpoints hold the uncompiled model's keys, so compiled and eager
    runs resume from each other's. TensorFlow: the step's forward and backward pass are compiled by XLA
    (`jit_compile`), the allreduce and the update are not (Horovod's ops do not run in XLA); slower on
    CPUs for convolutions."""
    compile_mode: Literal["default", "reduce-overhead", "max-autotune",
                          "max-autotune-no-cudagraphs"] = "default"
    """With `compile: true`, torch.compile's `mode`: `reduce-overhead` (CUDA graphs, on GPUs),
    `max-autotune` (autotuned kernels, slower to compile), `max-autotune-no-cudagraphs`."""
    # data
    seed: int = 0
    """Seeds the data order (a permutation per epoch from `(seed, epoch)`) and each rank's RNGs."""
    num_workers: int = 0
    """DataLoader worker processes per rank (PyTorch)."""
    # reporting
    log_every: int = 10
    """Optimizer steps between metric reductions (one fused allreduce) and progress lines."""
    eval_every: int = 1
    """Epochs between evaluations."""
    sanity_check: bool = True
    """Before training, run `validation_step` on one batch per rank, so that a broken one fails in seconds
    instead of after the first epoch; its metrics are not kept and training is unchanged by it. False:
    skip it."""
    monitor: str = "eval_loss"
    """The metric early stopping and `keep_best` watch (a key of the history)."""
    monitor_mode: Literal["min", "max"] = "min"
    """Whether a smaller or a larger `monitor` is better."""
    early_stopping_patience: int | None = None
    """Evaluations without improvement before every rank stops; null: no early stopping."""
    early_stopping_min_delta: float = 0.0
    """How much `monitor` must improve to count as an improvement."""
    output_dir: str = "outputs"
    """Where TensorBoard logs and the default MLflow store go (Azure ML uploads `./outputs`)."""
    # checkpoints: on when checkpoint_dir is set (inside Azure ML it defaults to ./outputs/checkpoints)
    checkpoint_dir: str | None = None
    """A local path or an fsspec URL (`abfs://container/path`, `memory://`); checkpointing is on when set.
    Null: none, except inside Azure ML, where it is `./outputs/checkpoints`."""
    checkpoint_every_steps: int | None = None
    """Save every this many optimizer steps; null: not by steps."""
    checkpoint_every_epochs: int | None = 1
    """Save after every this many completed epochs; null: not by epochs."""
    keep_last: int = 3
    """The newest checkpoints kept (only checkpoints that verify count)."""
    keep_best: int = 0
    """The best checkpoints by `monitor` / `monitor_mode` kept in addition."""
    checkpoint_async: bool = True
    """Rank 0 copies the state into CPU memory and writes it in a background thread while training goes
    on; false: training waits for the write (no copy)."""
    checkpoint_hash: Literal["xxh3_128", "sha256"] = "xxh3_128"
    """Each file's integrity hash in the manifest: `xxh3_128` (fast) or `sha256` (a cryptographic
    digest)."""
    resume: str | None = None
    """`auto`: the newest valid checkpoint in `checkpoint_dir` (none yet: start fresh, or `resume_from`); a
    checkpoint's path; or `DIR/latest`, the newest valid one in DIR. Null: start fresh."""
    resume_from: str | None = None
    """With `resume: auto`, where `checkpoint_dir` holds no checkpoint yet: the checkpoint to go on from
    instead (a path or URL, or `DIR/latest`), such as another job's. The run then continues in its own
    `checkpoint_dir`, so a restart of the job goes on from its own newer checkpoints, not from this one
    again (`hvdazure submit --resume-from JOB` sets both)."""
    # preemption notices: every rank checkpoints and exits 143 before the VM goes (needs checkpointing)
    preemption_watch: bool | None = None
    """Watch for preemption notices, then checkpoint on every rank and exit 143. Null: the environment
    decides (on inside Azure ML, else off)."""
    scheduled_events_url: str | None = None
    """Where preemption notices are read; null: the environment's own address (Azure's instance metadata
    service inside Azure ML)."""
    # logging and tracking
    tensorboard: bool = False
    """Log metrics to TensorBoard under `output_dir/tensorboard`, from rank 0."""
    mlflow: bool = False
    """Log the config and metrics to MLflow, from rank 0."""
    mlflow_tracking_uri: str | None = None
    """The MLflow store; null: Azure ML's inside Azure ML (`MLFLOW_TRACKING_URI`), else
    `sqlite:///` `output_dir/mlflow.db`."""
    progress_bar: bool = True
    """Rank 0 shows a progress bar on a terminal, its own or that of `hvdazure run` (a line per interval
    otherwise); false: lines only."""
    step_times: bool = True
    """Time each step's phases (data wait, forward+backward, allreduce wait, optimizer, checkpoint stalls,
    evaluation) and report their shares per log interval, and as a table at the end of fit() (after the
    first interval too when the loader starves the model); false: nothing timed."""
    profile_steps: int | str | None = None
    """Record a profiler trace of these optimizer steps on rank 0, into `output_dir/profile`: `5-8` (steps 5
    to 8, counted from 1 over the whole run, as TensorBoard's step axis) or `5`. PyTorch: torch.profiler, a
    Chrome trace (Perfetto, chrome://tracing); TensorFlow: its profiler, for TensorBoard's Profile tab. Null:
    none. `hvdazure run --profile` sets it for a job."""
    # your own settings
    extra: dict[str, Any] = field(default_factory=dict)
    """Your own settings, read as `self.config.extra`: `--set extra.hidden=64`."""

    def __new__(cls, *args: Any, **kwargs: Any) -> TrainConfig:
        """A misspelt keyword (`TrainConfig(epoch=3)`, `config.replace(epoch=3)`) is the same ConfigError
        as in a YAML file or a `--set`, with its suggestion, not Python's bare TypeError."""
        _check_field_names(kwargs)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        _check_types(self)
        _check_values(self)

    # --- derived values ---------------------------------------------------------------------------------
    @property
    def effective_base_batch_size(self) -> int:
        """`base_batch_size`, or `batch_size` when it is not set."""
        return self.base_batch_size if self.base_batch_size is not None else self.batch_size

    def global_batch_size(self, world_size: int) -> int:
        """Samples per optimizer step across all ranks."""
        return self.batch_size * world_size * self.grad_accum_steps

    @property
    def profile_range(self) -> range | None:
        """The steps `profile_steps` names (first to last, both included), or None."""
        return None if self.profile_steps is None else parse_step_range(self.profile_steps)

    # --- loading ------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Build from a mapping; unknown keys are an error (a typo must not be silently ignored)."""
        _check_field_names(data)
        return cls(**dict(data))

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
        """Build from a YAML file of `field: value` lines; unknown fields are an error."""
        return cls.from_dict(_read_yaml_mapping(path))

    @classmethod
    def from_cli(cls, argv: Sequence[str] | None = None, **defaults: Any) -> TrainConfig:
        """`defaults`, then `--config cfg.yaml`, then `--set field=value` overrides (repeatable).
        A bad value exits with status 2 and one line naming it (on every rank: each parses its own CLI)."""
        try:
            return cls._from_cli(argv, defaults)
        except ConfigError as exc:
            sys.stderr.write(f"hvdazure: error: {exc}\n")
            raise SystemExit(2) from None

    @classmethod
    def _from_cli(cls, argv: Sequence[str] | None, defaults: dict[str, Any]) -> TrainConfig:
        parser = _OneLineErrorParser(description="hvdazure training script")
        parser.add_argument("--config", help="YAML file of TrainConfig fields")
        parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                            help="override one field, e.g. --set epochs=5 --set extra.hidden=64")
        args = parser.parse_args(argv)
        data: dict[str, Any] = dict(defaults)
        if args.config:
            data.update(_read_yaml_mapping(args.config))
        for item in args.overrides:
            name, sep, raw = item.partition("=")
            if not sep or not name:
                raise ConfigError(f"--set expects FIELD=VALUE, got {item!r}")
            value = _parse_yaml(raw, f"--set {name}={raw!r}") if raw else ""
            if name.startswith("extra."):
                extra = data.get("extra", {})
                if not isinstance(extra, dict):
                    raise ConfigError(f"config field 'extra': {extra!r} is not a mapping")
                data["extra"] = {**extra, name.removeprefix("extra."): value}
            else:
                data[name] = value
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """Every field as a plain dict (what a checkpoint's manifest records)."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with `changes` applied, validated again."""
        return dataclasses.replace(self, **changes)


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse prints usage and exits on a bad argument; we want the one-line ConfigError instead."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)


# YAML 1.1 (PyYAML) reads 1e-3 as a string; YAML 1.2 and every user read it as a number.
_YAML12_FLOAT = r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"


def _yaml_loader() -> type:
    import re

    import yaml

    class Loader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types: its classes are Any
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_YAML12_FLOAT),
                                 list("-+0123456789."))
    # ints keep their own resolver, which is tried first for digits-only text
    return Loader


def _parse_yaml(text: str, where: str) -> Any:
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML ({str(exc).splitlines()[0]})") from None


def _read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    data = _parse_yaml(text, f"config file {path}") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of field: value")
    return data


# --- validation ------------------------------------------------------------------------------------------
def _check_field_names(names: Iterable[object]) -> None:
    """The one check of field names, wherever they come from (keywords, a mapping, YAML, `--set`): the
    first unknown one is a ConfigError, with the field it most likely means."""
    known = [f.name for f in fields(TrainConfig)]
    for name in names:
        if name not in known:
            raise ConfigError(f"unknown config field {name!r}; {field_name_hint(str(name), known)}")


def field_name_hint(name: str, known: Collection[str]) -> str:
    """What to say after an unknown field `name`: the names it likely means (`did you mean 'epochs'?`:
    a few that contain it, as `patience`, and those spelt alike), or, with none, every known name. A
    dotted name (`extras.hidden`) is matched by its first part."""
    head, dot, rest = name.partition(".")
    if dot and head == "extra":
        return f"`extra.NAME` is --set's form: in a mapping or YAML file write extra: {{{rest}: ...}}"
    if dot and difflib.get_close_matches(head, ["extra"], n=1):
        return f"did you mean {'extra' + dot + rest!r}?"
    containing = [known_name for known_name in sorted(known) if len(name) >= 4 and name in known_name]
    if len(containing) > 3:  # `checkpoint`: too many to help
        containing = []
    likely = [repr(candidate) for candidate in
              dict.fromkeys(containing + difflib.get_close_matches(name, known, n=3))][:3]
    if not likely:
        return f"known: {', '.join(sorted(known))}"
    return f"did you mean {' or '.join([', '.join(likely[:-1]), likely[-1]] if len(likely) > 1 else likely)}?"


_HINTS: dict[str, Any] = {}


def _check_types(config: TrainConfig) -> None:
    if not _HINTS:
        _HINTS.update(typing.get_type_hints(TrainConfig))
    for f in fields(config):
        value = getattr(config, f.name)
        hint = _HINTS[f.name]
        coerced = _coerce(value, hint)
        if coerced is _INVALID:
            raise ConfigError(f"config field {f.name!r}: {value!r} is not {_describe(hint)}")
        if coerced is not value:
            object.__setattr__(config, f.name, coerced)


_INVALID = object()


def _coerce(value: Any, hint: Any) -> Any:
    """`value` as type `hint` (ints accepted for floats), or _INVALID. bools are never numbers here."""
    origin = get_origin(hint)
    if origin is Literal:
        return value if value in get_args(hint) else _INVALID
    if origin in (typing.Union, types.UnionType):
        for option in get_args(hint):
            result = _coerce(value, option)
            if result is not _INVALID:
                return result
        return _INVALID
    if hint is type(None):
        return None if value is None else _INVALID
    if hint is bool:
        return value if isinstance(value, bool) else _INVALID
    if hint is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _INVALID
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return _INVALID
        return float(value)
    if hint is str:
        return value if isinstance(value, str) else _INVALID
    if origin is dict or hint is dict:
        return value if isinstance(value, dict) else _INVALID
    return value


def _describe(hint: Any) -> str:
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(hint))
    if hint is type(None):
        return "null"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(hint, str(hint))


def parse_step_range(value: int | str) -> range:
    """`5-8` (steps 5 to 8, both included), `5` or 5 as a range of step numbers, counted from 1; a
    ValueError naming the value otherwise (its callers say which option or field it was)."""
    text = str(value).strip()
    first, dash, last = text.partition("-")
    if not (first.strip().isdecimal() and (not dash or last.strip().isdecimal())):
        raise ValueError(f"{value!r} is not a step range: give FIRST-LAST (e.g. '5-8') or one step ('5')")
    start, end = int(first), int(last) if dash else int(first)
    if start < 1:
        raise ValueError(f"{value!r}: steps are counted from 1")
    if end < start:
        raise ValueError(f"{value!r} is backwards: give FIRST-LAST with FIRST <= LAST, e.g. '{end}-{start}'")
    return range(start, end + 1)


def _check_values(c: TrainConfig) -> None:
    def require(ok: bool, name: str, rule: str) -> None:
        if not ok:
            raise ConfigError(f"config field {name!r}: {getattr(c, name)!r} {rule}")

    require(c.epochs >= 1, "epochs", "must be at least 1")
    require(c.max_steps is None or c.max_steps >= 1, "max_steps", "must be at least 1 (or null)")
    require(c.batch_size >= 1, "batch_size", "must be at least 1")
    require(c.grad_accum_steps >= 1, "grad_accum_steps", "must be at least 1")
    require(math.isfinite(c.lr) and c.lr > 0, "lr", "must be a positive number")
    require(c.base_batch_size is None or c.base_batch_size >= 1, "base_batch_size", "must be at least 1")
    for f in fields(c):
        value = getattr(c, f.name)
        require(not isinstance(value, float) or math.isfinite(value), f.name, "must be a finite number")
    require(c.warmup_epochs >= 0, "warmup_epochs", "must not be negative")
    require(c.warmup_steps >= 0, "warmup_steps", "must not be negative")
    if c.warmup_epochs and c.warmup_steps:
        raise ConfigError(f"config fields 'warmup_epochs' ({c.warmup_epochs!r}) and 'warmup_steps' "
                          f"({c.warmup_steps!r}): give one, not both")
    require(0 <= c.min_lr <= c.lr, "min_lr", f"must be between 0 and lr ({c.lr!r})")
    require(c.step_size_epochs >= 1, "step_size_epochs", "must be at least 1")
    require(0 < c.step_gamma <= 1, "step_gamma", "must be in (0, 1]")
    require(c.gradient_predivide_factor > 0, "gradient_predivide_factor", "must be positive")
    require(c.grad_clip_norm is None or c.grad_clip_norm > 0, "grad_clip_norm", "must be positive (or null)")
    require(c.num_workers >= 0, "num_workers", "must not be negative")
    require(c.log_every >= 1, "log_every", "must be at least 1")
    require(c.eval_every >= 1, "eval_every", "must be at least 1")
    require(bool(c.monitor), "monitor", "must name a metric")
    require(c.early_stopping_patience is None or c.early_stopping_patience >= 1, "early_stopping_patience",
            "must be at least 1 (or null)")
    require(c.early_stopping_min_delta >= 0, "early_stopping_min_delta", "must not be negative")
    require(c.checkpoint_every_steps is None or c.checkpoint_every_steps >= 1, "checkpoint_every_steps",
            "must be at least 1 (or null)")
    require(c.checkpoint_every_epochs is None or c.checkpoint_every_epochs >= 1, "checkpoint_every_epochs",
            "must be at least 1 (or null)")
    require(c.keep_last >= 1, "keep_last", "must be at least 1")
    require(c.keep_best >= 0, "keep_best", "must not be negative")
    require(c.checkpoint_dir is None or bool(c.checkpoint_dir), "checkpoint_dir", "must be a path or URL")
    require(c.resume is None or bool(c.resume), "resume", "must be 'auto', a checkpoint path, or null")
    require(c.resume_from is None or bool(c.resume_from), "resume_from", "must be a checkpoint path, or null")
    if c.resume_from is not None and c.resume != "auto":
        raise ConfigError(f"config field 'resume_from': {c.resume_from!r} goes with resume: auto (it is "
                          "where a run with no checkpoint of its own yet starts from), not resume: "
                          f"{c.resume!r}")
    require(c.scheduled_events_url is None or c.scheduled_events_url.startswith(("http://", "https://")),
            "scheduled_events_url", "must be an http:// or https:// URL")
    if c.profile_steps is not None:
        try:
            parse_step_range(c.profile_steps)
        except ValueError as exc:
            raise ConfigError(f"config field 'profile_steps': {exc}") from None
    if c.reduce_op == "adasum" and c.gradient_predivide_factor != 1.0:
        raise ConfigError(f"config field 'gradient_predivide_factor': {c.gradient_predivide_factor!r} "
                          "must be 1.0 with reduce_op 'adasum'")
    require(c.zero_stage in (0, 1, 2), "zero_stage", "must be 0, 1 or 2")
    require(c.zero_bucket_mb > 0, "zero_bucket_mb", "must be positive")
    if c.zero_stage and c.reduce_op == "adasum":
        raise ConfigError(f"config field 'zero_stage': {c.zero_stage!r} cannot be used with reduce_op "
                          "'adasum' (Adasum combines whole gradients during backward; a slice has no whole "
                          "gradient)")
    if c.zero_stage and c.grad_allreduce == "overlap":
        raise ConfigError(f"config field 'grad_allreduce': 'overlap' cannot be used with zero_stage "
                          f"{c.zero_stage!r} (sharding exchanges the gradients its own way: stage 1 after "
                          "backward, stage 2 bucket by bucket during it); use 'auto'")
    if c.reduce_op == "adasum" and c.grad_allreduce == "after_backward":
        raise ConfigError("config field 'grad_allreduce': 'after_backward' cannot be used with reduce_op "
                          "'adasum' (Horovod's Adasum combines each gradient during backward); use 'auto'")
