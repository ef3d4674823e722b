"""The options of `hvdazure submit` (a command job and its two sweeps) and `hvdazure azure compute create`,
and what they ask for as the submission API takes it (JobSpec, SweepSpec, ClusterSpec, WorkspaceRef).

argparse only, and the submission's modules on first use: the CLI builds its parser from here, and
`hvdazure --help` loads no Azure SDK.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from hvdazure.azure.spec.sweep import POLICIES, SAMPLERS, InJobSweepSpec, SweepSpec, early_termination
from hvdazure.core.durations import DurationAction
from hvdazure.sweep.options import add_optuna_arguments, add_search_arguments

if TYPE_CHECKING:
    from hvdazure.azure.compute import ClusterSpec
    from hvdazure.azure.spec.job import JobSpec
    from hvdazure.azure.workspace import WorkspaceRef

P = TypeVar("P", bound=argparse.ArgumentParser)  # the CLI's parser class: its subcommands' parsers are one


def add_workspace_arguments(parser: argparse.ArgumentParser) -> None:
    """Which workspace: its config.json, or subscription, resource group and name."""
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


def add_submit_parsers(sub: argparse._SubParsersAction[P], parser_class: type[P]) -> tuple[P, P, P]:
    """`hvdazure submit SCRIPT ...` (a command job), and its two sweeps: `hvdazure submit sweep SCRIPT ...`
    and `hvdazure submit in-job-sweep SCRIPT ...`, each a parser of `parser_class` with its own options, so
    that argparse refuses an option that does not go with the job asked for. The CLI hands the sweeps' words
    to their parsers and the script's arguments (after --) to `script_args`."""
    submit = sub.add_parser(
        "submit", help="run a training script as a multi-node MPI job on Azure ML (or a sweep of them)",
        usage="hvdazure submit [sweep | in-job-sweep] SCRIPT --compute NAME [options] [-- ARGS]",
        description=_SUBMIT_DESCRIPTION + " A hyperparameter sweep: `hvdazure submit sweep --help` (an Azure "
                    "ML sweep job, one job per trial) or `hvdazure submit in-job-sweep --help` (`hvdazure "
                    "sweep` inside one job).",
        epilog="the script's own arguments go after --. examples:\n"
               "  hvdazure submit train.py --compute gpu-cluster --nodes 2 \\\n"
               "      --image myacr.azurecr.io/hvdazure-torch-gpu:0.1.0 --dry-run -- --set epochs=10\n"
               "  hvdazure submit train.py --compute gpu-cluster --nodes 2 --processes-per-node 8 \\\n"
               "      --environment azureml:hvdazure-torch-gpu@latest --input data=azureml:digits@latest \\\n"
               "      --stream -- --set extra.data_dir='${{inputs.data}}'\n"
               "  hvdazure submit train.py --compute big-cluster --nodes 8 \\\n"
               "      --environment azureml:hvdazure-torch-gpu@latest \\\n"
               "      --resume-from digits_1767225600_a1b2c3d4",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_submit_arguments(submit)
    submit.set_defaults(sweep_from=None)
    sweep = parser_class(
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
    _add_submit_arguments(sweep, _add_sweep_job_arguments)
    sweep.set_defaults(sweep_from=sweep_job_spec)
    in_job = parser_class(
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
    _add_submit_arguments(in_job, _add_in_job_sweep_arguments)
    in_job.set_defaults(sweep_from=in_job_sweep_spec)
    return submit, sweep, in_job


def _add_sweep_job_arguments(parser: argparse.ArgumentParser) -> None:
    """`hvdazure submit sweep`: the search every sweep takes, with Azure ML's sampling and policies."""
    search = add_search_arguments(parser)
    search.add_argument("--sampler", default="random", choices=SAMPLERS,
                        help="Azure ML's sampling: random (default), grid (choice parameters only) or "
                             "bayesian (choice, uniform, quniform; no early termination)")
    search.add_argument("--seed", type=int, help="the sampler's seed (random sampling only; default: none)")
    limits = parser.add_argument_group("Azure ML sweep job")
    limits.add_argument("--max-concurrent-trials", type=int, metavar="K",
                        help="trials running at once, each on --nodes nodes (default: every trial; the "
                             "cluster's size queues the rest)")
    limits.add_argument("--trial-timeout", metavar="DURATION",
                        help="cancel a trial that runs longer than this: seconds (90) or units (90s, 15m, "
                             "2h, 1d, 1h30m), at least 60 s (SDK v1: the trial run's "
                             "max_run_duration_seconds); the sweep goes on with the next")
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


def _add_in_job_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """`hvdazure submit in-job-sweep`: `hvdazure sweep`'s own search options."""
    add_optuna_arguments(add_search_arguments(parser))


def _add_submit_arguments(parser: argparse.ArgumentParser,
                          add_sweep_options: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """The options of every `hvdazure submit`: the script, its layout, environment and job, the sweep's when
    it is one (`add_sweep_options`), the workspace, and what to do."""
    parser.add_argument("script", help="the training script: a path in the code directory (--code), as the "
                                       "job runs it (or from here into it)")
    layout = parser.add_argument_group("layout")
    layout.add_argument("--compute", required=True,
                        help="the Azure ML compute cluster, or serverless (Azure ML's serverless compute, "
                             "with --vm-size; SDK v2)")
    layout.add_argument("--nodes", type=int, default=1, help="nodes (default: 1)")
    layout.add_argument("--processes-per-node", "-ppn", type=int, metavar="N",
                        help="ranks per node, usually one per GPU (default: the GPUs of the compute's VM "
                             "size when hvdazure knows it)")
    layout.add_argument("--vm-size", metavar="SIZE",
                        help="the compute's VM size, for a dry run's defaults and for --create-compute; "
                             "with --compute serverless, the VM each node is")
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
    environment.add_argument("--image", help="Docker image with an MPI library (docker/: hvdazure-torch-gpu, "
                             "hvdazure-tf-gpu, hvdazure-cpu)")
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
    job.add_argument("--output", action="append", default=[],
                     metavar="NAME[=[TYPE:][URI]][:MODE][,name=ASSET]",
                     help="output (repeatable): a datastore path, azureml://datastores/DS/paths/PATH, or "
                          "none for Azure ML's default place; TYPE uri_folder (default), uri_file, "
                          "mlflow_model or custom_model; MODE rw_mount (default), upload or direct; "
                          ",name=ASSET[,version=V] registers it when the job ends (a model for the model "
                          "types, else a data asset; SDK v2); write to ${{outputs.NAME}}")
    job.add_argument("--experiment", help="experiment name (default: the code directory's name)")
    job.add_argument("--name", help="the job's name, its id in the workspace (unique; letters, digits, '_', "
                                    "'-'; default: Azure ML's); SDK v1: the run's id")
    job.add_argument("--display-name", help="the job's display name")
    job.add_argument("--description", metavar="TEXT", help="the job's description")
    job.add_argument("--max-duration", metavar="DURATION",
                     help="cancel the job after this long: seconds (90) or units (90s, 15m, 2h, 1d, 1h30m), "
                          "at least 60 s (a sweep job: all of it, its running trials with it; they get no "
                          "grace to save a checkpoint, unlike `hvdazure sweep --timeout`); SDK v1: the run's "
                          "max_run_duration_seconds")
    job.add_argument("--job-tier", metavar="spot|standard",
                     help="with --compute serverless: spot (preemptible, cheaper) or standard (dedicated, "
                          "the default) VMs; SDK v2")
    job.add_argument("--priority", metavar="low|medium|high",
                     help="with --compute serverless: the job's scheduling priority within its tier; SDK v2")
    job.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="tag (repeatable)")
    if add_sweep_options is None:  # a command job's: a sweep's trials would all go on with one run
        job.add_argument("--resume-from", metavar="JOB",
                         help="go on with job JOB's training from its newest valid checkpoint, on any "
                              "--nodes or --vm-size: its checkpoint directory (where its command put "
                              "checkpoint_dir) becomes the read-only input resume_from and the script gets "
                              "--set resume=auto --set resume_from=... (leave both out); the job is looked "
                              "up before anything is uploaded (not by --dry-run); SDK v2")
    job.add_argument("--identity", metavar="user|managed|managed:CLIENT_ID",
                     help="what the job runs as: the submitting user's identity, or the compute's managed "
                          "identity (CLIENT_ID: a user-assigned one, also DefaultAzureCredential's in the "
                          "job); default: Azure ML's (an AML token). SDK v1: user only")
    if add_sweep_options is not None:
        add_sweep_options(parser)
    add_workspace_arguments(parser)
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
    parser.set_defaults(script_args=[], resume_from=None)


def add_azure_parser(sub: argparse._SubParsersAction[P]) -> P:
    """`hvdazure azure compute create NAME ...`: the Azure ML resources hvdazure makes. Returns the parser
    of `create`, for the CLI to give it what runs it."""
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
    create.add_argument("--idle-seconds", action=DurationAction, whole=True, default=600, metavar="DURATION",
                        help="idle time before scaling down: whole seconds (600) or units (90s, 15m, 2h, 1d, "
                             "1h30m; default: 600, 10 minutes)")
    create.add_argument("--json", action="store_true", help="print the result as JSON")
    add_workspace_arguments(create)
    return create


def sweep_job_spec(args: argparse.Namespace) -> SweepSpec:
    """`hvdazure submit sweep`'s options, as the Python API takes them."""
    policy = early_termination(args.early_termination, args.evaluation_interval, args.delay_evaluation,
                               args.slack_factor, args.truncation_percentage)
    return SweepSpec(space=args.space, metric=args.metric, mode=args.mode, trials=args.trials,
                     max_concurrent_trials=args.max_concurrent_trials, sampler=args.sampler, seed=args.seed,
                     early_termination=policy, trial_timeout=args.trial_timeout)


def in_job_sweep_spec(args: argparse.Namespace) -> InJobSweepSpec:
    """`hvdazure submit in-job-sweep`'s options, as the Python API takes them."""
    return InJobSweepSpec(space=args.space, metric=args.metric, mode=args.mode, trials=args.trials,
                          ranks_per_trial=args.ranks_per_trial, sampler=args.sampler, pruner=args.pruner,
                          seed=args.seed)


def job_spec(args: argparse.Namespace) -> JobSpec:
    """Every `hvdazure submit`'s options, as the Python API takes them (its sweep's too); JobSpecError on a
    malformed --env, --tag, --input or --output."""
    from hvdazure.azure.spec import job as spec

    return spec.JobSpec(
        script=args.script, compute=args.compute, nodes=args.nodes, script_args=args.script_args,
        processes_per_node=args.processes_per_node, code_dir=args.code, image=args.image,
        conda_file=args.conda_file, environment=args.environment,
        env=spec.parse_mapping(args.env, "--env"), tags=spec.parse_mapping(args.tag, "--tag"),
        inputs=[spec.parse_input(text) for text in args.input],
        outputs=[spec.parse_output(text) for text in args.output],
        experiment=args.experiment, display_name=args.display_name, shm_size=args.shm_size,
        docker_args=args.docker_args, vm_size=args.vm_size, identity=args.identity,
        sweep=args.sweep_from(args) if args.sweep_from else None, name=args.name,
        description=args.description, max_duration=args.max_duration, job_tier=args.job_tier,
        priority=args.priority, resume_from=args.resume_from)


def compute_for_job(args: argparse.Namespace) -> ClusterSpec | None:
    """The cluster `hvdazure submit --create-compute` makes if it is missing (None without the flag): sized
    by the submission for the job, a sweep's concurrent trials included."""
    from hvdazure.azure.compute import ClusterSpec

    return ClusterSpec(args.compute, args.vm_size or "", max_nodes=None) if args.create_compute else None


def compute_to_create(args: argparse.Namespace) -> ClusterSpec:
    """`hvdazure azure compute create`'s options, as the Python API takes them."""
    from hvdazure.azure.compute import ClusterSpec

    return ClusterSpec(args.name, args.vm_size, max_nodes=args.max_nodes, min_nodes=args.min_nodes,
                       low_priority=args.low_priority, idle_seconds=args.idle_seconds)


def workspace(args: argparse.Namespace) -> WorkspaceRef:
    """The workspace the options name (`add_workspace_arguments`); read only when a command needs Azure."""
    from hvdazure.azure.workspace import WorkspaceRef

    return WorkspaceRef.from_options(args.workspace_config, args.subscription, args.resource_group,
                                     args.workspace)
