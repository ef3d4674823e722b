"""The epoch order of a sharded dataset: exact at any world size, and cheap to read from object storage.

Why. core/sample_plan.py's default order is one uniform permutation per epoch, so a rank's samples lie
anywhere in the dataset. On object storage a request costs tens of milliseconds, and so does a random read
on a blobfuse mount: a uniform order costs one request per sample. This order keeps each rank on few
shards, read whole, while keeping every guarantee of the sample plan: step t takes positions [t*G, (t+1)*G)
of one epoch order that does not depend on the world size, so the samples of a step are the same at any
world size, each sample is used once per epoch, and a resume on another number of ranks continues
exactly where the last run stopped.

The order. Samples are numbered shard by shard (shard k holds the global samples [start_k, start_k +
size_k); `locate` maps back). At the start of a run the shards are shuffled (from the seed alone) and laid
end to end into `lanes` lanes of equal sample counts; a shard on a lane boundary is split between two
neighbouring lanes. A lane keeps its shards for the whole run. Every epoch, each lane puts its shards in a
new random order and shuffles its samples within consecutive windows of `window` samples (each lane's
first window is cut short by a random amount, so the lanes do not all move to new shards at the same
step). The epoch order then takes one sample from each lane in turn, the lanes in a new random order each
epoch. The world size appears nowhere in this.

Reading. Within a step the samples are grouped by lane (then shard), and each rank takes one stretch of
the group (core/sample_plan.py, `group_for_reading`). When the lanes are a multiple of the world size and the
global batch a multiple of the lanes, rank r reads the same lanes at every step of every epoch: each shard
is read by one rank (two, for a shard split between two ranks' lanes), and a node cache holding its ranks'
share of the dataset serves every epoch after the first. Otherwise a rank boundary falls inside a lane and
the shards near it are read by two ranks. Memory: the epoch order is one int64 array of the dataset's size;
the lists here are per shard and per lane, never per sample.

Which shuffle, and why. We studied MosaicML Streaming's shuffles and Grain's, and wrote this one:
- Mosaic's py1s shuffles only within each shard: the fewest shards open (one per lane), but a step then
  holds samples of only `lanes` shards, and data written in class order (a folder per class) trains on
  batches of few classes.
- py1br shuffles within blocks of random size that cross shard boundaries, py1e moves each sample a
  bounded random distance: both mix better at the cost of keeping a block's shards at hand; py1e also
  smooths the change from one shard to the next. Grain's window shuffle permutes fixed windows of a stream.
- Ours is py1br's and Grain's idea within a lane: a sample is mixed with its window (about window / shard
  size + 1 shards) and, at every step, with every other lane. The price is the cache: about lanes x
  (window / shard size + 1) shards at once over all ranks, lanes / world size of that on one rank. The
  defaults, 32 lanes and a window of twice the mean shard size, give steps drawn from some 100 shards and
  about 3 shards per lane at hand; 32 lanes is a multiple of the world sizes 1, 2, 4, 8, 16 and 32.
- Unlike Mosaic, lanes are not nodes and nothing is padded or repeated: the epoch order is one sequence
  that the sample plan cuts into steps, so the world size can change at any sample.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hvdazure.core.sample_plan import fingerprint

DEFAULT_LANES = 32
_RUN_STREAM = 0x5A4E  # tells the run's lane layout apart from the epochs' draws in the seed sequence
_EPOCH_STREAM = 0xE90C


@dataclass(frozen=True)
class _Lanes:
    """The run's layout of shards into lanes, for one seed."""

    pieces: list[list[tuple[int, int]]]  # per lane, its runs of global samples [begin, end)
    piece_starts: np.ndarray  # every piece's first sample, ascending, to find a sample's lane
    piece_lanes: np.ndarray  # the lane of each piece, in that order


