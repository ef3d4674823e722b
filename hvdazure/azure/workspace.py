"""Which Azure ML workspace to talk to, and with which credential.

A workspace is named by its three ids, given explicitly or read from the `config.json` that the workspace's
portal page downloads (searched for like the SDKs do: in the current directory, its `.azureml/`, and their
parents). Both SDKs then get the ids, so v1 and v2 submissions find the same workspace.

The credential is azure-identity's `DefaultAzureCredential` (environment variables, workload or managed
identity, the Azure CLI's `az login`, ...). It is asked for a token once before anything is uploaded, so a
missing login is one line at the start rather than a stack trace after the upload; the token itself is
never printed or stored. The line names what failed: no credential at all, a sign-in service that could
not be reached (a credential that was tried, such as the service principal of AZURE_CLIENT_ID, ...), or a
credential the service refused. DefaultAzureCredential keeps no exception of the credentials it tried, only
their lines in its message (`\tEnvironmentCredential: Authentication failed: ...`), which are read here.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvdazure.azure.errors import SubmitError, redact, redacted_line

ARM_SCOPE = "https://management.azure.com/.default"
_CONFIG_NAMES = ("config.json", ".azureml/config.json")


@dataclass(frozen=True)
class WorkspaceRef:
    """An Azure ML workspace by its ids. Build it with `from_options` (what the CLI takes)."""

    subscription_id: str
    resource_group: str
    workspace_name: str

    @classmethod
    def from_options(cls, config: str | None = None, subscription_id: str | None = None,
                     resource_group: str | None = None, workspace_name: str | None = None,
                     cwd: Path | None = None) -> WorkspaceRef:
        """Explicit ids (all three), or a config.json (given, or found from `cwd` upwards)."""
        explicit = [subscription_id, resource_group, workspace_name]
        if any(explicit):
            if config:
                raise SubmitError("give --workspace-config or --subscription/--resource-group/--workspace, "
                                  "not both")
            missing = [flag for flag, value in zip(("--subscription", "--resource-group", "--workspace"),
                                                   explicit, strict=True) if not value]
            if missing:
                raise SubmitError(f"the workspace is named by three ids: {', '.join(missing)} missing")
            return cls(str(subscription_id), str(resource_group), str(workspace_name))
        path = Path(config) if config else find_config(cwd or Path.cwd())
        if path is None:
            raise SubmitError("no Azure ML workspace given: pass --workspace-config config.json (the "
                              "workspace's portal page downloads it) or --subscription, --resource-group and "
                              "--workspace, or put config.json in this directory or .azureml/")
        return cls.from_config_file(path)

    @classmethod
    def from_config_file(cls, path: str | Path) -> WorkspaceRef:
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise SubmitError(f"workspace config not found: {path}") from None
        except (OSError, ValueError) as exc:
            raise SubmitError(f"workspace config {path} is not readable JSON: {redacted_line(exc)}") from None
        if not isinstance(data, dict):
            raise SubmitError(f"workspace config {path}: expected a JSON object")
        # the portal writes subscription_id / resource_group / workspace_name; older files say "Scope"
        ids = [data.get("subscription_id"), data.get("resource_group"), data.get("workspace_name")]
        if not all(ids) and isinstance(data.get("Scope"), str):
            parts = data["Scope"].strip("/").split("/")
            ids = [_after(parts, key) for key in ("subscriptions", "resourceGroups", "workspaces")]
        missing = [key for key, value in zip(("subscription_id", "resource_group", "workspace_name"), ids,
                                             strict=True) if not (isinstance(value, str) and value)]
        if missing:
            raise SubmitError(f"workspace config {path} lacks {', '.join(missing)} (the workspace's portal "
                              "page downloads a complete one)")
        subscription_id, resource_group, workspace_name = (str(i) for i in ids)
        return cls(subscription_id, resource_group, workspace_name)

    @property
    def arm_id(self) -> str:
        return (f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}/providers/"
                f"Microsoft.MachineLearningServices/workspaces/{self.workspace_name}")


def find_config(start: Path) -> Path | None:
    """config.json or .azureml/config.json in `start` or the nearest parent that has one."""
    for directory in [start, *start.parents]:
        for name in _CONFIG_NAMES:
            if (directory / name).is_file():
                return directory / name
    return None


# the credentials DefaultAzureCredential tries, in the user's words, and what to do when one is refused
_ENVIRONMENT = "AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET"
_CREDENTIALS = {
    "EnvironmentCredential": (f"the service principal of {_ENVIRONMENT}",
                              f"check {_ENVIRONMENT}, or unset them to use `az login`"),
    "ClientSecretCredential": ("the service principal", "check its tenant, client id and secret"),
    "WorkloadIdentityCredential": ("the workload identity of AZURE_FEDERATED_TOKEN_FILE",
                                   "check the identity's federated credential"),
    "ManagedIdentityCredential": ("the managed identity", "check that it is assigned to this machine"),
    "AzureCliCredential": ("the Azure CLI's login", "run `az login` again"),
    "AzurePowerShellCredential": ("Azure PowerShell's login", "run Connect-AzAccount again"),
    "AzureDeveloperCliCredential": ("the Azure Developer CLI's login", "run `azd auth login` again"),
    "SharedTokenCacheCredential": ("the shared token cache", "run `az login` again"),
}
_ATTEMPT = re.compile(r"^\s*(\w+Credential): (.+)$", re.M)
_UNREACHABLE = re.compile(r"Failed to establish a new connection|Failed to resolve|Name or service not known|"
                          r"Temporary failure in name resolution|Connection (?:refused|reset|aborted)|"
                          r"timed out|Max retries exceeded|No route to host|Network is unreachable|"
                          r"SSLError|CERTIFICATE_VERIFY_FAILED|ServiceRequestError", re.I)
_REFUSED = re.compile(r"AADSTS\d+|invalid_client|unauthorized_client|invalid_grant|Authentication failed",
                      re.I)
_HOST = re.compile(r"host='([^']+)', port=(\d+)")
NO_CREDENTIALS = ("no Azure credentials: run `az login`, or set AZURE_CLIENT_ID, AZURE_TENANT_ID and "
                  "AZURE_CLIENT_SECRET, or use a managed identity")


def default_credential(**options: Any) -> Any:
    """DefaultAzureCredential, without the interactive browser (a submission may run where none opens).
    `options` go to DefaultAzureCredential (tests point it at a local sign-in service)."""
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential(exclude_interactive_browser_credential=True, **options)


def check_credential(credential: Any) -> None:
    """Ask `credential` for an ARM token now: a failure is one line before any upload, naming what failed
    (the exception stays the cause, which the CLI's -v shows)."""
    from azure.core.exceptions import AzureError

    # DefaultAzureCredential also logs every credential it tried (20 lines); the error below says what to do
    identity_logger = logging.getLogger("azure.identity")
    level = identity_logger.level
    identity_logger.setLevel(logging.CRITICAL)
    try:
        credential.get_token(ARM_SCOPE)
    except AzureError as exc:  # ClientAuthenticationError, or a bare credential's ServiceRequestError
        raise SubmitError(credential_failure(exc, type(credential).__name__)) from exc
    finally:
        identity_logger.setLevel(level)


def credential_failure(exc: BaseException, credential: str) -> str:
    """One line for a credential that gave no token: the sign-in service could not be reached, it refused
    the credential, or there was no credential to try. `credential`: the credential's class name, for an
    error that is its own rather than DefaultAzureCredential's list of attempts."""
    text = redact(str(exc))
    attempts = _ATTEMPT.findall(text) or [(credential, f"{type(exc).__name__}: {text}")]
    for name, detail in attempts:
        if "authentication unavailable" in detail:  # not set up here, which says nothing of the network
            continue
        who, fix = _CREDENTIALS.get(name, (name, "check it"))
        detail = detail.removeprefix("Authentication failed: ").strip()
        if _UNREACHABLE.search(detail) or type(exc).__name__ == "ServiceRequestError":
            host = _HOST.search(detail)
            where = f" at {host[1]}:{host[2]}" if host else ""
            return (f"Azure sign-in failed: {who} could not reach the sign-in service{where} "
                    f"({_short(detail)}): check the network, a proxy, or AZURE_AUTHORITY_HOST")
        if _REFUSED.search(detail):
            return f"Azure sign-in failed: {who} was refused ({_short(detail)}): {fix}"
    return f"{NO_CREDENTIALS} ({_short(text)})"


def _short(detail: str) -> str:
    """The part of an SDK's error a person reads: its first sentence, at most 200 characters."""
    first = next((line.strip() for line in detail.splitlines() if line.strip()), "")
    reason = re.search(r"\[Errno -?\d+\] ([^')\]]+)|(AADSTS\d+: [^.]*\.)", first)
    text = next((group for group in reason.groups() if group), first) if reason else first
    return text[:200].rstrip()


def _after(parts: list[str], key: str) -> str | None:
    lowered = [p.lower() for p in parts]
    index = lowered.index(key.lower()) if key.lower() in lowered else -1
    return parts[index + 1] if 0 <= index < len(parts) - 1 else None
