"""TrainConfig: every training setting, typed and validated, loadable from YAML and `--set` overrides.

Validation happens in the constructor, on every rank, before any collective: a bad value is one
`ConfigError` naming the field and the value, identically on all ranks, so no rank waits for another.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the value. Uncaught, it ends the
    script with the bad-input status 2, as a bad `--set` does, whenever it is found (a batch size the plan
    cannot split is found once the world size is known), so that the launcher lets every rank name it."""

    exit_status = 2


class ControllerError(ConfigError):
    """A configuration value the controller Horovod runs on cannot serve (Adasum under Gloo), found on
    every rank once Horovod has started, before training."""


@dataclass(frozen=True)
class TrainConfig:
    """Training settings. `batch_size` is per worker; the LR is scaled for the global batch."""

    # length of training
    epochs: int = 1
    max_steps: int | None = None  # optimizer steps; stops earlier than `epochs` if reached
    # batch and learning rate
    batch_size: int = 32  # per worker, per micro-batch
    grad_accum_steps: int = 1  # micro-batches per optimizer step
    lr: float = 1e-3  # the LR tuned for base_batch_size
    base_batch_size: int | None = None  # the batch `lr` was tuned for; default: batch_size
    lr_scaling: Literal["none", "linear", "sqrt"] = "linear"
    warmup_epochs: float = 0.0  # Goyal et al. (2017): ramp from `lr` to the scaled LR ...
    warmup_steps: int = 0  # ... over this many optimizer steps (give epochs or steps, not both)
    schedule: Literal["constant", "cosine", "step"] = "constant"  # after warmup
    min_lr: float = 0.0  # cosine's floor
    step_size_epochs: int = 1  # "step": multiply the LR by step_gamma every this many epochs
    step_gamma: float = 0.1
    # gradient exchange
    compression: Literal["none", "fp16"] = "none"
    reduce_op: Literal["average", "sum", "adasum"] = "average"
    gradient_predivide_factor: float = 1.0
    # PyTorch: when the gradients are allreduced. "overlap": each as backward produces it (Horovod's
    # DistributedOptimizer); "after_backward": all in one grouped allreduce after the step's backward
    # passes; "auto": overlap on GPUs (and for Adasum), after_backward on CPUs, whose cores the exchange
    # would compete for (`hvdazure bench peers` measures both). TensorFlow: after backward always.
    grad_allreduce: Literal["auto", "overlap", "after_backward"] = "auto"
    grad_clip_norm: float | None = None
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # mixed precision via autocast
    sync_batchnorm: bool = False  # BatchNorm statistics over all ranks' samples (exact at any world size)
    # data
    seed: int = 0
    num_workers: int = 0  # DataLoader worker processes per rank
    # reporting
    log_every: int = 10  # optimizer steps between fused metric allreduces / log lines
    eval_every: int = 1  # epochs between evaluations
    monitor: str = "eval_loss"  # metric watched by early stopping
    monitor_mode: Literal["min", "max"] = "min"
    early_stopping_patience: int | None = None  # evaluations without improvement before stopping
    early_stopping_min_delta: float = 0.0
    output_dir: str = "outputs"  # Azure ML uploads ./outputs
    # checkpoints: on when checkpoint_dir is set (inside Azure ML it defaults to ./outputs/checkpoints)
    checkpoint_dir: str | None = None  # a local path or an fsspec URL (abfs://, memory://, ...)
    checkpoint_every_steps: int | None = None
    checkpoint_every_epochs: int | None = 1
    keep_last: int = 3  # newest checkpoints kept
    keep_best: int = 0  # best checkpoints kept by `monitor`, in addition
    checkpoint_async: bool = True  # rank 0 writes in the background after an in-memory copy
    checkpoint_hash: Literal["xxh3_128", "sha256"] = "xxh3_128"  # each file's integrity hash in the manifest
    resume: str | None = None  # "auto": newest valid checkpoint in checkpoint_dir, if any; or a path
    # preemption notices: every rank checkpoints and exits 143 before the VM goes (needs checkpointing)
    preemption_watch: bool | None = None  # None: the environment decides (on inside Azure ML, else off)
    scheduled_events_url: str | None = None  # where notices are read; None: the environment's own address
    tensorboard: bool = False
    mlflow: bool = False
    mlflow_tracking_uri: str | None = None  # default: Azure ML's inside it, else sqlite in output_dir
    progress_bar: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  # user settings, e.g. hidden_size: 64

    def __post_init__(self) -> None:
        _check_types(self)
        _check_values(self)

    # --- derived values ---------------------------------------------------------------------------------
    @property
    def effective_base_batch_size(self) -> int:
        return self.base_batch_size if self.base_batch_size is not None else self.batch_size

    def global_batch_size(self, world_size: int) -> int:
        """Samples per optimizer step across all ranks."""
        return self.batch_size * world_size * self.grad_accum_steps

    # --- loading ------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Build from a mapping; unknown keys are an error (a typo must not be silently ignored)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config field {unknown[0]!r}; known: {', '.join(sorted(known))}")
        return cls(**dict(data))

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
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
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainConfig:
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
    require(c.scheduled_events_url is None or c.scheduled_events_url.startswith(("http://", "https://")),
            "scheduled_events_url", "must be an http:// or https:// URL")
    if c.reduce_op == "adasum" and c.gradient_predivide_factor != 1.0:
        raise ConfigError(f"config field 'gradient_predivide_factor': {c.gradient_predivide_factor!r} "
                          "must be 1.0 with reduce_op 'adasum'")
    if c.reduce_op == "adasum" and c.grad_allreduce == "after_backward":
        raise ConfigError("config field 'grad_allreduce': 'after_backward' cannot be used with reduce_op "
                          "'adasum' (Horovod's Adasum combines each gradient during backward); use 'auto'")
