"""`hvdazure bench`: benchmarks measured side by side on this machine, with their spread.

One module per benchmark (allreduce.py, overhead.py, throughput.py, launch.py; the framework side of a
benchmark in NAME_torch.py / NAME_tf.py, imported by the ranks only), each runnable alone
(`python -m hvdazure.bench.allreduce -np 2 --quick`) and through `hvdazure bench NAME`. The launching
process starts the ranks the way `hvdazure run` does (runner.py), rank 0 writes the raw result, and the
launching process adds the machine's facts, prints the table and writes the JSON and the plot. Nothing here
imports a framework at import time: `hvdazure --help` stays fast.
"""

BENCHMARKS = ("allreduce", "overhead", "throughput", "checkpoint", "launch")
