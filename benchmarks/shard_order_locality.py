"""Shards touched per rank per epoch, data/shard_order.py's order against the uniform permutation.

The ideal is the dataset's shards / world size (each shard read by one rank). Counted from the plans alone
(no data is read), for world sizes 1..8, so it runs in seconds on one core:

    PYTHONPATH=. python benchmarks/shard_order_locality.py [--json PATH] [--shards 256 --lanes 32]

Also reported: the distinct shards a rank needs in one step, and the same across a 3-epoch run (what a
node cache that keeps a rank's shards between epochs would have to hold).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from common import write_result

from hvdazure.core.sample_plan import SampleOrder, SamplePlan, UniformOrder
from hvdazure.data.shard_order import DEFAULT_LANES, ShardOrder

RESULT = Path(__file__).resolve().parent / "results" / "shard_order_locality.json"


def _touched(order: ShardOrder, plan: SamplePlan, epochs: int) -> dict[str, float]:
    """Shards this rank reads in epoch 0, over all `epochs`, and per step (mean, epoch 0)."""
    first: set[int] = set()
    every: set[int] = set()
    per_step = []
    for epoch in range(epochs):
        for step in plan.epoch(epoch):
            samples = np.array([i for cell in step for i in cell.indices], dtype=np.int64)
            step_shards = set(order.locate(samples)[0].tolist())
            every |= step_shards
            if epoch == 0:
                first |= step_shards
                per_step.append(len(step_shards))
    return {"epoch": len(first), "all_epochs": len(every), "per_step": float(np.mean(per_step))}


def measure(shard_sizes: tuple[int, ...], batch_size: int, lanes: int, epochs: int = 3) -> list[dict]:
    """One row per world size 1..8: the ideal, and the shards touched per rank under each order."""
    sharded = ShardOrder(shard_sizes, lanes=lanes)
    orders: dict[str, SampleOrder] = {"shard_order": sharded, "uniform": UniformOrder(sharded.num_samples)}
    rows = []
    for world_size in range(1, 9):
        row: dict = {"world_size": world_size, "ideal": len(shard_sizes) / world_size}
        for name, order in orders.items():
            ranks = [_touched(sharded, SamplePlan(sharded.num_samples, batch_size, world_size, rank,
                                                 order=order), epochs) for rank in range(world_size)]
            row[name] = {"mean": float(np.mean([r["epoch"] for r in ranks])),
                         "max": max(r["epoch"] for r in ranks),
                         "per_step": float(np.mean([r["per_step"] for r in ranks])),
                         f"max_over_{epochs}_epochs": max(r["all_epochs"] for r in ranks)}
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank, no accumulation")
    parser.add_argument("--lanes", type=int, default=DEFAULT_LANES)
    parser.add_argument("--json", type=Path, default=RESULT,
                        help="where the result goes (default: %(default)s)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    shard_sizes = tuple(int(n) for n in rng.integers(300, 700, args.shards))  # uneven, ~500 samples
    rows = measure(shard_sizes, args.batch_size, args.lanes)
    print(f"{args.shards} shards, {sum(shard_sizes)} samples, batch {args.batch_size} per rank, "
          f"{args.lanes} lanes: shards touched per rank in one epoch (mean / max), per step (mean)")
    print(f"{'ranks':>5} {'ideal':>6} | {'shard order':>13} {'/step':>6} {'3 epochs':>8} | "
          f"{'uniform':>13} {'/step':>6}")
    for row in rows:
        s, u = row["shard_order"], row["uniform"]
        print(f"{row['world_size']:>5} {row['ideal']:>6.1f} | {s['mean']:>6.1f} / {s['max']:>4} "
              f"{s['per_step']:>6.1f} {s['max_over_3_epochs']:>8} | {u['mean']:>6.1f} / {u['max']:>4} "
              f"{u['per_step']:>6.1f}")
    write_result(args.json, {"benchmark": "shard_order_locality", "command": " ".join(sys.argv),
                             "shards": args.shards, "samples": sum(shard_sizes),
                             "batch_size": args.batch_size, "lanes": args.lanes, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
