"""How the ranks agree on an outcome, so that a failure is an error on every rank instead of a hang.

Two shapes, each one collective that every rank enters at the same point:

- `rank0_decides`: rank 0 alone acts (storage: once for the job) or decides, and broadcasts the verdict:
  its result, which every rank returns, or its failure, which every rank raises as the same exception
  (type and one-line message). Each caller says, with `Failure` rules, which of rank 0's exceptions are
  shared and as what; one that no rule catches (a bug) is re-raised on rank 0 as it was, with its
  traceback, and the other ranks raise RankZeroFailed naming it, rather than wait for a verdict.
- `every_rank_tries`: every rank tries its part; all learn every rank's outcome (one allgather), and all
  raise if any rank failed, with the caller's exception naming the failed rank(s) and their errors.

The results and messages travel as JSON: a result must be a JSON value (dicts, lists, str, numbers, None).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from hvdazure.core.backend import Collectives

T = TypeVar("T")


@dataclass(frozen=True)
class Failure:
    """One way rank 0's failure becomes the exception every rank raises: an exception of `catch` is sent
    as `message(exc)` and raised on every rank (rank 0 too) as `raise_as(that message)`."""

    catch: type[Exception] | tuple[type[Exception], ...]
    raise_as: Callable[[str], Exception]
    message: Callable[[Exception], str] = str


class RankZeroFailed(RuntimeError):
    """On the other ranks: rank 0 failed in `rank0_decides` with an exception no rule shares (its own
    traceback is rank 0's)."""


@dataclass(frozen=True)
class RankFailure:
    """A rank whose part failed in `every_rank_tries`, and its error as the caller described it."""

    rank: int
    error: str


def rank0_decides(collectives: Collectives, decide: Callable[[], T], *failures: Failure) -> T:
    """`decide()` on rank 0 only; its result (a JSON value) returned on every rank (one broadcast). An
    exception it raises that the first matching rule of `failures` catches is raised on every rank, as
    that rule says; any other is re-raised on rank 0 and the other ranks raise RankZeroFailed."""
    verdict: dict[str, Any] = {}
    unexpected: Exception | None = None
    if collectives.rank == 0:
        try:
            verdict = {"result": decide()}
        except Exception as exc:
            rule = next((i for i, f in enumerate(failures) if isinstance(exc, f.catch)), None)
            if rule is None:
                unexpected, verdict = exc, {"unexpected": f"{type(exc).__name__}: {exc}"}
            else:
                verdict = {"failure": rule, "message": failures[rule].message(exc)}
    mine = json.dumps(verdict).encode() if collectives.rank == 0 else None
    shared: dict[str, Any] = json.loads(collectives.broadcast_bytes(mine))
    if unexpected is not None:
        raise unexpected
    if "unexpected" in shared:
        raise RankZeroFailed(f"rank 0 failed ({shared['unexpected']}); see rank 0's traceback")
    if "failure" in shared:
        raise failures[shared["failure"]].raise_as(shared["message"])
    result: T = shared["result"]
    return result


def every_rank_tries(collectives: Collectives, attempt: Callable[[], T], describe: Callable[[Exception], str],
                     raise_as: Callable[[list[RankFailure]], Exception], own_error: bool = False) -> list[T]:
    """`attempt()` on every rank; every rank's result (a JSON value), in rank order, on every rank (one
    allgather). If any rank's attempt raised an Exception, every rank raises `raise_as(the failures)`, in
    rank order, each error as `describe(exc)` made it on its rank; with `own_error`, a rank that failed
    raises its own exception instead."""
    failure: Exception | None = None
    told: dict[str, Any] = {}
    try:
        told = {"result": attempt()}
    except Exception as exc:
        failure, told = exc, {"error": describe(exc)}
    reports = [json.loads(b) for b in collectives.allgather_bytes(json.dumps(told).encode())]
    if failure is not None and own_error:
        raise failure
    if failed := [RankFailure(rank, r["error"]) for rank, r in enumerate(reports) if "error" in r]:
        raise raise_as(failed)
    return [r["result"] for r in reports]
