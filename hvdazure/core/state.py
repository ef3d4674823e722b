"""TrainState: where training is, in the user's words; identical on every rank after each metric reduction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainState:
    """Where training is: `trainer.state`, read by callbacks. Counters and metrics are the same on every
    rank after each metric reduction."""

    epoch: int = 0  # the current epoch, 0-based
    step: int = 0  # optimizer steps completed, over all epochs
    step_in_epoch: int = 0  # optimizer steps completed in the current epoch
    samples_in_epoch: int = 0  # position in the epoch's sample order: samples consumed, all ranks
    samples_seen: int = 0  # samples consumed by all ranks together, all epochs
    lr: float = 0.0  # the LR of the latest optimizer step
    metrics_reduced: bool = False  # whether train_metrics were reduced at this step (log_every)
    train_metrics: dict[str, float] = field(default_factory=dict)  # latest log interval, all ranks
    eval_metrics: dict[str, float] = field(default_factory=dict)  # latest evaluation, all ranks
    history: list[dict[str, Any]] = field(default_factory=list)  # one record per epoch
    world_size_history: list[dict[str, int]] = field(default_factory=list)  # resumes at another size
    stop_requested: bool = False  # this rank wants to stop; see Trainer._reduce_metrics_and_votes
    should_stop: bool = False  # every rank agreed to stop
    stop_reason: str | None = None

    # what a checkpoint stores and a resume restores (the rest is recomputed or belongs to this run)
    PERSISTENT = ("epoch", "step", "step_in_epoch", "samples_in_epoch", "samples_seen", "lr", "train_metrics",
                  "eval_metrics", "history", "world_size_history")

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of it (PERSISTENT)."""
        return {name: getattr(self, name) for name in self.PERSISTENT}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        """Restore what `state_dict` returned, on resume."""
        for name in self.PERSISTENT:
            setattr(self, name, data[name])

    def request_stop(self, reason: str) -> None:
        """Ask to stop training. Safe from one rank only: all ranks stop together at the next metric
        reduction."""
        self.stop_requested = True
        self.stop_reason = self.stop_reason or reason
