"""No credential reaches a job by any path: every field `hvdazure submit` puts into the job is checked with
one rule (errors.credential_in, errors.named_like_credential), with both SDKs, in a dry run and before a
submission contacts Azure; the refusal is one line naming the field, never the value. Offline."""

from __future__ import annotations

import base64
import hashlib

import pytest
from job_specs import IMAGE, spec

from hvdazure.azure import submission
from hvdazure.azure.errors import JobSpecError, credential_in, named_like_credential, redact
from hvdazure.azure.spec.job import InputSpec, OutputSpec, resolve
from hvdazure.azure.spec.sweep import InJobSweepSpec, SweepSpec
from hvdazure.cli import main

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]
SIGNATURE = "abc%3D"
SAS_URL = f"https://acct.blob.core.windows.net/c/d?sv=2022-11-02&sp=rl&sig={SIGNATURE}"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"
# a storage account key is 64 random bytes in base64 (88 characters); these are made up
KEY = base64.b64encode(hashlib.sha512(b"not a real account key").digest()).decode()
CONNECTION = f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY};EndpointSuffix=core.windows.n"
SAS_CONNECTION = "BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature=sv=2022-11-02&sp=rl"
SECRETS = (SIGNATURE, JWT, "hunter2", "hf_abcdef", KEY, KEY[:40])


pytestmark.append(pytest.mark.project(files={
    "space.yaml": "lr: {type: choice, values: [0.1, 0.01]}\n",
    "urls.yaml": f"extra.data_url: {{type: choice, values: ['{SAS_URL}', 'b']}}\n"}))


CASES = [  # (what the job is given, the field the refusal names, the kind of credential)
    ({"script_args": ["--set", f"extra.data_url={SAS_URL}"]}, "the script's argument --set extra.data_url",
     "a SAS signature, sig="),
    ({"script_args": [f"--set=extra.data_url={SAS_URL}"]}, "the script's argument --set extra.data_url",
     "a SAS signature, sig="),
    ({"script_args": ["--epochs", "3", "--data-url", SAS_URL]}, "the script's argument --data-url",
     "a SAS signature, sig="),
    ({"script_args": [f"--data-url={SAS_URL}"]}, "the script's argument --data-url", "a SAS signature, sig="),
    ({"script_args": ["fit", SAS_URL]}, "the script's argument 2", "a SAS signature, sig="),
    ({"script_args": ["--header", "Authorization: Bearer hf_abcdef"]}, "the script's argument --header",
     "a bearer token"),
    ({"script_args": ["--set", "extra.hf_token=hf_abcdef"]}, "the script's argument --set extra.hf_token",
     "by its name"),
    ({"tags": {"src": SAS_URL}}, "--tag src", "a SAS signature, sig="),
    ({"tags": {"db": "password=hunter2"}}, "--tag db", "a key or password"),
    ({"tags": {"hf_token": "hf_abcdef"}}, "--tag hf_token", "by its name"),
    ({"display_name": f"digits {JWT}"}, "--display-name", "a JWT"),
    ({"experiment": "AccountKey=hunter2"}, "--experiment", "a key or password"),
    ({"env": {"DATA_URL": SAS_URL}}, "--env DATA_URL", "a SAS signature, sig="),
    ({"env": {"HF_TOKEN": "hf_abcdef"}}, "--env HF_TOKEN", "by its name"),
    ({"inputs": [InputSpec("data", SAS_URL)]}, "--input data", "a SAS signature, sig="),
    ({"outputs": [OutputSpec("model", SAS_URL)]}, "--output model", "a SAS signature, sig="),
    ({"docker_args": f"-e TOKEN_JWT={JWT}"}, "--docker-args", "a JWT"),
    ({"sweep": SweepSpec("urls.yaml", "eval_loss")}, "search space parameter extra.data_url",
     "a SAS signature, sig="),
    ({"sweep": SweepSpec("space.yaml", "eval_loss"), "script_args": ["--set", f"extra.u={SAS_URL}"]},
     "the script's argument --set extra.u", "a SAS signature, sig="),
    ({"sweep": InJobSweepSpec("urls.yaml", "eval_loss")}, "search space parameter extra.data_url",
     "a SAS signature, sig="),
    ({"env": {"STORAGE": KEY}}, "--env STORAGE", "a storage account key"),
    ({"tags": {"storage": KEY}}, "--tag storage", "a storage account key"),
    ({"script_args": ["--account-key", KEY]}, "the script's argument --account-key", "a storage account key"),
    ({"script_args": ["--set", f"extra.storage={KEY}"]}, "the script's argument --set extra.storage",
     "a storage account key"),
    ({"script_args": [f"--set=extra.storage='{KEY}'"]}, "the script's argument --set extra.storage",
     "a storage account key"),
    ({"env": {"STORAGE": CONNECTION}}, "--env STORAGE", "a key or password"),
    ({"script_args": ["--conn", SAS_CONNECTION]}, "the script's argument --conn", "a key or password"),
    ({"display_name": f"digits {KEY}"}, "--display-name", "a storage account key"),
]


@pytest.mark.parametrize("sdk", ["v2", "v1"])
@pytest.mark.parametrize(("overrides", "field", "what"), CASES)
def test_a_credential_in_any_field_is_refused_in_a_dry_run_naming_the_field_not_the_value(
        project, tmp_path, sdk, overrides, field, what):
    with pytest.raises(JobSpecError) as error:
        submission.dry_run(spec(**overrides), tmp_path / "job.yml", sdk=sdk)

    message = str(error.value)
    assert message.startswith(f"{field}: looks like a credential ({what}), which the job would store in "
                              "plain text: ")
    assert "\n" not in message
    assert not [secret for secret in SECRETS if secret in message]
    assert not list(tmp_path.glob("job*.yml"))


