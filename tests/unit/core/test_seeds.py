"""core/seeds.py: every seed a rank's RNG streams get, and the streams saved and restored as one piece."""

import json
import random

import numpy as np

from hvdazure.core.seeds import RankRandomState, rank_seed, resume_seed


class FrameworkRNG:
    """The framework side of the streams: one NumPy generator standing in for torch's or TensorFlow's."""

    def __init__(self) -> None:
        self.generator = np.random.default_rng(0)

    def save_rng(self) -> dict:
        return self.generator.bit_generator.state

    def load_rng(self, state: dict) -> None:
        self.generator = np.random.default_rng()
        self.generator.bit_generator.state = state

    def seed(self, seed: int) -> None:
        self.generator = np.random.default_rng(seed)


def test_the_seed_formulas_are_those_earlier_checkpoints_were_resumed_with() -> None:
    assert rank_seed(3, 2) == 3 * 1_000_003 + 2
    assert resume_seed(3, 2, 40) == 3 * 1_000_003 + 2 * 7919 + 40


def test_every_rank_and_every_resume_step_gets_its_own_seed() -> None:
    seeds = {rank_seed(0, rank) for rank in range(64)} | {resume_seed(0, rank, 100) for rank in range(64)}
    assert len(seeds) == 128


def test_the_streams_restored_draw_what_they_would_have_drawn() -> None:
    framework = FrameworkRNG()
    streams = RankRandomState(framework)  # type: ignore[arg-type]
    streams.seed(rank_seed(5, 1))
    saved = json.loads(json.dumps(streams.state_dict()))  # as rng.json keeps it
    expected = (random.random(), np.random.random(), framework.generator.random())

    streams.seed(999)
    streams.load_state_dict(saved)

    assert (random.random(), np.random.random(), framework.generator.random()) == expected
