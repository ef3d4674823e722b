"""No credential goes into a job: every field of `hvdazure submit` that Azure ML stores in the job (the
command and the script's arguments, tags, names, environment variables, inputs, outputs, Docker arguments,
the image, the sweep's metric and search space) is checked with the one rule of errors.py, before any other
check could echo it, and whichever SDK sends the job. A job that would carry one is refused in one line
naming the field and the kind of credential, never the value. This module holds the refusals;
spec.job.check_credentials walks a JobSpec's fields through them.

A value is a credential when it holds a SAS signature, a bearer token, a JWT, a storage key or a password
(errors.credential_in); a name, when it says so (errors.named_like_credential: HF_TOKEN, WANDB_API_KEY),
for what is given as NAME=VALUE: `--env`, `--tag` and the script's `--set FIELD=VALUE`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from hvdazure.azure.errors import JobSpecError, credential_in, named_like_credential

if TYPE_CHECKING:
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


def check_search_space(space: SearchSpace) -> None:
    """A sweep's search space: every value of every parameter (a choice of URLs, say)."""
    for p in space.parameters:
        for value in _values(p.args):
            refuse_value(f"search space parameter {p.name}", value)


def items(mapping: Mapping[Any, Any]) -> Iterable[tuple[str, str]]:
    return [(str(k), str(v)) for k, v in mapping.items()]


def shown(name: str) -> str:
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
