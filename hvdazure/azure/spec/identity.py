"""`--identity`: the identity a job runs as, and so the one that reaches storage and other Azure services
from inside it, instead of a credential written into the job. No Azure SDK here.

- `user`: Azure ML's user identity (`identity: {type: user_identity}`; SDK v1: credential passthrough).
  Azure ML mounts and downloads the job's inputs and outputs as the submitting user. Code inside the job
  reaches it only through azure-ai-ml's AzureMLOnBehalfOfCredential: DefaultAzureCredential, which the data
  and checkpoint layer uses for `abfs://` (adlfs), does not, and finds the compute's managed identity if any.
- `managed`: the compute's managed identity (`identity: {type: managed}`), for mounts and for
  DefaultAzureCredential in the job (azure-identity's ManagedIdentityCredential through Azure ML's
  MSI_ENDPOINT): the system-assigned one.
- `managed:CLIENT_ID`: one of the compute's user-assigned identities (`client_id`). The job also gets
  `AZURE_CLIENT_ID=CLIENT_ID`, which is how DefaultAzureCredential picks a user-assigned identity, so
  `abfs://` reads and checkpoints inside the job use that identity too. A client id is not a secret.

Without `--identity`, Azure ML's default: an AML token for the workspace, and the datastore's own
credentials for inputs and outputs.
"""

from __future__ import annotations

import dataclasses
import re

from hvdazure.azure.errors import JobSpecError
from hvdazure.azure.resolved_job import JobIdentity, ResolvedJob

CLIENT_ID_VARIABLE = "AZURE_CLIENT_ID"  # azure-identity's DefaultAzureCredential reads it
_GUID = re.compile(r"^[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")


def parse_identity(text: str | None) -> JobIdentity | None:
    """`user`, `managed` or `managed:CLIENT_ID` as a JobIdentity (None: Azure ML's default)."""
    if text is None:
        return None
    kind, sep, client_id = str(text).partition(":")
    if kind == "user" and not sep:
        return JobIdentity("user")
    if kind == "managed" and not sep:
        return JobIdentity("managed")
    if kind == "managed" and _GUID.match(client_id):
        return JobIdentity("managed", client_id=client_id.lower())
    if kind == "managed":
        raise JobSpecError(f"--identity {text!r}: the client id of a user-assigned managed identity is a "
                           "GUID (az identity show --query clientId)")
    raise JobSpecError(f"--identity {text!r}: expected user, managed or managed:CLIENT_ID")


def with_identity(job: ResolvedJob, text: str | None) -> ResolvedJob:
    """`job` running as the identity `text` names, a user-assigned one also as AZURE_CLIENT_ID in its
    environment (a different AZURE_CLIENT_ID from --env is refused)."""
    identity = parse_identity(text)
    if identity is None:
        return job
    env = dict(job.env)
    if identity.client_id is not None:
        given = env.get(CLIENT_ID_VARIABLE)
        if given is not None and given.lower() != identity.client_id:
            raise JobSpecError(f"--env {CLIENT_ID_VARIABLE}={given} and --identity {text} name different "
                               "identities: give the client id once, with --identity")
        env[CLIENT_ID_VARIABLE] = identity.client_id
    return dataclasses.replace(job, identity=identity, env=env)
