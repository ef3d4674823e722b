"""The `hvdazure` command: parses arguments and calls the package. No logic of its own lives here."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from hvdazure._version import __version__

if TYPE_CHECKING:
    from hvdazure.azure.backend import Submitted
    from hvdazure.azure.submission import DryRunResult
    from hvdazure.azure.sweep_spec import InJobSweepSpec, SweepSpec
    from hvdazure.azure.workspace import WorkspaceRef


def _run(args: argparse.Namespace) -> int:
    from hvdazure.launch.command import LaunchSpec, check_script_exists
    from hvdazure.launch.network import NetworkInterfaceError
    from hvdazure.launch.supervisor import run_job

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        spec = LaunchSpec(num_proc=args.np, command=command, hosts=args.hosts, hostfile=args.hostfile,
                          controller=args.controller, network_interface=args.network_interface)
        check_script_exists(spec)
    except ValueError as exc:
        return _fail(str(exc))
    try:
        return run_job(spec, timeout_s=args.timeout, grace_s=args.grace, verbose=args.verbose).exit_code
    except (FileNotFoundError, NetworkInterfaceError) as exc:
        return _fail(str(exc))


def _sweep(args: argparse.Namespace) -> int:
    from hvdazure.core.config import ConfigError
    from hvdazure.launch.network import NetworkInterfaceError
    from hvdazure.sweep.launch import run_sweep
    from hvdazure.sweep.options import from_namespace

    try:
        return run_sweep(from_namespace(args), args.np, hosts=args.hosts, hostfile=args.hostfile,
                         network_interface=args.network_interface, timeout_s=args.timeout, grace_s=args.grace,
                         verbose=args.verbose).exit_code
    except (ConfigError, ValueError, FileNotFoundError, NetworkInterfaceError) as exc:
        return _fail(str(exc))


def _bench(args: argparse.Namespace) -> int:
    from hvdazure.bench.benchmark import BenchError
    from hvdazure.bench.runner import run

    try:
        return run(args, ["hvdazure", *sys.argv[1:]])
    except (BenchError, ValueError, FileNotFoundError) as exc:
        return _fail(str(exc))


def _doctor(args: argparse.Namespace) -> int:
    from hvdazure import doctor

    report = doctor.collect()
    if args.json:
        print(json.dumps(doctor.as_dict(report), indent=2))
    else:
        print(doctor.format_report(report))
    return 0 if report.ok else 1


def _submit(args: argparse.Namespace) -> int:
    from hvdazure.azure import compute, errors, job_spec, submission

    try:
        spec = job_spec.JobSpec(
            script=args.script, compute=args.compute, nodes=args.nodes, script_args=args.script_args,
            processes_per_node=args.processes_per_node, code_dir=args.code, image=args.image,
            conda_file=args.conda_file, environment=args.environment,
            env=job_spec.parse_mapping(args.env, "--env"), tags=job_spec.parse_mapping(args.tag, "--tag"),
            inputs=[job_spec.parse_input(text) for text in args.input],
            outputs=[job_spec.parse_output(text) for text in args.output],
            experiment=args.experiment, display_name=args.display_name, shm_size=args.shm_size,
            docker_args=args.docker_args, vm_size=args.vm_size, identity=args.identity,
            sweep=args.sweep_from(args) if args.sweep_from else None)
        if args.dry_run:
            result: DryRunResult | Submitted = submission.dry_run(spec, args.output_yaml, sdk=args.sdk)
        elif args.output_yaml:
            return _fail("--output-yaml goes with --dry-run", args.json)
        else:
            cluster = compute.ClusterSpec(args.compute, args.vm_size or "", max_nodes=None) \
                if args.create_compute else None  # sized for the job: a sweep's concurrent trials
            result = submission.submit(spec, lambda: _workspace(args), sdk=args.sdk, stream=args.stream,
                                       create_compute=cluster)
    except errors.SubmitError as exc:
        if args.verbose and exc.__cause__ is not None:
            print(errors.redact("".join(traceback.format_exception(exc.__cause__))), file=sys.stderr, end="")
        return _fail(errors.redacted_line(exc), args.json)
    print(json.dumps(result.as_dict(), indent=2) if args.json else "\n".join(result.report()))
    return 0


def _sweep_job_spec(args: argparse.Namespace) -> SweepSpec:
    """`hvdazure submit sweep`'s options, as the Python API takes them."""
    from hvdazure.azure.sweep_spec import SweepSpec, early_termination

    policy = early_termination(args.early_termination, args.evaluation_interval, args.delay_evaluation,
                               args.slack_factor, args.truncation_percentage)
    return SweepSpec(space=args.space, metric=args.metric, mode=args.mode, trials=args.trials,
                     max_concurrent_trials=args.max_concurrent_trials, sampler=args.sampler, seed=args.seed,
                     early_termination=policy, max_duration=args.max_duration,
                     trial_timeout=args.trial_timeout)


