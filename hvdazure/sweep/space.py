"""The search space of a sweep: `space.yaml`, in the shape of Azure ML sweep jobs' `search_space`, so that one
file serves `hvdazure sweep` (Optuna, locally or in one MPI job) and `hvdazure submit sweep` (Azure ML).

    lr: {type: loguniform, min_value: -9.21, max_value: -2.3}   # exp(uniform(min, max)), as in Azure ML
    batch_size: {type: choice, values: [16, 32, 64]}
    extra.hidden: {type: randint, upper: 256}                     # 0 .. 255

Keys are TrainConfig fields or `extra.NAME`; a top-level `search_space:` wrapper (an Azure job's own key) is
accepted. Everything is checked against TrainConfig's field types when the file is read, so a bad space
fails in one line before any process starts. Pure Python: Optuna is imported only to build distributions.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from hvdazure.core.config import (
    _INVALID,
    ConfigError,
    TrainConfig,
    _coerce,
    _describe,
    _parse_yaml,
    field_name_hint,
)

# Azure ML's distributions and their parameters (azure.ai.ml.sweep: Choice, Randint, Uniform, ...).
KINDS: dict[str, tuple[str, ...]] = {
    "choice": ("values",),
    "randint": ("upper",),
    "uniform": ("min_value", "max_value"),
    "quniform": ("min_value", "max_value", "q"),
    "loguniform": ("min_value", "max_value"),
    "qloguniform": ("min_value", "max_value", "q"),
    "normal": ("mu", "sigma"),
    "qnormal": ("mu", "sigma", "q"),
    "lognormal": ("mu", "sigma"),
    "qlognormal": ("mu", "sigma", "q"),
}
# Fields the sweep sets for each trial itself.
SET_BY_SWEEP = ("output_dir", "checkpoint_dir", "resume")


class SpaceError(ConfigError):
    """The search space is invalid; the message names the parameter and the value."""


@dataclass(frozen=True)
class Parameter:
    """One searched parameter: a TrainConfig field or `extra.NAME`, and its Azure ML-style distribution."""

    name: str
    kind: str
    args: Mapping[str, Any]

    @property
    def is_extra(self) -> bool:
        return self.name.startswith("extra.")

    def describe(self) -> str:
        if self.kind == "choice":
            return f"choice{list(self.args['values'])}"
        return f"{self.kind}({', '.join(f'{k}={v}' for k, v in self.args.items())})"

    def grid_values(self) -> list[Any] | None:
        """Every value this parameter can take, when they are finitely many (choice, randint), else None."""
        if self.kind == "choice":
            return list(self.args["values"])
        if self.kind == "randint":
            return list(range(self.args["upper"]))
        return None

    def optuna_distribution(self) -> Any:
        """The Optuna distribution that samples the same values as Azure ML's."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        a, kind = self.args, self.kind
        if kind == "choice":
            return CategoricalDistribution(list(a["values"]))
        if kind == "randint":
            return IntDistribution(0, a["upper"] - 1)
        if kind == "uniform":
            return FloatDistribution(a["min_value"], a["max_value"])
        if kind == "loguniform":
            return FloatDistribution(math.exp(a["min_value"]), math.exp(a["max_value"]), log=True)
        if kind == "quniform":
            q = a["q"]
            low, high = round(a["min_value"] / q) * q, round(a["max_value"] / q) * q
            if _integral(q, low, high):
                return IntDistribution(int(low), int(high), step=int(q))
            return FloatDistribution(low, high, step=q)
        if kind == "qloguniform" and a["q"] == 1:
            return IntDistribution(max(1, round(math.exp(a["min_value"]))), round(math.exp(a["max_value"])),
                                   log=True)
        step = " with a q step" if "q" in a else ""
        raise SpaceError(f"search space parameter {self.name!r}: {self.describe()} is not available in a "
                         f"local sweep (Optuna has no {kind} distribution{step}); use uniform, loguniform, "
                         "quniform, randint or choice, or submit it as an Azure ML sweep job")


@dataclass(frozen=True)
class SearchSpace:
    """The parameters of a sweep, in file order."""

    parameters: tuple[Parameter, ...]

    @classmethod
    def from_yaml(cls, path: str | Path) -> SearchSpace:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise SpaceError(f"search space file not found: {path}") from None
        data = _parse_yaml(text, f"search space file {path}")
        return cls.from_dict(data, where=f"search space file {path}")

    @classmethod
    def from_dict(cls, data: Any, where: str = "search space") -> SearchSpace:
        if isinstance(data, Mapping) and set(data) == {"search_space"}:
            data = data["search_space"]
        if not isinstance(data, Mapping) or not data:
            raise SpaceError(f"{where} must be a mapping of parameter: {{type: ..., ...}}, e.g. "
                             "lr: {type: loguniform, min_value: -9.2, max_value: -2.3}")
        return cls(tuple(_parameter(str(name), spec) for name, spec in data.items()))

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parameters]

    def optuna_distributions(self) -> dict[str, Any]:
        return {p.name: p.optuna_distribution() for p in self.parameters}

    def grid(self) -> dict[str, list[Any]]:
        """The grid of a grid search: every parameter's values (choice and randint only)."""
        grid = {}
        for p in self.parameters:
            values = p.grid_values()
            if values is None:
                raise SpaceError(f"search space parameter {p.name!r}: {p.describe()} has no finite set of "
                                 "values for a grid search; use choice (or randint), or another sampler")
            grid[p.name] = values
        return grid

    def grid_size(self) -> int:
        return math.prod(len(values) for values in self.grid().values())


