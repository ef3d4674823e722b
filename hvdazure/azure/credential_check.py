"""No credential goes into a job: every field of `hvdazure submit` that Azure ML stores in the job (the
command and the script's arguments, tags, names, environment variables, inputs, outputs, Docker arguments,
the image, the sweep's metric and search space) is checked with the one rule of errors.py, before any other
check could echo it, and whichever SDK sends the job. A job that would carry one is refused in one line
naming the field and the kind of credential, never the value.

A value is a credential when it holds a SAS signature, a bearer token, a JWT, a storage key or a password
(errors.credential_in); a name, when it says so (errors.named_like_credential: HF_TOKEN, WANDB_API_KEY),
for what is given as NAME=VALUE: `--env`, `--tag` and the script's `--set FIELD=VALUE`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from hvdazure.azure.errors import JobSpecError, credential_in, named_like_credential
from hvdazure.azure.script_args import argument_names

if TYPE_CHECKING:
    from hvdazure.azure.job_spec import JobSpec
    from hvdazure.sweep.space import SearchSpace

KEY_VAULT = "give the job an identity or read it from Key Vault"
DATA_ASSET = "register a datastore or data asset and use azureml:..."
DATASTORE_PATH = "use a datastore path, azureml://datastores/NAME/paths/..."


def refuse_value(field: str, value: object, advice: str = KEY_VAULT) -> None:
    """Raise JobSpecError naming `field` when `value` holds a credential."""
    what = credential_in(str(value))
    if what is not None:
        raise JobSpecError(f"{field}: looks like a credential ({what}), which the job would store in plain "
                           f"text: {advice}")


def refuse_name(field: str, name: str) -> None:
    """Raise JobSpecError naming `field` when `name` says that its value is a credential."""
    if named_like_credential(name):
        raise JobSpecError(f"{field}: looks like a credential (by its name), which the job would store in "
                           f"plain text: {KEY_VAULT}")


def check_spec(spec: JobSpec) -> None:
    """Every field of `spec` that goes into the job, in the order of the CLI's options."""
    for field, value, advice in _spec_fields(spec):
        refuse_value(field, value, advice)
    for field, name in _names(spec):
        refuse_name(field, name)


def check_search_space(space: SearchSpace) -> None:
    """A sweep's search space: every value of every parameter (a choice of URLs, say)."""
    for p in space.parameters:
        for value in _values(p.args):
            refuse_value(f"search space parameter {p.name}", value)


def _spec_fields(spec: JobSpec) -> Iterator[tuple[str, object, str]]:
    yield "the script", spec.script, KEY_VAULT
    args = [str(a) for a in spec.script_args]
    for name, arg in zip(argument_names(args), args, strict=True):
        yield f"the script's argument {name}", arg, KEY_VAULT
    for key, value in _items(spec.env):
        yield f"--env {_shown(key)}", f"{key}={value}", KEY_VAULT
    for item in spec.inputs:
        yield f"--input {_shown(item.name)}", item.uri, DATA_ASSET
    for out in spec.outputs:
        yield f"--output {_shown(out.name)}", out.uri or "", DATASTORE_PATH
    for key, value in _items(spec.tags):
        yield f"--tag {_shown(key)}", f"{key}={value}", KEY_VAULT
    options: list[tuple[str, str | None]] = [
        ("--compute", spec.compute), ("--code", spec.code_dir), ("--image", spec.image),
        ("--environment", spec.environment), ("--experiment", spec.experiment),
        ("--display-name", spec.display_name), ("--shm-size", spec.shm_size),
        ("--docker-args", spec.docker_args)]
    if spec.sweep is not None:
        options += [("--space", spec.sweep.space), ("--metric", spec.sweep.metric)]
    for option, text in options:
        yield option, text or "", KEY_VAULT


def _names(spec: JobSpec) -> Iterator[tuple[str, str]]:
    """What is given as NAME=VALUE, by name: variables, tags and the script's --set fields."""
    for key, _ in _items(spec.env):
        yield f"--env {key}", key
    for key, _ in _items(spec.tags):
        yield f"--tag {key}", key
    for name in argument_names([str(a) for a in spec.script_args]):
        if name.startswith("--set "):
            yield f"the script's argument {name}", name.removeprefix("--set ")


def _items(mapping: Mapping[Any, Any]) -> Iterable[tuple[str, str]]:
    return [(str(k), str(v)) for k, v in mapping.items()]


def _shown(name: str) -> str:
    """A name as a refusal shows it: not at all when it is the credential."""
    return "(its name)" if credential_in(name) else name


def _values(value: object) -> Iterator[object]:
    if isinstance(value, Mapping):
        for item in value.values():
            yield from _values(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _values(item)
    else:
        yield value