def _in_job_sweep_spec(args: argparse.Namespace) -> InJobSweepSpec:
    """`hvdazure submit in-job-sweep`'s options, as the Python API takes them."""
    from hvdazure.azure.sweep_spec import InJobSweepSpec

    return InJobSweepSpec(space=args.space, metric=args.metric, mode=args.mode, trials=args.trials,
                          ranks_per_trial=args.ranks_per_trial, sampler=args.sampler, pruner=args.pruner,
                          seed=args.seed)


def _azure_compute_create(args: argparse.Namespace) -> int:
    from hvdazure.azure import compute, errors, submission

    try:
        cluster = compute.ClusterSpec(args.name, args.vm_size, max_nodes=args.max_nodes,
                                      min_nodes=args.min_nodes, low_priority=args.low_priority,
                                      idle_seconds=args.idle_seconds)
        cluster.validate()
        info = submission.create_compute(cluster, _workspace(args))
    except errors.SubmitError as exc:
        return _fail(errors.redacted_line(exc), args.json)
    print(json.dumps(dataclasses.asdict(info), indent=2) if args.json else info.describe())
    return 0


def _data_index(args: argparse.Namespace) -> int:
    from hvdazure.data import commands

    try:
        print(commands.index(args.source, args.output, progress=args.progress,
                             storage_options=args.storage_option, as_json=args.json))
    except (ValueError, OSError) as exc:  # OSError: a missing source, a StorageError
        return _fail(str(exc), args.json)
    return 0


def _data_pack(args: argparse.Namespace) -> int:
    from hvdazure.data import commands

    try:
        print(commands.pack(args.folder, args.output, args.format, args.shard_size,
                            samples_per_shard=args.samples_per_shard, shuffle=args.shuffle,
                            progress=args.progress, storage_options=args.storage_option, as_json=args.json))
    except (ValueError, TypeError, OSError) as exc:
        return _fail(str(exc), args.json)
    return 0


def _workspace(args: argparse.Namespace) -> WorkspaceRef:
    from hvdazure.azure.workspace import WorkspaceRef

    return WorkspaceRef.from_options(args.workspace_config, args.subscription, args.resource_group,
                                     args.workspace)