def overrides(params: Mapping[str, Any]) -> dict[str, Any]:
    """Trial parameters as TrainConfig changes: `extra.NAME` values gathered under "extra"."""
    changes: dict[str, Any] = {}
    for name, value in params.items():
        if name.startswith("extra."):
            changes.setdefault("extra", {})[name.removeprefix("extra.")] = value
        else:
            changes[name] = value
    return changes


# --- validation ------------------------------------------------------------------------------------------
def _parameter(name: str, spec: Any) -> Parameter:
    def fail(message: str) -> typing.NoReturn:
        raise SpaceError(f"search space parameter {name!r}: {message}")

    hints = typing.get_type_hints(TrainConfig)
    known = {f.name for f in fields(TrainConfig)} - {"extra", *SET_BY_SWEEP}
    if name.startswith("extra."):
        if not name.removeprefix("extra."):
            fail("name the extra setting, e.g. extra.hidden")
        hint: Any = Any
    elif name in SET_BY_SWEEP:
        fail("is set by the sweep for each trial (each trial has its own output and checkpoint directory)")
    elif name not in known:
        fail(f"is not a TrainConfig field (nor extra.NAME); {field_name_hint(name, known)}")
    else:
        hint = hints[name]
    if not isinstance(spec, Mapping) or "type" not in spec:
        fail(f"{spec!r} is not a distribution; expected e.g. {{type: choice, values: [16, 32]}}")
    kind = spec["type"]
    if kind not in KINDS:
        fail(f"unknown distribution type {kind!r}; known: {', '.join(KINDS)}")
    args = {k: v for k, v in spec.items() if k != "type"}
    needed = KINDS[kind]
    missing, unexpected = [k for k in needed if k not in args], sorted(set(args) - set(needed))
    if missing or unexpected:
        fail(f"{kind} takes {', '.join(needed)}" + (f"; missing {', '.join(missing)}" if missing else "")
             + (f"; unexpected {', '.join(unexpected)}" if unexpected else ""))
    if kind == "choice":
        values = args["values"]
        if not isinstance(values, list) or not values:
            fail(f"choice values must be a non-empty list, got {values!r}")
        for value in values:
            if value is not None and not isinstance(value, bool | int | float | str):
                fail(f"choice value {value!r} is not a number, string, bool or null")
            if hint is not Any and _coerce(value, hint) is _INVALID:
                fail(f"choice value {value!r} is not {_describe(hint)}")
        if len({repr(v) for v in values}) != len(values):
            fail(f"choice values {values!r} repeat a value")
        return Parameter(name, kind, {"values": list(values)})
    for key in needed:
        value = args[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            fail(f"{key} {value!r} is not a finite number")
    if kind == "randint":
        if not isinstance(args["upper"], int) or args["upper"] < 1:
            fail(f"randint upper {args['upper']!r} must be a positive integer (values are 0 .. upper-1)")
    elif "min_value" in args and args["min_value"] >= args["max_value"]:
        fail(f"min_value {args['min_value']!r} must be below max_value {args['max_value']!r}")
    if "q" in args and args["q"] <= 0:
        fail(f"q {args['q']!r} must be positive")
    if "sigma" in args and args["sigma"] <= 0:
        fail(f"sigma {args['sigma']!r} must be positive")
    if hint is not Any:
        _check_numeric_kind(name, kind, args, hint, fail)
    return Parameter(name, kind, args)


def _check_numeric_kind(name: str, kind: str, args: Mapping[str, Any], hint: Any,
                        fail: typing.Callable[[str], typing.NoReturn]) -> None:
    """A numeric distribution only for a numeric field; only integers for an integer field."""
    options = set(get_args(hint)) - {type(None)} if get_origin(hint) in (typing.Union, type(int | None)) \
        else {hint}
    if get_origin(hint) is Literal or not options & {int, float}:
        fail(f"{kind} gives numbers, but the field is {_describe(hint)}; use choice")
    if float in options:
        return
    integral = kind == "randint" or (kind in ("quniform", "qlognormal", "qnormal", "qloguniform")
                                     and _integral(args["q"]) and (kind != "quniform" or _integral(
                                         args["min_value"], args["max_value"])))
    if not integral:
        fail(f"{kind} gives fractional values, but the field is an integer; use randint, choice, or quniform "
             "with integer min_value, max_value and q")


def _integral(*values: float) -> bool:
    return all(float(v).is_integer() for v in values)
