"""The sign-in before a submission, at the HTTP boundary: DefaultAzureCredential, configured from the
environment as a user configures it (AZURE_CLIENT_ID, AZURE_TENANT_ID, AZURE_CLIENT_SECRET), asks a local
fake sign-in service on 127.0.0.1 (AZURE_AUTHORITY_HOST, over HTTPS with a certificate made for the test),
or a port on 127.0.0.1 where nothing listens. What failed is one line: the service could not be reached,
or it refused the credential; `-v` shows the cause. Nothing here leaves this machine: instance discovery
(which would ask login.microsoftonline.com about the unknown authority) and the credentials that probe the
network (managed and workload identity) are turned off, and retries too, so each case takes milliseconds."""

from __future__ import annotations

import datetime
import functools
import ipaddress
import json
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hvdazure.azure import workspace
from hvdazure.azure.errors import SubmitError
from hvdazure.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
IMAGE = "myacr.azurecr.io/hvdazure-gpu:0.1.0"
SECRET = "not-a-real-client-secret"
TENANT = "00000000-0000-0000-0000-000000000002"
REFUSAL = ("AADSTS7000215: Invalid client secret provided. Ensure the secret being sent in the request is "
           "the client secret value, not the client secret ID. Trace ID: 0000")
ATTEMPTED = ("DefaultAzureCredential failed to retrieve a token from the included credentials.\n"
             "Attempted credentials:\n")
WORKSPACE = ["--subscription", "sub-id", "--resource-group", "rg", "--workspace", "ws"]


def _certificate(directory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1, and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(1).not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "sign-in.pem", directory / "sign-in.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file)


class _SignIn(BaseHTTPRequestHandler):
    """Microsoft Entra ID's two endpoints a client secret's sign-in uses: the tenant's OpenID configuration,
    and the token endpoint, which refuses the secret as Entra ID does (401, invalid_client)."""

    def log_message(self, *args) -> None:
        self.server.requests.append((self.command, self.path))

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        base = f"https://127.0.0.1:{self.server.server_port}/{TENANT}"
        self._reply(200, {"token_endpoint": f"{base}/oauth2/v2.0/token", "issuer": f"{base}/v2.0",
                          "authorization_endpoint": f"{base}/oauth2/v2.0/authorize"})

    def do_POST(self) -> None:
        self.server.secrets.append(SECRET in self.rfile.read(int(self.headers["Content-Length"])).decode())
        self._reply(401, {"error": "invalid_client", "error_description": REFUSAL, "error_codes": [7000215]})


@pytest.fixture
def signed_in_from_the_environment(monkeypatch, tmp_path):
    """The environment of a user with a service principal; returns a function that points the sign-in at a
    host. Submissions build their DefaultAzureCredential as always, kept on this machine."""
    monkeypatch.setenv("AZURE_CLIENT_ID", "00000000-0000-0000-0000-000000000001")
    monkeypatch.setenv("AZURE_TENANT_ID", TENANT)
    monkeypatch.setenv("AZURE_CLIENT_SECRET", SECRET)
    monkeypatch.setattr(workspace, "default_credential", functools.partial(
        workspace.default_credential, disable_instance_discovery=True, retry_total=0,
        exclude_managed_identity_credential=True, exclude_workload_identity_credential=True,
        exclude_cli_credential=True, exclude_powershell_credential=True,
        exclude_developer_cli_credential=True, exclude_shared_token_cache_credential=True))
    (tmp_path / "train.py").write_text("print('training')\n")
    monkeypatch.chdir(tmp_path)
    return lambda authority: monkeypatch.setenv("AZURE_AUTHORITY_HOST", authority)


@pytest.fixture
def sign_in_service(signed_in_from_the_environment, monkeypatch, tmp_path):
    cert_file, key_file = _certificate(tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SignIn)
    server.requests, server.secrets = [], []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", cert_file)  # the client trusts the test's certificate
    signed_in_from_the_environment(f"https://127.0.0.1:{server.server_port}")
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def submit(*options: str) -> int:
    return main(["submit", "train.py", "--compute", "gpu-cluster", "-ppn", "1", "--image", IMAGE,
                 *WORKSPACE, *options])


def test_a_refused_service_principal_is_named_with_the_services_reason(sign_in_service, capsys):
    code = submit()

    err = capsys.readouterr().err
    assert code == 2
    assert err == ("hvdazure: error: Azure sign-in failed: the service principal of AZURE_CLIENT_ID, "
                   "AZURE_TENANT_ID and AZURE_CLIENT_SECRET was refused (AADSTS7000215: Invalid client "
                   "secret provided.): check AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET, or "
                   "unset them to use `az login`\n")
    assert sign_in_service.secrets == [True]  # the refusal is the service's answer to the secret
    assert ("GET", f"/{TENANT}/v2.0/.well-known/openid-configuration") in sign_in_service.requests


def test_a_sign_in_service_that_cannot_be_reached_is_named_with_its_address(signed_in_from_the_environment,
                                                                             closed_port, capsys):
    signed_in_from_the_environment(f"https://127.0.0.1:{closed_port}")
    code = submit()

    err = capsys.readouterr().err
    assert code == 2
    assert err == ("hvdazure: error: Azure sign-in failed: the service principal of AZURE_CLIENT_ID, "
                   f"AZURE_TENANT_ID and AZURE_CLIENT_SECRET could not reach the sign-in service at "
                   f"127.0.0.1:{closed_port} (Connection refused): check the network, a proxy, or "
                   "AZURE_AUTHORITY_HOST\n")


def test_verbose_keeps_the_sdks_own_error_below_the_line(sign_in_service, capsys):
    code = submit("-v")

    err = capsys.readouterr().err
    assert code == 2
    assert "ClientAuthenticationError: DefaultAzureCredential failed to retrieve a token" in err
    assert "EnvironmentCredential: Authentication failed: AADSTS7000215" in err
    assert err.splitlines()[-1].startswith("hvdazure: error: Azure sign-in failed: the service principal")
    assert SECRET not in err


def test_the_python_api_raises_the_same_line_with_the_cause_kept(sign_in_service):
    from azure.core.exceptions import ClientAuthenticationError

    with pytest.raises(SubmitError, match=r"^Azure sign-in failed: the service principal .* refused ") as e:
        workspace.check_credential(workspace.default_credential())
    assert isinstance(e.value.__cause__, ClientAuthenticationError)


@pytest.mark.parametrize(("message", "expected"), [
    (f"{ATTEMPTED}\tEnvironmentCredential: EnvironmentCredential authentication unavailable. Environment "
     "variables are not fully configured.\n\tManagedIdentityCredential: ManagedIdentityCredential "
     "authentication unavailable. Error: Connection timed out\n"
     "\tAzureCliCredential: Azure CLI not found on path",
     "no Azure credentials: run `az login`"),
    (f"{ATTEMPTED}\tEnvironmentCredential: EnvironmentCredential authentication unavailable.\n"
     "\tAzureCliCredential: "
     "ERROR: AADSTS700082: The refresh token has expired due to inactivity. Trace ID: 1",
     "Azure sign-in failed: the Azure CLI's login was refused (AADSTS700082: The refresh token has expired "
     "due to inactivity.): run `az login` again"),
])
def test_what_failed_is_read_from_default_azure_credentials_attempts(message, expected):
    from azure.core.exceptions import ClientAuthenticationError

    line = workspace.credential_failure(ClientAuthenticationError(message), "DefaultAzureCredential")
    assert line.startswith(expected)
    assert "\n" not in line