def _fail(message: str, as_json: bool = False) -> int:
    """One line on stderr, exit status 2; with --json also the failure on stdout, where the result goes:
    `{"error": MESSAGE, "exit_code": 2}`."""
    print(f"hvdazure: error: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": message, "exit_code": 2}, indent=2))
    return 2


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that, when `trailing_dest` is set, stores everything after the first `--` there
    verbatim (a submitted script's own arguments), so that options may come before or after the script;
    and that hands the arguments to one of its `variants` when they start with its name (`hvdazure submit
    sweep ...`), parsing them itself otherwise (`hvdazure submit SCRIPT ...`); and whose errors are one
    line pointing to the help of the (sub)command that refused them, as JSON too when it was given --json.
    Every parser of the CLI is one (subparsers take their parent's class)."""

    trailing_dest: str | None = None
    variants: dict[str, argparse.ArgumentParser] | None = None
    _json_asked = False  # this parser's own arguments (not a script's, after --) hold its --json flag

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        refusing = vars(namespace).pop(_LEFT_OVER_BY, self)  # the innermost (sub)command that left them
        if extras:
            refusing.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace

    def parse_known_args(self, args=None, namespace=None):
        if self.variants and args and args[0] in self.variants:
            return self.variants[args[0]].parse_known_args(args[1:], namespace)
        args = sys.argv[1:] if args is None else list(args)
        split = args.index("--") if self.trailing_dest is not None and "--" in args else len(args)
        self._json_asked = "--json" in args[:split] and any(
            isinstance(action, argparse._StoreTrueAction) and action.dest == "json"
            for action in self._actions)
        namespace, extras = super().parse_known_args(args[:split], namespace)
        if self.trailing_dest is not None:
            setattr(namespace, self.trailing_dest, args[split + 1:])
        if extras and not hasattr(namespace, _LEFT_OVER_BY):
            setattr(namespace, _LEFT_OVER_BY, self)
        return namespace, extras

    def error(self, message: str) -> NoReturn:
        """One line and exit status 2, as every other refusal of the CLI: argparse's own error prints the
        whole usage first, which buries the line that says what is wrong (the usage is a --help away)."""
        raise SystemExit(_fail(f"{' '.join(message.split())} (see {self.prog} --help)", self._json_asked))


_LEFT_OVER_BY = "_hvdazure_left_over_by"  # set on the namespace: which parser left arguments unrecognised


def _add_workspace_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("workspace (default: config.json in this directory or .azureml/)")
    group.add_argument("--workspace-config", metavar="CONFIG.JSON", help="the workspace's config.json")
    group.add_argument("--subscription", metavar="ID", help="with --resource-group and --workspace")
    group.add_argument("--resource-group", metavar="NAME")
    group.add_argument("--workspace", metavar="NAME")


_SUBMIT_DESCRIPTION = (
    "Submit SCRIPT as an Azure ML command job with an MPI distribution: NODES x PROCESSES_PER_NODE ranks, "
    "each running `python SCRIPT ARGS` (Azure ML starts mpirun). Everything that can be checked offline is "
    "checked before anything is uploaded; --dry-run checks the job with no Azure access at all. SDK v2 "
    "(azure-ai-ml) by default; --sdk v1 uses azureml-core, which is out of support since 2026-06-30.")


def _add_submit_parser(sub: argparse._SubParsersAction) -> None:
    """`hvdazure submit SCRIPT ...` (a command job), and its two sweeps: `hvdazure submit sweep SCRIPT ...`
    and `hvdazure submit in-job-sweep SCRIPT ...`, each with its own options, so that argparse refuses an
    option that does not go with the job asked for."""
    submit = sub.add_parser(
        "submit", help="run a training script as a multi-node MPI job on Azure ML (or a sweep of them)",
        usage="hvdazure submit [sweep | in-job-sweep] SCRIPT --compute NAME [options] [-- ARGS]",
        description=_SUBMIT_DESCRIPTION + " A hyperparameter sweep: `hvdazure submit sweep --help` (an Azure "
                    "ML sweep job, one job per trial) or `hvdazure submit in-job-sweep --help` (`hvdazure "
                    "sweep` inside one job).",
        epilog="the script's own arguments go after --. examples:\n"
               "  hvdazure submit train.py --compute gpu-cluster --nodes 2 \\\n"
               "      --image myacr.azurecr.io/hvdazure-gpu:0.1.0 --dry-run -- --set epochs=10\n"
               "  hvdazure submit train.py --compute gpu-cluster --nodes 2 --processes-per-node 8 \\\n"
               "      --environment azureml:hvdazure-gpu@latest --input data=azureml:digits@latest \\\n"
               "      --stream -- --set extra.data_dir='${{inputs.data}}'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_submit_options(submit)
    submit.set_defaults(sweep_from=None)
    sweep = _Parser(
        prog="hvdazure submit sweep",
        usage="hvdazure submit sweep SCRIPT --space SPACE.yaml --metric NAME --compute NAME [options] "
              "[-- ARGS]",
        description="Submit an Azure ML sweep job: one job per trial, each the MPI command job `hvdazure "
                    "submit SCRIPT` makes, given the trial's values as --set NAME=VALUE and logging --metric "
                    "with MLflow, which Azure ML reads. SPACE.yaml: TrainConfig fields / extra.NAME with "
                    "Azure ML's distributions, as for `hvdazure sweep` (docs/guides/azure-ml-sweeps.md). "
                    "SDK v1: "
                    "a HyperDrive run.",
        epilog="the script's own arguments go after --. example:\n"
               "  hvdazure submit sweep train.py --space space.yaml --metric eval_loss --trials 20 \\\n"
               "      --max-concurrent-trials 4 --early-termination bandit \\\n"
               "      --compute gpu-cluster --nodes 2 ...",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_submit_options(sweep, _add_sweep_job_options)
    sweep.set_defaults(sweep_from=_sweep_job_spec)
    in_job = _Parser(
        prog="hvdazure submit in-job-sweep",
        usage="hvdazure submit in-job-sweep SCRIPT --space SPACE.yaml --metric NAME --compute NAME "
              "[options] [-- ARGS]",
        description="Submit one MPI command job that runs `hvdazure sweep` on its ranks: trials of "
                    "--ranks-per-trial ranks packed onto its GPUs, with the options of `hvdazure sweep` "
                    "(the job's layout gives the ranks, and results go to ./outputs/sweep, uploaded with the "
                    "job; every trial logs to MLflow as a child run of the job's run). SPACE.yaml must be in "
                    "the code directory. SDK v1: a ScriptRunConfig whose command is the same.",
        epilog="the script's own arguments go after --. example:\n"
               "  hvdazure submit in-job-sweep train.py --space space.yaml --metric eval_loss \\\n"
               "      --trials 24 --ranks-per-trial 4 --pruner median --compute gpu-cluster --nodes 2 ...",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_submit_options(in_job, _add_in_job_sweep_options)
    in_job.set_defaults(sweep_from=_in_job_sweep_spec)
    submit.variants = {"sweep": sweep, "in-job-sweep": in_job}


def _add_sweep_job_options(parser: argparse.ArgumentParser) -> None:
    """`hvdazure submit sweep`: the search every sweep takes, with Azure ML's sampling and policies."""
    from hvdazure.azure.sweep_spec import POLICIES, SAMPLERS
    from hvdazure.sweep.options import add_search_arguments

    search = add_search_arguments(parser)
    search.add_argument("--sampler", default="random", choices=SAMPLERS,
                        help="Azure ML's sampling: random (default), grid (choice parameters only) or "
                             "bayesian (choice, uniform, quniform; no early termination)")
    search.add_argument("--seed", type=int, help="the sampler's seed (random sampling only; default: none)")
    limits = parser.add_argument_group("Azure ML sweep job")
    limits.add_argument("--max-concurrent-trials", type=int, metavar="K",
                        help="trials running at once, each on --nodes nodes (default: every trial; the "
                             "cluster's size queues the rest)")
    limits.add_argument("--max-duration", type=int, metavar="SECONDS",
                        help="end the sweep job after this long, cancelling running trials (they get no "
                             "grace to save a checkpoint, unlike `hvdazure sweep --timeout`)")
    limits.add_argument("--trial-timeout", type=int, metavar="SECONDS",
                        help="cancel a trial that runs longer than this, at least 60 (SDK v1: the trial "
                             "run's max_run_duration_seconds); the sweep goes on with the next")
    limits.add_argument("--early-termination", choices=("none", *POLICIES), metavar="POLICY",
                        help="cancel trials that are behind, by Azure ML's policy: none (default), bandit "
                             "(outside --slack-factor of the best), median (below the median of running "
                             "averages) or truncation (the worst --truncation-percentage)")
    limits.add_argument("--evaluation-interval", type=int, metavar="N",
                        help="apply the policy every N reports of the metric (default: 1)")
    limits.add_argument("--delay-evaluation", type=int, metavar="N",
                        help="first apply the policy after N reports (default: 5)")
    limits.add_argument("--slack-factor", type=float, metavar="F",
                        help="bandit: allowed distance from the best, as a ratio (default: 0.1)")
    limits.add_argument("--truncation-percentage", type=int, metavar="P",
                        help="truncation: percent of trials cancelled per evaluation (default: 20)")


def _add_in_job_sweep_options(parser: argparse.ArgumentParser) -> None:
    """`hvdazure submit in-job-sweep`: `hvdazure sweep`'s own search options."""
    from hvdazure.sweep.options import add_optuna_arguments, add_search_arguments

    add_optuna_arguments(add_search_arguments(parser))


def _add_submit_options(parser: _Parser,
                        add_sweep_options: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """The options of every `hvdazure submit`: the script, its layout, environment and job, the sweep's when
    it is one (`add_sweep_options`), the workspace, and what to do."""
    parser.trailing_dest = "script_args"
    parser.add_argument("script", help="the training script: a path in the code directory (--code), as the "
                                       "job runs it (or from here into it)")
    layout = parser.add_argument_group("layout")
    layout.add_argument("--compute", required=True, help="the Azure ML compute cluster")
    layout.add_argument("--nodes", type=int, default=1, help="nodes (default: 1)")
    layout.add_argument("--processes-per-node", "-ppn", type=int, metavar="N",
                        help="ranks per node, usually one per GPU (default: the GPUs of the compute's VM "
                             "size when hvdazure knows it)")
    layout.add_argument("--vm-size", metavar="SIZE",
                        help="the compute's VM size, for a dry run's defaults and for --create-compute")
    layout.add_argument("--create-compute", action="store_true",
                        help="create the compute if it does not exist (--vm-size, up to --nodes nodes, or "
                             "--nodes x --max-concurrent-trials for a sweep job; scaling to 0 when idle); "
                             "see also `hvdazure azure compute create`")
    layout.add_argument("--shm-size", metavar="SIZE",
                        help="shared memory per container: a number and a unit, b, k, m or g, e.g. 16g "
                             "(default: 2g; a bare number is refused, Docker would read bytes)")
    layout.add_argument("--docker-args", metavar="ARGS",
                        help="extra `docker run` arguments, e.g. --docker-args='--user root'")
    environment = parser.add_argument_group("environment")
    environment.add_argument("--image", help="Docker image with an MPI library (docker/: hvdazure-gpu)")
    environment.add_argument("--conda-file", metavar="ENV.YML", help="with --image: conda environment on top")
    environment.add_argument("--environment", metavar="azureml:NAME@latest",
                             help="a registered environment instead of --image (azureml:NAME:VERSION, or a "
                                  "registry's: azureml://registries/REG/environments/NAME/labels/latest)")
    environment.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                             help="environment variable (repeatable; NCCL defaults for the VM size added)")
    job = parser.add_argument_group("job")
    job.add_argument("--code", metavar="DIR", help="directory to upload; the job starts there (default: .)")
    job.add_argument("--input", action="append", default=[], metavar="NAME=[TYPE:]URI[:MODE]",
                     help="input (repeatable): azureml:ASSET:VERSION or @latest, azureml://datastores/..., "
                          "an https/abfss URL, a local path (uploaded); TYPE uri_folder (default) or "
                          "uri_file; MODE ro_mount (default), download or direct; read it with "
                          "${{inputs.NAME}}")
    job.add_argument("--output", action="append", default=[], metavar="NAME[=[TYPE:]URI][:MODE]",
                     help="output (repeatable): a datastore path, azureml://datastores/DS/paths/PATH, or "
                          "none for Azure ML's default place; TYPE uri_folder (default) or uri_file; MODE "
                          "rw_mount (default), upload or direct; write to ${{outputs.NAME}}")
    job.add_argument("--experiment", help="experiment name (default: the code directory's name)")
    job.add_argument("--display-name", help="the job's display name")
    job.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="tag (repeatable)")
    job.add_argument("--identity", metavar="user|managed|managed:CLIENT_ID",
                     help="what the job runs as: the submitting user's identity, or the compute's managed "
                          "identity (CLIENT_ID: a user-assigned one, also DefaultAzureCredential's in the "
                          "job); default: Azure ML's (an AML token). SDK v1: user only")
    if add_sweep_options is not None:
        add_sweep_options(parser)
    _add_workspace_options(parser)
    submission = parser.add_argument_group("submission")
    submission.add_argument("--dry-run", action="store_true",
                            help="write the job YAML and validate it offline; upload and submit nothing")
    submission.add_argument("--output-yaml", metavar="PATH",
                            help="with --dry-run: where to write the YAML (default: "
                                 "~/.cache/hvdazure/dry-run/EXPERIMENT/hvdazure-job.yml, outside the code "
                                 "directory, which is uploaded)")
    submission.add_argument("--stream", action="store_true", help="follow the job's logs after submitting")
    submission.add_argument("--sdk", default="v2", help="v2 (azure-ai-ml, default) or v1 (azureml-core, "
                                                        "legacy, out of support since 2026-06-30)")
    submission.add_argument("--json", action="store_true", help="print the result as JSON")
    submission.add_argument("-v", "--verbose", action="store_true",
                            help="show the SDK's traceback on failure")
    parser.set_defaults(func=_submit, script_args=[])


def _add_azure_parser(sub: argparse._SubParsersAction) -> None:
    azure = sub.add_parser("azure", help="Azure ML resources (compute clusters)")
    resources = azure.add_subparsers(dest="azure_resource", metavar="RESOURCE", required=True)
    compute = resources.add_parser("compute", help="compute clusters")
    actions = compute.add_subparsers(dest="compute_action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="get or create an AmlCompute cluster (an existing one stays)",
                                description="Create an AmlCompute cluster unless the workspace has one of "
                                            "that name, which is used as it is.")
    create.add_argument("name", help="cluster name (2-32 letters, digits, '-')")
    create.add_argument("--vm-size", required=True, help="e.g. Standard_ND96asr_v4 (8 A100, InfiniBand)")
    create.add_argument("--max-nodes", type=int, required=True, help="largest number of nodes")
    create.add_argument("--min-nodes", type=int, default=0, help="nodes kept running (default: 0)")
    create.add_argument("--low-priority", action="store_true", help="preemptible VMs (cheaper)")
    create.add_argument("--idle-seconds", type=int, default=600,
                        help="idle time before scaling down (default: 600)")
    create.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_workspace_options(create)
    create.set_defaults(func=_azure_compute_create)


def _add_data_parser(sub: argparse._SubParsersAction) -> None:
    """`hvdazure data index` and `hvdazure data pack`: make and index the shards ShardedDataset reads."""
    data = sub.add_parser("data", help="sharded datasets: index shards, pack a folder of files into shards",
                          description="Sharded datasets bigger than memory (hvdazure.data.ShardedDataset): "
                                      "WebDataset-style .tar, TFRecord (.tfrecord, .tfrecords) and .parquet "
                                      "shards on local disk or an object store (abfs://, az://).")
    actions = data.add_subparsers(dest="data_action", metavar="ACTION", required=True)
    index = actions.add_parser(
        "index", help="scan every shard and write the index (samples, offsets, sizes, versions)",
        description="Scan every shard of SOURCE (a directory, searched recursively, a glob in quotes, a "
                    "file, or an abfs:// / az:// URL of any of them) and write hvdazure-index.json next to "
                    "the shards, or to --output. Prints one line: shards, samples, bytes, where the index "
                    "is.",
        epilog="examples:\n  hvdazure data index data/train\n"
               "  hvdazure data index 'abfs://datasets/imagenet/train-*.tar' --output index/train.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    index.add_argument("source", metavar="SOURCE", help="the shards: directory, glob, file or URL")
    index.add_argument("--output", metavar="URL",
                       help="where the index goes: a .json file or a directory (default: next to the shards)")
    pack = actions.add_parser(
        "pack", help="pack a folder of files in class subfolders (like ImageFolder) into shards",
        description="Write the files of FOLDER/CLASS/... into shards in OUTPUT (a directory or an abfs:// "
                    "URL, holding no shards yet), and index them: each file is one sample {its extension: "
                    "its bytes, cls: its class's number}, classes numbered by name (saved as classes.json "
                    "next to the index), files shuffled with a fixed seed.",
        epilog="example:\n  hvdazure data pack images/train shards/train --format tar --shard-size 64MB",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    pack.add_argument("folder", metavar="FOLDER", help="a folder with one subfolder per class")
    pack.add_argument("output", metavar="OUTPUT", help="the directory or URL the shards go to")
    pack.add_argument("--format", default="tar", help="tar (default), tfrecord or parquet")
    size = pack.add_mutually_exclusive_group()
    size.add_argument("--shard-size", metavar="SIZE",
                      help="fill shards up to SIZE: 64MB (default), 256MiB, 1GB, bytes")
    size.add_argument("--samples-per-shard", type=int, metavar="N", help="N samples a shard instead")
    pack.add_argument("--no-shuffle", dest="shuffle", action="store_false",
                      help="write class by class (a shard then holds few classes)")
    for parser in (index, pack):
        parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                            help="an fsspec storage option, e.g. account_name=NAME (repeatable; credentials "
                                 "are better left to the environment)")
        parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
        parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    index.set_defaults(func=_data_index)
    pack.set_defaults(func=_data_pack)


def _add_job_options(parser: argparse.ArgumentParser) -> None:
    """Where the ranks run and how the job is stopped: the options `hvdazure run` and `hvdazure sweep` share
    (the job's supervisor is the same, launch/supervisor.py)."""
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", help="host:slots,... (default: localhost:N)")
    hosts.add_argument("--hostfile", help="file with one `host slots=N` per line")
    parser.add_argument("--network-interface", metavar="IFACE|CIDR",
                        help="the interface ranks on different nodes talk over, by name (eth0) or subnet "
                             "(10.0.0.0/24); default: the route to the other hosts, when unambiguous")
    parser.add_argument("--timeout", type=_positive_float, metavar="S",
                        help="stop every rank and exit 124 after S seconds (a sweep's running trials save a "
                             "checkpoint first and resume when it is started again)")
    parser.add_argument("--grace", type=_positive_float, default=30.0, metavar="S",
                        help="seconds ranks get after SIGTERM (timeout, Ctrl-C, preemption) to save a final "
                             "checkpoint before they are killed (default: 30)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show the launcher's own report when a rank fails (horovodrun's traceback, "
                             "mpirun's summary), and every rank's traceback in full (by default an error on "
                             "several ranks is shown once); hvdazure's one-line summary names the rank "
                             "either way")


def _add_sweep_parser(sub: argparse._SubParsersAction) -> None:
    from hvdazure.sweep.options import add_arguments

    sweep = sub.add_parser(
        "sweep", help="hyperparameter search: many data-parallel trials at once in one MPI job (Optuna)",
        description="Run SCRIPT (unmodified, as for `hvdazure run`) as the trials of a hyperparameter search "
                    "on N ranks under one mpirun: the ranks are split into groups of --ranks-per-trial, each "
                    "group trains one trial at a time with Horovod on its own MPI sub-communicator and takes "
                    "the next trial when done. Each trial's config is the script's config plus the trial's "
                    "parameters, with its own output and checkpoint folder under --output. Results: a table, "
                    "results.json, results.csv, best.yaml (for --config) and sweep.png in --output. Started "
                    "again with the same --output, a stopped sweep resumes. Uses the MPI controller (Horovod "
                    "ignores sub-communicators under Gloo) and mpi4py built against Horovod's MPI.",
        epilog="the script's own arguments go after --. example:\n"
               "  hvdazure sweep -np 8 --ranks-per-trial 2 train.py --space space.yaml --trials 24 \\\n"
               "      --metric eval_loss --mode min --pruner median --output sweeps/run1 -- --set epochs=10",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sweep.trailing_dest = "script_args"
    sweep.add_argument("-np", "--num-proc", dest="np", type=int, required=True,
                       help="ranks in all: a multiple of --ranks-per-trial")
    add_arguments(sweep)
    _add_job_options(sweep)
    sweep.set_defaults(func=_sweep, script_args=[])


def _add_bench_parser(sub: argparse._SubParsersAction) -> None:
    from hvdazure.bench.options import add_arguments
    from hvdazure.bench.registry import NAMES

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
    bench.set_defaults(func=_bench)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = _Parser(
        prog="hvdazure",
        description="Horovod data-parallel training for PyTorch and TensorFlow, from a laptop to Azure ML.",
    )
    parser.add_argument("--version", action="version", version=f"hvdazure {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True, parser_class=_Parser)

    run = sub.add_parser(
        "run", help="run a script or command on N ranks (MPI via mpirun, or Gloo via horovodrun)",
        description="Start COMMAND on N ranks with rank-tagged output. If any rank fails, every rank is "
                    "stopped and the exit code is the failing rank's. Ctrl-C, SIGTERM or SIGHUP give every "
                    "rank SIGTERM and --grace seconds, then exit 128 + the signal; no rank outlives this "
                    "command, even killed outright. A bare `train.py` runs with this Python interpreter.",
        epilog="examples:\n  hvdazure run -np 2 train.py --set epochs=3\n"
               "  hvdazure run -np 8 -H node1:4,node2:4 --mpi -- python train.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("-np", "--num-proc", dest="np", type=int, required=True, help="number of ranks")
    controller = run.add_mutually_exclusive_group()
    controller.add_argument("--gloo", dest="controller", action="store_const", const="gloo",
                            help="Gloo controller via horovodrun (default where MPI cannot run)")
    controller.add_argument("--mpi", dest="controller", action="store_const", const="mpi",
                            help="MPI controller via mpirun (default where mpirun is on PATH and Horovod is "
                                 "built with its MPI: `hvdazure doctor` says which)")
    _add_job_options(run)
    run.add_argument("command", nargs=argparse.REMAINDER, help="script.py [args] or -- COMMAND [args]")
    run.set_defaults(func=_run, controller=None)

    _add_sweep_parser(sub)
    _add_bench_parser(sub)
    doctor = sub.add_parser("doctor", help="report versions, Horovod's build, MPI, GPUs and what is missing",
                            description="Exit status is non-zero when Horovod cannot run here.")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(func=_doctor)
    _add_submit_parser(sub)
    _add_azure_parser(sub)
    _add_data_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