@dataclass(frozen=True)
class ShardOrder:
    """The epoch order for a dataset stored in shards of `shard_sizes` samples (see the module's text)."""

    shard_sizes: tuple[int, ...]
    lanes: int = DEFAULT_LANES
    window: int | None = None  # samples shuffled together in a lane; None: twice the mean shard size
    _starts: np.ndarray = field(init=False, repr=False, compare=False)  # each shard's first global sample
    _num_samples: int = field(init=False, repr=False, compare=False)
    _layouts: dict[int, _Lanes] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shard_sizes", tuple(int(size) for size in self.shard_sizes))
        if not self.shard_sizes:
            raise ValueError("shard_sizes is empty: a sharded dataset needs at least one shard")
        if min(self.shard_sizes) < 0:
            raise ValueError(f"shard_sizes must be 0 or more, got {min(self.shard_sizes)}")
        if self.lanes < 1:
            raise ValueError(f"lanes must be at least 1, got {self.lanes}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be at least 1 sample, got {self.window}")
        sizes = np.asarray(self.shard_sizes, dtype=np.int64)
        object.__setattr__(self, "_starts", np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64))
        object.__setattr__(self, "_num_samples", int(sizes.sum()))

    @property
    def num_samples(self) -> int:
        return self._num_samples

    @property
    def window_samples(self) -> int:
        """The window in samples, the default resolved from the shard sizes."""
        if self.window is not None:
            return self.window
        filled = sum(1 for size in self.shard_sizes if size) or 1
        return max(1, 2 * -(-self.num_samples // filled))

    def locate(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard, offset in the shard) of each global sample index."""
        samples = np.asarray(samples, dtype=np.int64)
        if samples.size and not (samples.min() >= 0 and samples.max() < self.num_samples):
            raise ValueError(f"sample indices must be in 0..{self.num_samples - 1}")
        shards = np.searchsorted(self._starts, samples, side="right") - 1  # skips empty shards
        return shards, samples - self._starts[shards]

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        """Every sample once: one from each lane in turn (the lanes in this epoch's order), each lane's
        shards in this epoch's order and shuffled within windows."""
        layout = self._layout(seed)
        rng = np.random.default_rng([seed, epoch, _EPOCH_STREAM])
        sizes = [sum(end - begin for begin, end in pieces) for pieces in layout.pieces]
        grid = np.full((max(sizes), self.lanes), -1, dtype=np.int64)  # row i: the i-th sample of each lane
        for slot, lane in enumerate(rng.permutation(self.lanes)):
            grid[: sizes[lane], slot] = self._lane_stream(layout.pieces[lane], rng)
        flat = grid.ravel()
        return flat[flat >= 0]

    def group_for_reading(self, samples: np.ndarray, seed: int) -> np.ndarray:
        """A step's samples by lane, then shard (stable), so that each rank's stretch covers few lanes."""
        layout = self._layout(seed)
        lanes = layout.piece_lanes[np.searchsorted(layout.piece_starts, samples, side="right") - 1]
        shards, _ = self.locate(samples)
        return samples[np.lexsort((np.arange(len(samples)), shards, lanes))]

    def fingerprint(self, seed: int) -> str:
        """A hash of the algorithm's version, the seed, lanes, window and every shard's size."""
        sizes = np.asarray(self.shard_sizes, dtype="<i8").tobytes()
        return fingerprint({"order": "shards/1", "seed": seed, "lanes": self.lanes,
                            "window": self.window_samples, "num_shards": len(self.shard_sizes),
                            "shard_sizes_sha256": hashlib.sha256(sizes).hexdigest()})

    def describe(self) -> dict[str, Any]:
        """Lanes, window (resolved) and the number of shards: what a checkpoint records of the order."""
        return {"lanes": self.lanes, "window": self.window_samples, "shards": len(self.shard_sizes)}

    def _layout(self, seed: int) -> _Lanes:
        """The shards, shuffled from the seed, laid end to end into lanes of equal sample counts."""
        if seed not in self._layouts:
            self._layouts[seed] = self._lay_out(seed)
        return self._layouts[seed]

    def _lay_out(self, seed: int) -> _Lanes:
        rng = np.random.default_rng([seed, _RUN_STREAM])
        total, lanes = self.num_samples, self.lanes
        bounds = [total * lane // lanes for lane in range(lanes + 1)]
        pieces: list[list[tuple[int, int]]] = [[] for _ in range(lanes)]
        laid, lane = 0, 0  # samples laid so far, the lane being filled
        for shard in rng.permutation(len(self.shard_sizes)).tolist():
            begin, end = int(self._starts[shard]), int(self._starts[shard]) + self.shard_sizes[shard]
            while begin < end:
                while laid == bounds[lane + 1]:
                    lane += 1
                take = min(end - begin, bounds[lane + 1] - laid)
                pieces[lane].append((begin, begin + take))
                begin, laid = begin + take, laid + take
        flat = sorted((begin, lane) for lane, runs in enumerate(pieces) for begin, _ in runs)
        return _Lanes(pieces, np.array([begin for begin, _ in flat], dtype=np.int64),
                      np.array([lane for _, lane in flat], dtype=np.int64))

    def _lane_stream(self, pieces: list[tuple[int, int]], rng: np.random.Generator) -> np.ndarray:
        """One lane's samples for an epoch: its pieces in a new order, shuffled within windows."""
        if not pieces:
            return np.empty(0, dtype=np.int64)
        stream = np.concatenate([np.arange(*pieces[i], dtype=np.int64) for i in rng.permutation(len(pieces))])
        window = self.window_samples
        begin, end = 0, int(rng.integers(1, window + 1))  # a random first window staggers the lanes
        while begin < len(stream):
            rng.shuffle(stream[begin:end])
            begin, end = end, end + window
        return stream
