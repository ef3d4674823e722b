"""The options every benchmark takes, shared by `hvdazure bench` and `python -m hvdazure.bench.NAME`.

Kept free of framework imports: the CLI builds its parser from here.
"""

from __future__ import annotations

import argparse
from typing import TypeVar

from hvdazure.bench.benchmark import Options
from hvdazure.bench.registry import NAMES
from hvdazure.core.durations import DurationAction
from hvdazure.launch.options import add_controller_arguments

P = TypeVar("P", bound=argparse.ArgumentParser)  # the CLI's parser class: its subcommands' parsers are one


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """-np, the controller, --quick, --json, --plot and the options of single benchmarks."""
    parser.add_argument("-np", "--num-proc", dest="np", type=int, default=2,
                        help="ranks (default: 2); throughput also runs 1 rank and N single-rank processes")
    add_controller_arguments(parser, "MPI controller via mpirun (default where it can run, as for hvdazure "
                                     "run; needed for the mpi4py peer of allreduce); peers runs hvdazure on "
                                     "both")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny configuration: checks that the benchmark runs, not a measurement")
    parser.add_argument("--json", metavar="OUT.json", help="write every figure and the machine's facts here")
    parser.add_argument("--plot", metavar="OUT.png", help="write a plot (matplotlib)")
    parser.add_argument("--op", choices=("allreduce", "broadcast", "allgather"), default="allreduce",
                        help="allreduce: the collective measured (default: allreduce)")
    parser.add_argument("--framework", choices=("torch", "tensorflow", "both"), default="both",
                        help="overhead: the trainers compared with their hand-written loops; throughput: the "
                             "trainers measured, reported side by side; peers: the frameworks whose peers "
                             "are compared (default: both)")
    parser.add_argument("--model", choices=("mlp", "cnn", "resnet50"), default=None,
                        help="throughput, peers: the model (mlp: latency-bound; cnn: a small compute-bound "
                             "CNN; resnet50 for GPUs, needs torchvision (PyTorch) or keras.applications "
                             "(TensorFlow); default: throughput cnn, peers both mlp and cnn)")
    parser.add_argument("--rounds", type=int, default=None, metavar="R",
                        help="peers: rounds of every peer, paired (default: 5; --quick: 1)")
    parser.add_argument("--url", metavar="URL",
                        help="checkpoint: save and load to this store (an fsspec URL such as "
                             "abfs://CONTAINER/PATH) against writing and reading the same bytes there with "
                             "fsspec (the store's floor), instead of the local figures; data: write and "
                             "read the dataset there instead of a local folder")
    parser.add_argument("--timeout", action=DurationAction, positive=True, default=3600.0, metavar="DURATION",
                        help="stop a job of the benchmark after this long: seconds (90) or units (90s, 15m, "
                             "2h, 1d, 1h30m; default: 1h)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show the launcher's report on failure")
    parser.set_defaults(controller=None)


def add_parser(sub: argparse._SubParsersAction[P]) -> P:
    """`hvdazure bench NAME ...`. Returns the parser, for the CLI to give it what runs it."""
    bench = sub.add_parser(
        "bench", help="benchmarks on this machine: collectives, overhead, throughput, the peers users pick",
        description="Run a benchmark on N ranks of this machine (started as `hvdazure run` starts jobs) and "
                    "print its table; --json writes every figure with the machine's facts, --plot a PNG. "
                    "allreduce: latency and bandwidth of hvdazure's gradient path against raw Horovod, "
                    "torch.distributed and mpi4py (--mpi). overhead: the trainers against hand-written "
                    "Horovod loops, paired blocks, the median ratio with a bootstrap 95% interval. "
                    "throughput: samples/s through TorchTrainer and TensorFlowTrainer on 1 and N ranks, "
                    "weak-scaling efficiency, and N independent processes as the ceiling. checkpoint: save "
                    "and load against bare torch.save/load, the stall of async and blocking checkpoints, "
                    "resume memory. launch: hvdazure run against the bare launcher. data: a sharded dataset "
                    "read along the ranks' plans against a raw read of the same bytes, cold and warm cache, "
                    "data wait, bytes fetched, memory. peers: hvdazure (Gloo and MPI) against torchrun + "
                    "DDP, Lightning, HF Accelerate and MultiWorkerMirroredStrategy, each started by its own "
                    "launcher on the same model, data and ranks: samples/s, time to the first step, wall "
                    "time, peak RSS, paired ratios with intervals.",
        epilog="examples:\n  hvdazure bench allreduce -np 2 --mpi --json ar.json --plot ar.png\n"
               "  hvdazure bench overhead -np 2 --framework torch\n"
               "  hvdazure bench throughput -np 2 --quick\n"
               "  hvdazure bench peers -np 2 --json peers.json --plot peers.png",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument("name", choices=NAMES, metavar="NAME", help=", ".join(NAMES))
    add_arguments(bench)
    return bench


def as_options(args: argparse.Namespace) -> Options:
    """What the ranks need from the parsed arguments (JSON-serialisable)."""
    return {"np": args.np, "controller": args.controller, "quick": args.quick, "op": args.op,
            "framework": args.framework, "model": args.model, "url": args.url, "rounds": args.rounds}
