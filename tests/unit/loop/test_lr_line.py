"""The first log line of a run says the LR it trains at and how it was scaled (core/lr.py's describe_lr,
in ProgressLogger's "training on ..." line): with the defaults, 2 ranks of batch b and 1 process of batch 2b
train at different LRs, and the line is where a user sees it."""

from __future__ import annotations

from types import SimpleNamespace

from hvdazure import TrainConfig
from hvdazure.core.callbacks import ProgressLogger, training_line
from hvdazure.core.lr import LRSchedule
from hvdazure.core.state import TrainState

NOT_SET = " (= batch_size: base_batch_size is not set)"


def _line(world_size: int, **fields: object) -> str:
    config = TrainConfig(**fields)  # type: ignore[arg-type]
    return training_line(config, world_size, 10, LRSchedule.from_config(config, world_size, 10))


def test_linear_scaling_from_the_default_base_says_the_base_is_the_per_rank_batch() -> None:
    assert _line(2, batch_size=32, lr=0.2) == (
        "training on 2 ranks: global batch 64 (batch_size 32 x 2 ranks), 10 steps per epoch; "
        f"lr 0.4 = 0.2 x 64/32, linear scaling from base_batch_size 32{NOT_SET}")
    assert _line(1, batch_size=64, lr=0.2) == (  # the same global batch in one process: half the LR
        "training on 1 rank: global batch 64 (batch_size 64 x 1 rank), 10 steps per epoch; "
        f"lr 0.2 = 0.2 x 64/64, linear scaling from base_batch_size 64{NOT_SET}")


def test_an_explicit_base_gives_the_same_lr_for_the_same_global_batch_at_any_world_size() -> None:
    lines = [_line(w, batch_size=64 // w, lr=0.2, base_batch_size=32) for w in (1, 2, 4)]
    assert [line.split("; ", 1)[1] for line in lines] == ["lr 0.4 = 0.2 x 64/32, linear scaling from "
                                                          "base_batch_size 32"] * 3


def test_sqrt_scaling_shows_the_square_root() -> None:
    assert _line(4, batch_size=16, lr=0.1, lr_scaling="sqrt").endswith(
        f"; lr 0.2 = 0.1 x sqrt(64/16), sqrt scaling from base_batch_size 16{NOT_SET}")


def test_no_scaling_says_the_lr_is_not_scaled() -> None:
    assert _line(2, batch_size=32, lr=0.2, lr_scaling="none", base_batch_size=8).endswith(
        "; lr 0.2, not scaled for the global batch 64 (lr_scaling none)")


def test_accumulation_is_part_of_the_global_batch_the_lr_is_scaled_for() -> None:
    assert _line(2, batch_size=8, lr=0.1, grad_accum_steps=4) == (
        "training on 2 ranks: global batch 64 (batch_size 8 x 2 ranks x 4 grad_accum_steps), 10 steps per "
        f"epoch; lr 0.8 = 0.1 x 64/8, linear scaling from base_batch_size 8{NOT_SET}")


def test_warmup_and_the_schedule_follow() -> None:
    assert _line(2, batch_size=32, lr=0.2, base_batch_size=64, warmup_steps=5, schedule="cosine",
                 min_lr=0.01).endswith("; lr 0.2 = 0.2 x 64/64, linear scaling from base_batch_size 64; "
                                       "warmup from 0.2 over 5 steps; then cosine decay to 0.01")
    assert _line(2, batch_size=32, lr=0.1, warmup_epochs=0.5, schedule="step", step_gamma=0.5).endswith(
        f"{NOT_SET}; warmup from 0.1 over 5 steps; then x 0.5 every 1 epoch(s)")


def test_the_progress_logger_starts_with_the_line() -> None:
    config = TrainConfig(batch_size=4, lr=0.05)
    said: list[str] = []
    trainer = SimpleNamespace(config=config, world_size=2, steps_per_epoch=4, finished=False,
                              schedule=LRSchedule.from_config(config, 2, 4), state=TrainState(),
                              log=said.append)
    ProgressLogger(use_bar=False).on_train_start(trainer)  # type: ignore[arg-type]
    assert said == ["training on 2 ranks: global batch 8 (batch_size 4 x 2 ranks), 4 steps per epoch; "
                    f"lr 0.1 = 0.05 x 8/4, linear scaling from base_batch_size 4{NOT_SET}"]
