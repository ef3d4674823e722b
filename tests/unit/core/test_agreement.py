"""core/agreement.py on thread ranks (tests/fakes/fake_backend.py's ThreadWorld): rank 0 decides and every
rank learns the verdict; every rank tries and all raise if any failed. Each rank function catches what it
raises and ends with one more collective, so a test also shows that the ranks are still in step (no rank
left waiting: the ThreadWorld's own timeout bounds every wait)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fakes.fake_backend import FakeCollectives, ThreadWorld

from hvdazure.core.agreement import Failure, RankFailure, RankZeroFailed, every_rank_tries, rank0_decides
from hvdazure.core.backend import DataError
from hvdazure.core.checkpoint.store import CheckpointError
from hvdazure.core.config import ConfigError

TIMEOUT = 10.0  # each wait in a collective; a hang fails the test within 3 x this + 5 s


def _on_ranks(size: int, body: Callable[[FakeCollectives], Any]) -> list[Any]:
    """`body` on `size` thread ranks; each rank's result, or the exception it raised, in rank order. Every
    rank then enters one more collective: they must all have left the agreement together."""
    world = ThreadWorld(size, timeout=TIMEOUT)

    def rank(r: int) -> Callable[[], Any]:
        def run() -> Any:
            collectives = FakeCollectives(world, r)
            try:
                outcome = body(collectives)
            except Exception as exc:
                outcome = exc
            assert collectives.allgather_bytes(b"after") == [b"after"] * size
            return outcome
        return run

    return world.run([rank(r) for r in range(size)])


DIRECTORY_RULES = (Failure(ConfigError, ConfigError), Failure(OSError, CheckpointError),
                   Failure(Exception, CheckpointError,
                           lambda exc: f"cannot use it: {type(exc).__name__}: {exc}"))


# --- rank 0 decides --------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [1, 3])
def test_rank0s_result_is_returned_on_every_rank_and_only_rank0_decides(size):
    decided_on = []

    def body(collectives):
        def decide():
            decided_on.append(collectives.rank)
            return {"run_id": "r1", "own": [1, 2]}
        return rank0_decides(collectives, decide, *DIRECTORY_RULES)

    assert _on_ranks(size, body) == [{"run_id": "r1", "own": [1, 2]}] * size
    assert decided_on == [0]


def test_an_action_without_a_result_returns_none_on_every_rank():
    assert _on_ranks(3, lambda c: rank0_decides(c, lambda: None)) == [None] * 3


@pytest.mark.parametrize(("raised", "kind", "message"), [
    (ConfigError("config field 'checkpoint_dir': holds run a"), ConfigError,
     "config field 'checkpoint_dir': holds run a"),
    (PermissionError("listing az://c/d failed: denied"), CheckpointError, "listing az://c/d failed: denied"),
    (KeyError("run"), CheckpointError, "cannot use it: KeyError: 'run'"),
])
def test_rank0s_failure_is_the_same_exception_on_every_rank_as_the_first_rule_that_catches_it_says(
        raised, kind, message):
    def decide():
        raise raised

    outcomes = _on_ranks(4, lambda c: rank0_decides(c, decide, *DIRECTORY_RULES))
    for outcome in outcomes:
        assert type(outcome) is kind  # exactly the type: tests of the six callers assert it
        assert str(outcome) == message
    assert len({id(o) for o in outcomes}) == 4  # each rank raises its own


def test_rank0s_failure_keeps_a_subclass_rule_apart_from_its_base():
    class NonFinite(CheckpointError):
        pass

    rules = (Failure(NonFinite, NonFinite), Failure(CheckpointError, CheckpointError))

    def decide(error):
        def raises():
            raise error
        return raises

    for error, kind in [(NonFinite("NaN at step 3"), NonFinite),
                        (CheckpointError("disk full"), CheckpointError)]:
        outcomes = _on_ranks(2, lambda c, error=error: rank0_decides(c, decide(error), *rules))
        assert [(type(o), str(o)) for o in outcomes] == [(kind, str(error))] * 2


def test_a_failure_no_rule_catches_is_rank0s_own_and_the_other_ranks_are_told_instead_of_waiting():
    """A bug, not a verdict: rank 0 raises it as it was (its traceback); the others raise RankZeroFailed
    naming it. Was: raised on rank 0 alone, without the broadcast: the other ranks waited for it."""
    bug = ZeroDivisionError("division by zero")

    def decide():
        raise bug

    outcomes = _on_ranks(3, lambda c: rank0_decides(c, decide, Failure(OSError, DataError)))
    assert outcomes[0] is bug
    assert [(type(o), str(o)) for o in outcomes[1:]] == [
        (RankZeroFailed, "rank 0 failed (ZeroDivisionError: division by zero); see rank 0's traceback")] * 2


# --- every rank tries ------------------------------------------------------------------------------------
def _refused(failed: list[RankFailure]) -> DataError:
    return DataError(f"rank {failed[0].rank} failed ({failed[0].error}); failed: {[f.rank for f in failed]}")


def _tries(size: int, failing: dict[int, Exception], own_error: bool = False) -> list[Any]:
    def body(collectives):
        def attempt():
            if collectives.rank in failing:
                raise failing[collectives.rank]
            return f"part {collectives.rank}"
        return every_rank_tries(collectives, attempt, lambda exc: f"{type(exc).__name__}: {exc} "
                                f"on rank {collectives.rank}", _refused, own_error=own_error)
    return _on_ranks(size, body)


@pytest.mark.parametrize("size", [1, 4])
def test_every_ranks_result_in_rank_order_on_every_rank(size):
    assert _tries(size, {}) == [[f"part {r}" for r in range(size)]] * size


@pytest.mark.parametrize("failed_rank", [0, 2])
def test_one_rank_fails_and_every_rank_raises_one_line_naming_it(failed_rank):
    outcomes = _tries(3, {failed_rank: OSError("disk full")})
    expected = (f"rank {failed_rank} failed (OSError: disk full on rank {failed_rank}); "
                f"failed: [{failed_rank}]")
    assert [(type(o), str(o)) for o in outcomes] == [(DataError, expected)] * 3


def test_several_ranks_fail_and_every_rank_names_them_all_and_the_first_ones_error():
    outcomes = _tries(4, {3: ValueError("bad shape"), 1: OSError("disk full")})
    expected = "rank 1 failed (OSError: disk full on rank 1); failed: [1, 3]"
    assert [(type(o), str(o)) for o in outcomes] == [(DataError, expected)] * 4


def test_with_own_error_a_failed_rank_raises_its_own_exception_and_the_others_the_agreed_one():
    own = {1: OSError("disk full"), 2: ValueError("bad shape")}
    outcomes = _tries(4, dict(own), own_error=True)
    assert outcomes[1] is own[1] and outcomes[2] is own[2]
    expected = "rank 1 failed (OSError: disk full on rank 1); failed: [1, 2]"
    assert [(type(o), str(o)) for o in (outcomes[0], outcomes[3])] == [(DataError, expected)] * 2


def test_every_rank_tries_leaves_a_base_exception_alone():
    """Only Exceptions are shared: a KeyboardInterrupt ends its rank as before (the others' wait aborts)."""
    world = ThreadWorld(2, timeout=TIMEOUT)

    def attempt(rank):
        if rank == 1:
            raise KeyboardInterrupt
        return rank

    with pytest.raises(KeyboardInterrupt):
        world.run([lambda r=r: every_rank_tries(FakeCollectives(world, r), lambda: attempt(r), str, _refused)
                   for r in range(2)])