@pytest.mark.parametrize("sdk", ["v2", "v1"])
@pytest.mark.parametrize(("overrides", "field", "what"), CASES[:1] + CASES[7:8])
def test_a_submission_refuses_a_credential_before_it_looks_for_the_workspace(project, sdk, overrides, field,
                                                                              what):
    def workspace():
        raise AssertionError("the workspace was asked for: the job got past the offline checks")

    with pytest.raises(JobSpecError, match=f"^{field}: looks like a credential"):
        submission.submit(spec(**overrides), workspace, sdk=sdk)


@pytest.mark.parametrize("argv", [
    ["--", "--set", f"extra.data_url={SAS_URL}"],
    ["--tag", f"src=https://acct.blob.core.windows.net/c/d?sp=rl&sig={SIGNATURE}"],
])
def test_cli_refuses_the_issues_credentials_in_one_line_without_them(project, capsys, argv):
    code = main(["submit", "train.py", "--compute", "cpu", "-ppn", "1", "--image", IMAGE, "--dry-run", *argv])

    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("hvdazure: error: ") and "looks like a credential" in err
    assert err.count("\n") == 1
    assert SIGNATURE not in err
    assert not (project / "hvdazure-job.yml").exists()


@pytest.mark.parametrize("argv", [["--env", f"STORAGE={KEY}"], ["--tag", f"storage={KEY}"],
                                  ["--", "--account-key", KEY], ["--", "--set", f"extra.storage={KEY}"]])
def test_cli_refuses_a_bare_storage_key_without_printing_or_writing_it(project, capsys, argv):
    code = main(["submit", "train.py", "--compute", "cpu", "-ppn", "1", "--image", IMAGE, "--dry-run", *argv])

    printed = capsys.readouterr()
    assert code == 2
    assert "looks like a credential (a storage account key)" in printed.err
    assert printed.err.count("\n") == 1
    assert KEY[:20] not in printed.out + printed.err
    assert not (project / "hvdazure-job.yml").exists()


NOT_SECRETS = [
    hashlib.sha256(b"x").hexdigest(), hashlib.sha512(b"x").hexdigest(), "0" * 40,  # hex digests, a git sha
    base64.b64encode(hashlib.sha256(b"x").digest()).decode(),  # base64 of 32 bytes (an SRI sha256)
    base64.b64encode(bytes(48)).decode(), base64.b64encode(bytes(63)).decode(),  # of 48 and 63 bytes
    base64.b64encode(bytes(65)).decode(), base64.b64encode(bytes(66)).decode(),
    "digits-2x8-lr0.05-bs512", "f47ac10b-58cc-4372-a567-0e02b2c3d479", "a" * 86 + "==" + "b",
    "/mnt/data/" + "x" * 100,
]


@pytest.mark.parametrize("value", NOT_SECRETS)
def test_hashes_other_base64_and_run_names_are_not_taken_for_keys(project, value):
    job = resolve(spec(script_args=["--set", f"extra.run={value}", "--digest", value], tags={"run": value},
                       env={"RUN": value}))

    assert credential_in(value) is None
    assert job.tags["run"] == value


def test_a_key_alone_or_in_a_connection_string_is_redacted():
    for text in (KEY, f"key '{KEY}' refused", CONNECTION, f"AccountKey={KEY};"):
        assert credential_in(text) is not None
        assert KEY[:20] not in redact(text)


def test_urls_and_names_that_hold_no_credential_pass(project):
    job = resolve(spec(
        script_args=["--set", "extra.data_url=https://acct.blob.core.windows.net/c/d?sv=2022-11-02&sp=rl",
                     "--set", "extra.keyboard=us", "--set", "extra.max_tokens=512", "--key-column", "id"],
        tags={"src": "https://github.com/o/r?ref=main", "tokenizer": "bpe"},
        env={"TOKENIZERS_PARALLELISM": "false"}, display_name="digits: 2 nodes"))

    assert job.tags == {"src": "https://github.com/o/r?ref=main", "tokenizer": "bpe"}


def test_one_rule_redacts_what_it_refuses():
    for text in (SAS_URL, f"Bearer {JWT}", JWT, "AccountKey=hunter2;", "client_secret: hunter2"):
        assert credential_in(text) is not None
        assert not [secret for secret in SECRETS if secret in redact(text)]
    assert credential_in("https://acct.blob.core.windows.net/c/d?sv=2022-11-02&sp=rl") is None
    assert redact("https://a/c?sv=2022-11-02&sp=rl") == "https://a/c?sv=REDACTED&sp=REDACTED"  # help reuse


@pytest.mark.parametrize(("name", "expected"), [
    ("HF_TOKEN", True), ("WANDB_API_KEY", True), ("extra.db_password", True), ("AZURE_CLIENT_SECRET", True),
    ("AZURE_STORAGE_CONNECTION_STRING", True), ("TOKENIZERS_PARALLELISM", False), ("KEYBOARD", False),
    ("extra.max_tokens", False), ("src", False),
])
def test_names_that_say_they_hold_a_secret(name, expected):
    assert named_like_credential(name) is expected


def test_the_scripts_arguments_are_named_by_their_option_never_their_value():
    from hvdazure.azure.script_args import argument_names, set_fields

    args = ["--set", "extra.url=x", "--set=lr=0.1", "--data-url", "y", "--n=-1", "fit", "-v", "--set",
            "?sig=z"]

    assert argument_names(args) == ["--set", "--set extra.url", "--set lr", "--data-url", "--data-url", "--n",
                                    "7", "-v", "--set", "--set"]
    assert set_fields(args) == ["extra.url", "lr"]
