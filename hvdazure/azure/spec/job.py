"""What the user asked `hvdazure submit` for (JobSpec), validated offline and resolved into a ResolvedJob;
no Azure SDK here.

Azure ML accepts some wrong jobs silently (zero or negative counts, a script that was not uploaded) and
reports others only after the code is uploaded and the job queued. Everything that can be checked without
Azure is checked here, before anything is uploaded, each problem as one line naming the option:

- nodes and processes per node are integers of at least 1; the script and the code directory exist, the
  script is inside the code directory and not excluded by its .amlignore / .gitignore;
- inputs, outputs, environment variables and tags parse; `${{inputs.x}}` / `${{outputs.x}}` in the script's
  arguments name declared ones;
- no credential is put into the job in plain text, by any field (credential_check.py, first of all);
- the script's `--config` / `--set` arguments are parsed by `TrainConfig`, with the same code the job runs;
- the job's own settings, name, description, max duration and queue (spec/settings.py), and serverless
  compute's VM size;
- `--resume-from NAME` (resume_from.py): a command job, no `--set resume=` of the script's own; its wiring
  (an input, `--set resume=auto --set resume_from=...`) is added to the job and checked as the user's own
  would be.

The job runs `python SCRIPT ARGS` from the top of the code directory on every rank: Azure ML starts
`mpirun` itself, with `nodes x processes_per_node` ranks. A sweep (`JobSpec.sweep`, see spec/sweep.py)
changes the job's kind (resolved_job.py), which says what the ranks run: each trial of an Azure ML sweep
job is this command with the sampled values as `--set` arguments, and an in-job sweep runs
`python -m hvdazure.sweep SCRIPT ...` on every rank.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hvdazure.azure import vm_sizes
from hvdazure.azure.code_snapshot import CodeSnapshot, scan
from hvdazure.azure.compute import check_compute_name
from hvdazure.azure.errors import JobSpecError, check_count
from hvdazure.azure.resolved_job import (
    SERVERLESS,
    InputSpec,
    JobEnvironment,
    OutputSpec,
    ResolvedJob,
    ResumeSource,
)
from hvdazure.azure.script_args import argument_names
from hvdazure.azure.spec import credential_check, data_inputs, resume_from
from hvdazure.azure.spec import settings as job_settings
from hvdazure.azure.spec import sweep as sweep_spec
from hvdazure.azure.spec.identity import with_identity
from hvdazure.azure.spec.sweep import InJobSweepSpec, SweepSpec
from hvdazure.launch.command import MPI_YIELD_WHEN_IDLE

if TYPE_CHECKING:
    from hvdazure.core.config import TrainConfig

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # input, output and environment variable names
_EXPERIMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,254}$")
_SHM_SIZE = re.compile(r"^[1-9][0-9]*[bkmg]$", re.I)
_PLACEHOLDER = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")
_REGISTERED_ENV = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)(@latest|:[A-Za-z0-9_.\-]+)$")  # after azureml:
_REGISTRY_ENV = re.compile(r"^azureml://registries/([A-Za-z0-9][A-Za-z0-9_\-]*)/environments/"
                           r"([A-Za-z0-9][A-Za-z0-9_.\-]*)/(labels|versions)/([A-Za-z0-9_.\-]+)$")


@dataclass(frozen=True)
class JobSpec:
    """Everything `hvdazure submit` takes (the CLI's options, one field each). Paths are relative to the
    current directory, as on the command line."""

    script: str
    compute: str
    nodes: int = 1
    processes_per_node: int | None = None  # default: the GPUs of `vm_size` (or of the compute, when known)
    script_args: Sequence[str] = ()
    code_dir: str | None = None  # default: the current directory; the job starts there
    image: str | None = None  # a Docker image with an MPI library (docker/: hvdazure-torch-gpu, ...)
    conda_file: str | None = None  # with `image`: a conda environment built on top of it
    environment: str | None = None  # instead of `image`: a registered environment, azureml:NAME@latest
    env: Mapping[str, str] = field(default_factory=dict)
    inputs: Sequence[InputSpec] = ()
    outputs: Sequence[OutputSpec] = ()
    experiment: str | None = None  # default: the code directory's name
    display_name: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    shm_size: str | None = None  # e.g. "16g"; Azure ML's default is 2g
    docker_args: str | None = None  # extra `docker run` arguments, e.g. "--user root"
    vm_size: str | None = None  # the compute's VM size, when known before asking Azure
    sweep: SweepSpec | InJobSweepSpec | None = None  # hvdazure submit sweep | in-job-sweep
    identity: str | None = None  # user, managed or managed:CLIENT_ID (spec/identity.py); None: Azure ML's
    # the job's own settings (spec/settings.py)
    name: str | None = None  # the job's name, its id in the workspace; None: Azure ML names it
    description: str | None = None
    max_duration: int | str | None = None  # 5400, "1h30m", at least 60 s: then Azure ML cancels the job
    job_tier: str | None = None  # spot or standard, with compute "serverless"
    priority: str | None = None  # low, medium or high, with compute "serverless"
    resume_from: str | None = None  # a job whose newest valid checkpoint this one goes on from (resume_from)


# --- credentials: none in any field of the job -------------------------------------------------------------
def check_credentials(spec: JobSpec) -> None:
    """No credential in any field of `spec` that goes into the job (credential_check.py's rule), in the order
    of the CLI's options."""
    for where, value, advice in _spec_fields(spec):
        credential_check.refuse_value(where, value, advice)
    for where, name in _names(spec):
        credential_check.refuse_name(where, name)


def _spec_fields(spec: JobSpec) -> Iterator[tuple[str, object, str]]:
    yield "the script", spec.script, credential_check.KEY_VAULT
    args = [str(a) for a in spec.script_args]
    for name, arg in zip(argument_names(args), args, strict=True):
        yield f"the script's argument {name}", arg, credential_check.KEY_VAULT
    for key, value in credential_check.items(spec.env):
        yield f"--env {credential_check.shown(key)}", f"{key}={value}", credential_check.KEY_VAULT
    for item in spec.inputs:
        yield f"--input {credential_check.shown(item.name)}", item.uri, credential_check.DATA_ASSET
    for out in spec.outputs:
        yield f"--output {credential_check.shown(out.name)}", out.uri or "", credential_check.DATASTORE_PATH
    for key, value in credential_check.items(spec.tags):
        yield f"--tag {credential_check.shown(key)}", f"{key}={value}", credential_check.KEY_VAULT
    options: list[tuple[str, str | None]] = [
        ("--compute", spec.compute), ("--code", spec.code_dir), ("--image", spec.image),
        ("--environment", spec.environment), ("--experiment", spec.experiment),
        ("--display-name", spec.display_name), ("--name", spec.name), ("--description", spec.description),
        ("--shm-size", spec.shm_size), ("--docker-args", spec.docker_args),
        ("--resume-from", spec.resume_from)]
    if spec.sweep is not None:
        options += [("--space", spec.sweep.space), ("--metric", spec.sweep.metric)]
    for option, text in options:
        yield option, text or "", credential_check.KEY_VAULT


def _names(spec: JobSpec) -> Iterator[tuple[str, str]]:
    """What is given as NAME=VALUE, by name: variables, tags and the script's --set fields."""
    for key, _ in credential_check.items(spec.env):
        yield f"--env {key}", key
    for key, _ in credential_check.items(spec.tags):
        yield f"--tag {key}", key
    for name in argument_names([str(a) for a in spec.script_args]):
        if name.startswith("--set "):
            yield f"the script's argument {name}", name.removeprefix("--set ")


# --- parsing the CLI's strings --------------------------------------------------------------------------
def parse_key_value(text: str, option: str) -> tuple[str, str]:
    """`KEY=VALUE` (the value may be empty or hold more `=`)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise JobSpecError(f"{option} expects KEY=VALUE, got {text!r}")
    return key, value


def parse_input(text: str) -> InputSpec:
    """`NAME=[TYPE:]URI[:MODE]`, e.g. `data=azureml:digits@latest`, `data=azureml:digits:3:download`,
    `weights=uri_file:azureml://datastores/ws/paths/w.pt`; parsed strictly (data_inputs.py says what Azure
    ML takes). The type is uri_folder and the mode ro_mount unless given."""
    name, value = parse_key_value(text, "--input")
    spec = data_inputs.parse_input_value(name, value)
    _check_input(spec)
    return spec


def parse_output(text: str) -> OutputSpec:
    """`NAME`, `NAME:MODE` or `NAME=[TYPE:]URI[:MODE]`, e.g. `ckpt`, `ckpt:upload`,
    `ckpt=azureml://datastores/workspaceblobstore/paths/runs/digits/`; parsed strictly (data_inputs.py says
    what Azure ML takes). The type is uri_folder and the mode rw_mount unless given; without a URI, Azure ML
    picks a place in the workspace's default datastore."""
    spec = data_inputs.parse_output_value(text)
    _check_output(spec)
    return spec


def parse_mapping(items: Sequence[str], option: str) -> dict[str, str]:
    """`KEY=VALUE` items of a repeatable option (`--env`, `--tag`) as a dict; a bad item names `option`."""
    return dict(parse_key_value(item, option) for item in items)


# --- validation and resolution ----------------------------------------------------------------------------
def resolve(spec: JobSpec, *, vm_size: str | None = None, cwd: Path | None = None,
            snapshot: CodeSnapshot | None = None, resume: ResumeSource | None = None) -> ResolvedJob:
    """Validate `spec` and work out the job: raises JobSpecError with one line naming what to change.
    `vm_size` is the compute's size as Azure reports it, when known (else `spec.vm_size`); `snapshot` a
    scan of the same code directory made earlier (a second resolve need not walk it again); `resume` the
    wiring of `spec.resume_from` as the job was looked up (else assumed, as a dry run does)."""
    cwd = Path.cwd() if cwd is None else cwd
    check_credentials(spec)  # first: later checks name values in their messages
    spec, resume = _with_resume(spec, resume)
    vm_size = vm_size or spec.vm_size
    nodes = check_count(spec.nodes, "--nodes")
    compute = check_compute_name(spec.compute, "--compute")
    if compute == SERVERLESS and not vm_size:
        raise JobSpecError("--compute serverless needs --vm-size, the VM each node is (e.g. "
                           "Standard_NC24ads_A100_v4): Azure ML would pick a CPU VM")
    processes = _processes_per_node(spec.processes_per_node, vm_size)
    code_dir, script = _code_and_script(spec, cwd)
    if snapshot is None or snapshot.code_dir != code_dir:
        snapshot = scan(code_dir)
    if not snapshot.contains(script):
        raise JobSpecError(f"script {script} is excluded by {code_dir / str(snapshot.ignore_file)}: "
                           "it would not be uploaded")
    for item in spec.inputs:
        _check_input(item)
    inputs, outputs = tuple(_local_input(item, cwd) for item in spec.inputs), tuple(spec.outputs)
    for out in outputs:
        _check_output(out)
    _unique([i.name for i in inputs], "--input")
    _unique([o.name for o in outputs], "--output")
    args = tuple(str(a) for a in spec.script_args)
    _check_placeholders(args, inputs, outputs)
    config = check_train_config_args(args, code_dir)
    # Azure ML starts mpirun itself: waiting ranks yield their core through the environment, as
    # `hvdazure run --mpi` does on its command line (hvdazure/launch/command.py, MPI_YIELD_WHEN_IDLE)
    yield_when_idle = {f"OMPI_MCA_{k}": v for k, v in MPI_YIELD_WHEN_IDLE.items()}
    env = {**yield_when_idle, **vm_sizes.nccl_environment(vm_size), **_check_env(spec.env)}
    experiment = spec.experiment or _experiment_name(code_dir)
    if not _EXPERIMENT.match(experiment):
        raise JobSpecError(f"--experiment {experiment!r}: letters, digits, '_' and '-' only, starting with a "
                           "letter or digit")
    shm = shm_size(spec.shm_size)
    tags = {str(k): str(v) for k, v in spec.tags.items()}
    warnings = [w for w in (snapshot.size_warning(), _more_processes_than_gpus(processes, vm_size),
                            *_unreferenced(args, inputs, outputs)) if w]
    job = ResolvedJob(
        code_dir=code_dir, script=script, script_args=args, compute=compute, nodes=nodes,
        processes_per_node=processes, environment=_environment(spec, cwd), env=env, inputs=inputs,
        outputs=outputs, experiment=experiment, display_name=spec.display_name or f"{Path(script).name} "
        f"{nodes}x{processes}", tags=tags, shm_size=shm, docker_args=spec.docker_args or None,
        vm_size=vm_size, snapshot=snapshot, warnings=tuple(warnings),
        name=job_settings.check_job_name(spec.name), description=spec.description or None,
        max_duration=job_settings.check_duration(spec.max_duration, "--max-duration"),
        queue=job_settings.queue_settings(spec.job_tier, spec.priority, compute), resume=resume)
    job = with_identity(job, spec.identity)
    if spec.sweep is None:
        return job
    return sweep_spec.apply(spec.sweep, job, config=config, cwd=cwd)


def _with_resume(spec: JobSpec, resume: ResumeSource | None) -> tuple[JobSpec, ResumeSource | None]:
    """`spec` with the wiring of its --resume-from (resume_from.py) added: the input that reads the job's
    checkpoints and the script's `--set resume=auto --set resume_from=...`; as it is without --resume-from."""
    if spec.resume_from is None:
        return spec, None
    name = str(job_settings.check_job_name(spec.resume_from, "--resume-from"))
    resume_from.check_new_job(name, spec.script_args, [i.name for i in spec.inputs], spec.sweep is not None)
    resume = resume or resume_from.assumed(name, spec.script_args)
    inputs = [*spec.inputs, *([resume.input] if resume.input else [])]
    args = [*spec.script_args, *resume_from.resume_arguments(resume)]
    return dataclasses.replace(spec, inputs=inputs, script_args=args), resume


def check_train_config_args(script_args: Sequence[str], code_dir: Path) -> TrainConfig | None:
    """Parse the script's `--config FILE` and `--set FIELD=VALUE` arguments with TrainConfig's own parser,
    as the job will on every rank, so a typo fails here instead of after the upload and the queue. Other
    arguments are the script's own and are left alone. Placeholders stand for paths, and the config file
    is read from the code directory, where the job starts. TrainConfig's defaults are used: a script that
    passes its own defaults to `from_cli` is checked against TrainConfig's. Returns the config so parsed, or
    None when the arguments have neither option."""
    from hvdazure.core.config import ConfigError, TrainConfig

    argv: list[str] = []
    items = list(script_args)
    for index, arg in enumerate(items):
        for option in ("--set", "--config"):
            if arg == option and index + 1 < len(items):
                value = items[index + 1]
            elif arg.startswith(option + "="):
                value = arg[len(option) + 1:]
            else:
                continue
            value = _PLACEHOLDER.sub(lambda m: "/mnt/azureml/" + m.group(1).replace(".", "/"), value)
            if option == "--config":
                value = str(code_dir / value)
            argv += [option, value]
    if not argv:
        return None
    try:
        return TrainConfig._from_cli(argv, {})  # the job's own parsing, minus its exit(2)
    except ConfigError as exc:
        raise JobSpecError(f"the script's arguments: {exc}") from None


def shm_size(size: str | None) -> str | None:
    """`--shm-size` as Azure ML's docs spell it (`16g`): a whole number above 0 and a unit Docker knows, b,
    k, m or g. Docker reads the unit in either case (`16G` is `16g`), and a bare number as bytes, so `16`
    would be a 16-byte /dev/shm: refused."""
    if size is None:
        return None
    text = str(size)
    if text.isdigit():
        raise JobSpecError(f"--shm-size {text!r}: give a unit, such as 16g: Docker reads a bare number as "
                           "bytes")
    if not _SHM_SIZE.match(text):
        raise JobSpecError(f"--shm-size {text!r}: a whole number and a unit, b, k, m or g, such as 16g or "
                           "512m")
    return text.lower()


is_local_path = data_inputs.is_local_path


def environment_version(image: str, conda_text: str | None) -> str:
    """A version that changes exactly when the environment's content does: the image's tag (readable) and
    a hash of the image reference and conda file."""
    digest = hashlib.sha256(f"{image}\n{conda_text or ''}".encode()).hexdigest()[:12]
    tag = image.rsplit("/", 1)[-1].partition("@")[0].partition(":")[2]
    tag = re.sub(r"[^A-Za-z0-9_.\-]", "-", tag)[:16].strip(".-")
    return f"{tag}-{digest}" if tag else digest


def _processes_per_node(value: int | None, vm_size: str | None) -> int:
    if value is not None:
        return check_count(value, "--processes-per-node")
    size = vm_sizes.lookup(vm_size)
    if size is not None:
        return size.gpus
    known = f"VM size {vm_size} is not in hvdazure's table" if vm_size else "the compute's VM size is unknown"
    raise JobSpecError(f"--processes-per-node is required: {known} (one process per GPU is usual; sizes "
                       f"known: {', '.join(vm_sizes.known_sizes())})")


def _more_processes_than_gpus(processes: int, vm_size: str | None) -> str | None:
    """A warning when the ranks of a node would share its GPUs (a CPU rank per core is the user's choice,
    so not an error)."""
    size = vm_sizes.lookup(vm_size)
    if size is None or processes <= size.gpus:
        return None
    return (f"--processes-per-node {processes} is more than the {size.gpus} GPU(s) of a {size.name} node: "
            "ranks would share GPUs (one process per GPU is usual)")


def _code_and_script(spec: JobSpec, cwd: Path) -> tuple[Path, str]:
    """The code directory, and the script as the job runs it (`python SCRIPT` from the code directory's top):
    SCRIPT is a path in the code directory, or, failing that, from the current directory into it
    (`hvdazure submit src/train.py --code src`, as a shell completes it)."""
    code_dir = (cwd / (spec.code_dir or ".")).resolve()
    if not code_dir.is_dir():
        raise JobSpecError(f"code directory not found: {spec.code_dir}")
    if not spec.script:
        raise JobSpecError("no script given: hvdazure submit train.py ...")
    places = [code_dir] if code_dir == cwd.resolve() else [code_dir, cwd]
    found = [place / spec.script for place in places if (place / spec.script).is_file()]
    script_path = found[0].resolve() if found else None
    if script_path is None:
        raise JobSpecError(f"script not found: {spec.script} (no such file in "
                           f"{' or '.join(str(place) for place in places)})")
    try:
        script = script_path.relative_to(code_dir).as_posix()
    except ValueError:
        raise JobSpecError(f"script {spec.script} is outside the code directory {code_dir}: only the code "
                           f"directory is uploaded (pass --code {script_path.parent})") from None
    return code_dir, script


def _environment(spec: JobSpec, cwd: Path) -> JobEnvironment:
    if spec.environment and (spec.image or spec.conda_file):
        raise JobSpecError("--environment names a registered environment: give it alone, or --image "
                           "(with --conda-file), not both")
    if spec.environment:
        return registered_environment(spec.environment)
    if not spec.image:
        raise JobSpecError("no environment: give --image REGISTRY/IMAGE:TAG (docs/guides/docker.md builds "
                           "hvdazure-torch-gpu) or --environment azureml:NAME@latest")
    if any(c.isspace() for c in spec.image) or "://" in spec.image:
        raise JobSpecError(f"--image {spec.image!r}: expected REGISTRY/REPOSITORY[:TAG|@DIGEST]")
    conda_file, conda_text = None, None
    if spec.conda_file:
        conda_file = (cwd / spec.conda_file).resolve()
        if not conda_file.is_file():
            raise JobSpecError(f"conda file not found: {spec.conda_file}")
        conda_text = conda_file.read_text()
    repository = spec.image.rsplit("/", 1)[-1].partition("@")[0].partition(":")[0]
    name = re.sub(r"[^A-Za-z0-9_.\-]", "-", repository).strip(".-_") or "hvdazure"
    return JobEnvironment(name=name, version=environment_version(spec.image, conda_text), image=spec.image,
                           conda_file=conda_file)


def registered_environment(text: str) -> JobEnvironment:
    """`--environment`: one of the workspace (`azureml:NAME@latest`, `azureml:NAME:VERSION`) or of a registry
    (`azureml://registries/REGISTRY/environments/NAME/labels/latest` or `.../versions/VERSION`, the form of
    Azure ML's curated environments, which the job references as it is)."""
    if text.startswith("azureml://"):
        match = _REGISTRY_ENV.match(text)
        if not match:
            raise JobSpecError(f"--environment {text!r}: expected azureml://registries/REGISTRY/environments/"
                               "NAME/labels/latest or .../versions/VERSION")
        registry, name, which, value = match.groups()
        if which == "labels" and value != "latest":
            raise JobSpecError(f"--environment {text!r}: label {value!r}: a registry environment is named by "
                               "labels/latest or versions/VERSION")
        return JobEnvironment(name=name, version=value if which == "versions" else None, registered=True,
                              registry=registry)
    match = _REGISTERED_ENV.match(text.removeprefix("azureml:"))
    if not match:
        raise JobSpecError(f"--environment {text!r}: expected azureml:NAME@latest or azureml:NAME:VERSION "
                           "(or azureml://registries/REGISTRY/environments/NAME/labels/latest)")
    name, which = match.groups()
    return JobEnvironment(name=name, version=None if which == "@latest" else which[1:], registered=True)


def _check_input(spec: InputSpec) -> None:
    if not _NAME.match(spec.name):
        raise JobSpecError(f"--input name {spec.name!r}: letters, digits and '_', not starting with a digit")
    data_inputs.check_input(spec)
    credential_check.refuse_value(f"--input {spec.name}", spec.uri, credential_check.DATA_ASSET)


def _local_input(spec: InputSpec, cwd: Path) -> InputSpec:
    """An input with its local path made absolute (from `cwd`, like the CLI option), which azure-ai-ml
    uploads as it is; other inputs as they are. The path must exist and be of the input's type: azure-ai-ml
    would refuse it only once submitting."""
    if not is_local_path(spec.uri):
        return spec
    path = (cwd / spec.uri).resolve()
    if not path.exists():
        raise JobSpecError(f"--input {spec.name}: {spec.uri} does not exist (a local path is uploaded)")
    if spec.type == "uri_folder" and not path.is_dir():
        raise JobSpecError(f"--input {spec.name}: {spec.uri} is a file, and a uri_folder input a directory: "
                           f"give --input {spec.name}=uri_file:{spec.uri}")
    if spec.type == "uri_file" and not path.is_file():
        raise JobSpecError(f"--input {spec.name}: {spec.uri} is a directory, and a uri_file input a file")
    return dataclasses.replace(spec, uri=str(path))


def _check_output(spec: OutputSpec) -> None:
    if not _NAME.match(spec.name):
        raise JobSpecError(f"--output name {spec.name!r}: letters, digits and '_', not starting with a digit")
    credential_check.refuse_value(f"--output {spec.name}", spec.uri or "", credential_check.DATASTORE_PATH)
    data_inputs.check_output(spec)


def _check_env(env: Mapping[str, str]) -> dict[str, str]:
    checked = {}
    for name, value in env.items():
        if not _NAME.match(str(name)):
            raise JobSpecError(f"--env {name!r}: not a valid environment variable name")
        checked[str(name)] = str(value)  # credentials were refused by check_credentials
    return checked


def _check_placeholders(args: Sequence[str], inputs: Sequence[InputSpec],
                        outputs: Sequence[OutputSpec]) -> None:
    declared = {f"inputs.{i.name}" for i in inputs} | {f"outputs.{o.name}" for o in outputs}
    for arg in args:
        for reference in _PLACEHOLDER.findall(arg):
            if reference not in declared:
                hint = ("declare it with --input/--output" if reference.startswith(("inputs.", "outputs."))
                        else "only ${{inputs.NAME}} and ${{outputs.NAME}} are substituted")
                raise JobSpecError(f"the script's arguments use ${{{{{reference}}}}}, which the job does not "
                                   f"define: {hint}")


def _unreferenced(args: Sequence[str], inputs: Sequence[InputSpec],
                  outputs: Sequence[OutputSpec]) -> list[str]:
    used = {ref for arg in args for ref in _PLACEHOLDER.findall(arg)}
    return [f"--{kind[:-1]} {name} is not referenced in the script's arguments, so the script is not told "
            f"its path: pass it, e.g. -- --set extra.{name}='${{{{{kind}.{name}}}}}'"
            for kind, names in (("inputs", [i.name for i in inputs]), ("outputs", [o.name for o in outputs]))
            for name in names if f"{kind}.{name}" not in used]


def _unique(names: list[str], option: str) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise JobSpecError(f"{option} {name} is given twice")
        seen.add(name)


def _experiment_name(code_dir: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9_\-]", "-", code_dir.name).strip("-_")
    return name or "hvdazure"
