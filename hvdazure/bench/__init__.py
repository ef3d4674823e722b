"""`hvdazure bench`: benchmarks measured side by side on this machine, with their spread.

Each benchmark is a `Benchmark` (benchmark.py: options checked, run, table, plot; a `RankBenchmark`
measures on ranks), listed by name in registry.py and runnable alone (`python -m hvdazure.bench.allreduce
-np 2 --quick`) and through `hvdazure bench NAME`. One module per benchmark (allreduce.py, overhead.py,
throughput.py, checkpoint.py, launch.py); where a benchmark trains, what both frameworks share is in
NAME_workload.py and each framework's side in NAME_torch.py / NAME_tf.py, imported by the ranks only. The
launching process (runner.py) checks the options, runs the benchmark, whose rank jobs jobs.py starts as
`hvdazure run` does (each rank runs rank.py; rank 0 writes the raw result; any other process a benchmark
starts goes through processes.py), adds the machine's facts, prints the table and writes the JSON and the
plot. Nothing here imports a framework at import time: `hvdazure --help` stays fast.
"""
