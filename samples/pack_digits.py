"""Write scikit-learn's digits into shards that hvdazure.data.ShardedDataset reads: the way to turn data
you have (arrays, a map-style Dataset, a folder of files) into a dataset bigger than memory.

    python samples/pack_digits.py data/digits                       # local: data/digits/{train,eval}
    python samples/pack_digits.py abfs://CONTAINER/digits           # Azure Blob (credentials: environment)
    python samples/pack_digits.py data/digits --copies 50 --format tfrecord

`--copies K` writes every training image K times with a little noise (a dataset K times the size, to try
the cache and the read-ahead on more than a few shards). Each split gets its index
(hvdazure-index.json); `hvdazure data index DIR` builds one for shards written another way.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import numpy as np
from sklearn.datasets import load_digits

from hvdazure.data import write_shards


def digits_split(seed: int = 0, eval_fraction: float = 0.2) -> tuple[dict, dict]:
    """The fixed train/eval split of the 1797 images (as samples/torch_digits.py makes it)."""
    digits = load_digits()
    x, y = (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_eval = int(len(x) * eval_fraction)
    return ({"image": x[order[n_eval:]], "label": y[order[n_eval:]]},
            {"image": x[order[:n_eval]], "label": y[order[:n_eval]]})


def noisy_copies(split: dict, copies: int, seed: int = 1) -> Iterator[dict]:
    """Each sample `copies` times, every copy after the first with a little Gaussian noise."""
    rng = np.random.default_rng(seed)
    for copy in range(copies):
        for image, label in zip(split["image"], split["label"], strict=True):
            noise = rng.normal(0, 0.05, image.shape).astype(np.float32) if copy else 0
            yield {"image": np.clip(image + noise, 0, 1).astype(np.float32), "label": int(label)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="a local directory or an abfs:// URL (holding no shards yet)")
    parser.add_argument("--format", choices=("tar", "tfrecord", "parquet"), default="tar")
    parser.add_argument("--copies", type=int, default=1, help="training set copies (default 1)")
    parser.add_argument("--samples-per-shard", type=int, default=128)
    args = parser.parse_args()
    train, evaluation = digits_split()
    out = args.output.rstrip("/")
    written = write_shards(noisy_copies(train, args.copies), f"{out}/train", args.format,
                           samples_per_shard=args.samples_per_shard)
    write_shards(evaluation, f"{out}/eval", args.format, samples_per_shard=args.samples_per_shard)
    print(f"{out}/train: {len(written.shards)} shards, {written.num_samples} samples; {out}/eval: "
          f"{len(evaluation['label'])} samples")


if __name__ == "__main__":
    main()
