r"""What an `--input` or an `--output` names, parsed strictly: the forms azure-ai-ml 1.35.2 passes to Azure
ML, and nothing it would turn into a wrong path. No Azure SDK here.

`NAME=[TYPE:]URI[:MODE]`. TYPE is uri_folder (the default) or uri_file. URI is one of:

- a data asset, `azureml:NAME:VERSION` or `azureml:NAME@latest`. azure-ai-ml resolves the version, and of
  the labels only `latest` (`DataOperations._managed_label_resolver`); a name without either fails there
  with "Version must be provided", after the code is uploaded. A real submission looks each one up in the
  workspace before anything is uploaded (v2.submit.ensure_inputs);
- an `azureml://` URI azure-ai-ml passes through as it is: a datastore path (`azureml://datastores/DS/
  paths/PATH`, or its long form under `azureml://subscriptions/...`), a job's output (`azureml://jobs/JOB/
  outputs/NAME/paths/PATH`), or a data asset by URI (`.../data/NAME/versions/VERSION` under
  `azureml://subscriptions/...`, `azureml://locations/...` or `azureml://registries/REGISTRY/`);
- a storage URL (https, http, abfss, abfs, wasbs, wasb, adl), passed through as well;
- a local path, uploaded by the SDK.

MODE is one of the modes azure-ai-ml's schema takes for the type (`DataInputSchema`: ro_mount, the
default, download, direct); eval_mount and eval_download are mltable's, rw_mount and upload outputs'.
Anything else, a mistyped mode or a type hvdazure does not pass (mltable, the model types), is one line
naming the value: azure-ai-ml would otherwise read it as part of the path.

How azure-ai-ml resolves an input when it submits (`JobOperations._resolve_job_input`) is what `resolution`
names: an ARM id, a URL (a scheme and a host: `https://...`, `azureml://datastores/...`) or a binding passes
through as it is; an absolute path is uploaded; anything else with a ':' or an '@' is looked up as a data
asset; any other relative path is uploaded. So a local input is written as its absolute path (a relative one
holding an '@' would be looked up as an asset), and a URL as it is, never with azure-ai-ml's own `azureml:`
prefix (v2.submit.V2Sdk.write_yaml).

`--output NAME[:MODE]`, `NAME=TYPE[:MODE]` or `NAME=[TYPE:]URI[:MODE]`, each optionally followed by
`,name=ASSET[,version=VERSION]`: Azure ML writes an output to a datastore path (`azureml://datastores/DS/
paths/PATH`, or its long form), or, without a URI, to a place of its own in the workspace's default
datastore. TYPE is uri_folder (the default), uri_file (one file, so its path is required), mlflow_model or
custom_model, the output types Azure ML documents for command jobs (azure-ai-ml's `OutputSchema` also takes
mltable and triton_model, which hvdazure does not write); MODE rw_mount (the default), upload or direct,
`OutputSchema`'s modes (its `mount` is rw_mount's other name). `name=` registers what the job wrote, once it
ends, as that asset (`outputs.NAME.name` and `.version` in the job: a model for the model types, else a data
asset), `version=` as that version, else the asset's next. Asset names follow azure-ai-ml's model client
(`^(?![\-_.])[a-zA-Z0-9\-_.]{1,255}(?<!\.)$`), versions the rule of inputs' versions. Only name= and version=
follow a comma: a comma and any other `word=` is refused, so a misspelt setting is not taken for a path. A
data asset, a storage URL, a local path or an input's mode is refused in one line naming the value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hvdazure.azure.errors import JobSpecError
from hvdazure.azure.resolved_job import MODEL_TYPES, InputSpec, OutputSpec

INPUT_TYPES = ("uri_folder", "uri_file")
OUTPUT_TYPES = (*INPUT_TYPES, *MODEL_TYPES)
OUTPUT_MODES = ("rw_mount", "upload", "direct")  # azure-ai-ml's OutputSchema (and "mount", rw_mount's alias)
DEFAULT_OUTPUT_MODE = "rw_mount"
INPUT_MODES = ("ro_mount", "download", "direct")  # for both types: azure-ai-ml's DataInputSchema
DEFAULT_MODE = "ro_mount"
# what Azure ML has beyond them, so that a refusal says where such a value belongs
_OTHER_TYPES = ("mltable", "custom_model", "mlflow_model", "triton_model")
_OTHER_MODES = {"eval_mount": "mltable inputs", "eval_download": "mltable inputs", "rw_mount": "outputs",
                "upload": "outputs", "mount": "outputs"}
_OTHER_OUTPUT_MODES = {"ro_mount": "inputs", "download": "inputs", "eval_mount": "mltable inputs",
                       "eval_download": "mltable inputs"}
URL_SCHEMES = ("https", "http", "abfss", "abfs", "wasbs", "wasb", "adl")
_ASSET_NAME = r"[A-Za-z0-9][A-Za-z0-9_.\-]*"
_ASSET = re.compile(rf"^azureml:(?P<name>{_ASSET_NAME})(?:@(?P<label>[^:@/]*)|:(?P<version>[^:@/]*))?$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_OUTPUT_ASSET_NAME = re.compile(r"^(?![\-_.])[A-Za-z0-9\-_.]{1,255}(?<!\.)$")  # azure-ai-ml's model client
_SETTING = re.compile(r"^(?P<key>[A-Za-z_]+)=(?P<value>.*)$")  # `,name=...` after an output
_REGISTRATION = {"name": "asset_name", "version": "asset_version"}
_MODE_LIKE = re.compile(r"^[A-Za-z][A-Za-z_\-]*$")  # a word that can only be meant as a mode
_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://")
_DATASTORE_PATHS = [re.compile(p, re.I) for p in (
    r"^azureml://datastores/[^/]+/paths/",
    r"^azureml://subscriptions/[^/]+/resourcegroups/[^/]+/workspaces/[^/]+/datastores/[^/]+/paths/",
)]
_AZUREML_URIS = [*_DATASTORE_PATHS, *(re.compile(p, re.I) for p in (
    r"^azureml://jobs/[^/]+/outputs/[^/]+/paths/",
    r"^azureml://subscriptions/[^/]+/resourcegroups/[^/]+/workspaces/[^/]+/data/[^/]+/versions/[^/]+$",
    r"^azureml://locations/[^/]+/workspaces/[^/]+/data/[^/]+/versions/[^/]+$",
    r"^azureml://registries/[^/]+/data/[^/]+/versions/[^/]+$",
))]
DATASTORE_PATH_FORM = "azureml://datastores/NAME/paths/PATH"


@dataclass(frozen=True)
class DataAsset:
    """A data asset of the workspace an input names: by version, or by the label `latest`."""

    name: str
    version: str | None = None
    label: str | None = None  # "latest" when no version is given

    @property
    def reference(self) -> str:
        return f"azureml:{self.name}:{self.version}" if self.version else f"azureml:{self.name}@{self.label}"


def parse_input_value(name: str, value: str) -> InputSpec:
    """The InputSpec of `--input NAME=VALUE`, VALUE being `[TYPE:]URI[:MODE]`, split into its parts (a type
    prefix Azure ML does not take is refused here; check_input checks the rest)."""
    kind, uri = _split_type(f"--input {name}", value)
    uri, mode = _split_mode(uri)
    return InputSpec(name=name, uri=uri, type=kind, mode=mode or DEFAULT_MODE)


def parse_output_value(text: str) -> OutputSpec:
    """The OutputSpec of `--output TEXT`: `NAME`, `NAME:MODE`, `NAME=TYPE[:MODE]` or
    `NAME=[TYPE:]URI[:MODE]`, then `,name=ASSET[,version=VERSION]` to register it, split into its parts
    (check_output checks them)."""
    text, registration = _split_registration(text)
    name, equals, value = text.partition("=")
    if not equals:
        name, colon, given = text.partition(":")
        if colon and not given:
            raise JobSpecError(f"--output {text!r}: no mode after ':' (one of {', '.join(OUTPUT_MODES)})")
        return OutputSpec(name=name, mode=_output_mode(given) if given else DEFAULT_OUTPUT_MODE,
                          **registration)
    option = f"--output {name}"
    if not value:
        raise JobSpecError(f"{option}: nothing after '=': give NAME, NAME:MODE, NAME=TYPE or "
                           f"NAME={DATASTORE_PATH_FORM}")
    kind, uri = (value, "") if value in (*OUTPUT_TYPES, *_OTHER_TYPES) else _split_type(option, value,
                                                                                        OUTPUT_TYPES)
    typed = uri != value
    uri, mode = _split_mode(uri)
    if typed and mode is None and _MODE_LIKE.match(uri):  # TYPE:MODE, in Azure ML's default place
        uri, mode = "", uri
    if not uri and not typed:
        raise JobSpecError(f"{option}: no URI before ':{mode}': give NAME:{mode} or "
                           f"NAME={DATASTORE_PATH_FORM}:{mode}")
    return OutputSpec(name=name, uri=uri or None, type=kind,
                      mode=_output_mode(mode) if mode else DEFAULT_OUTPUT_MODE, **registration)


def _split_registration(text: str) -> tuple[str, dict[str, str]]:
    """`--output`'s text without its trailing `,name=ASSET` and `,version=VERSION`, and those settings as
    OutputSpec's fields."""
    parts = text.split(",")
    option = f"--output {re.split('[=:]', parts[0], maxsplit=1)[0]}"
    found: dict[str, str] = {}
    while len(parts) > 1 and (setting := _SETTING.match(parts[-1])):
        key, value = setting["key"], setting["value"]
        if key not in _REGISTRATION:
            raise JobSpecError(f"{option}: unknown setting {key}= (name=ASSET and version=VERSION register "
                               "the output)")
        if _REGISTRATION[key] in found:
            raise JobSpecError(f"{option}: {key}= is given twice")
        found[_REGISTRATION[key]] = value
        parts.pop()
    return ",".join(parts), found


def _check_type_and_mode(option: str, kind: str, mode: str,
                         allowed: tuple[Sequence[str], Sequence[str], Mapping[str, str]], what: str) -> None:
    """One line unless `kind` and `mode` are among `allowed` (types, modes, and the other modes with what
    they are for), for an input or an output (`what`)."""
    types, modes, other_modes = allowed
    if kind not in types:
        raise JobSpecError(f"{option}: type {kind!r} is not one of {', '.join(types)}")
    if mode not in modes:
        where = other_modes.get(mode)
        detail = f" ({mode} is for {where})" if where else ""
        raise JobSpecError(f"{option}: mode {mode!r} is not one of {', '.join(modes)} for {what}{detail}")


def check_output(spec: OutputSpec) -> None:
    """Raise JobSpecError (one line naming the value) unless Azure ML writes `spec` where it says: a datastore
    path or its own default place, with a type and a mode of outputs."""
    option = f"--output {spec.name}"
    _check_type_and_mode(option, spec.type, spec.mode, (OUTPUT_TYPES, OUTPUT_MODES, _OTHER_OUTPUT_MODES),
                         "an output")
    _check_registration(option, spec)
    if spec.uri is None:
        if spec.type == "uri_file":
            raise JobSpecError(f"{option}: a uri_file output is one file: give its datastore path, "
                               f"{spec.name}=uri_file:{DATASTORE_PATH_FORM}")
        return
    uri = spec.uri
    way_on = (f"Azure ML writes outputs to a datastore path, {DATASTORE_PATH_FORM}, or, without a URI, to "
              "its default datastore")
    if any(pattern.match(uri) for pattern in _DATASTORE_PATHS):
        return
    if not uri:
        raise JobSpecError(f"{option}: an empty URI: {way_on}")
    if uri.startswith("azureml:") and not uri.startswith("azureml://"):
        raise JobSpecError(f"{option}: {uri} names a data asset, which a job does not write to: {way_on}")
    scheme = _SCHEME.match(uri)
    if scheme and scheme["scheme"].lower() == "azureml":
        raise JobSpecError(f"{option}: {uri} is not a datastore path: {way_on}")
    if scheme and scheme["scheme"].lower() in URL_SCHEMES:
        raise JobSpecError(f"{option}: {uri} is a storage URL, not a datastore path (register the storage "
                           f"account as a datastore): {way_on}")
    if scheme or ":" in uri.split("/", 1)[0]:
        raise JobSpecError(f"{option}: {uri} is not a datastore path: {way_on}")
    raise JobSpecError(f"{option}: {uri} is a local path, which a job cannot write to: {way_on}")


def _check_registration(option: str, spec: OutputSpec) -> None:
    """The asset `spec` is registered as, if any: a name Azure ML takes, and a version it takes."""
    name, version = spec.asset_name, spec.asset_version
    if name is None:
        if version is not None:
            raise JobSpecError(f"{option}: version={version} goes with name=ASSET, the asset the output is "
                               "registered as")
        return
    if not _OUTPUT_ASSET_NAME.match(name):
        raise JobSpecError(f"{option}: name={name!r}: 1 to 255 letters, digits, '-', '_' and '.', not "
                           "starting with '-', '_' or '.' nor ending with '.' (Azure ML's asset names)")
    if version is not None and (not _VERSION.match(version) or version == "latest"):
        raise JobSpecError(f"{option}: version={version!r}: letters, digits, '_', '.' and '-', not 'latest' "
                           "(without version=, Azure ML registers the asset's next version)")


def resolution(path: str, is_arm_id: bool = False) -> str:
    """How azure-ai-ml's submission treats an input's `path` (JobOperations._resolve_job_input, without the
    SDK): "passed through", "uploaded" or "looked up as a data asset". `is_arm_id`: the SDK's own test for a
    full ARM id (`/subscriptions/...`), which only an `azureml:` asset reference resolves to here."""
    from urllib.parse import urlparse

    parsed = urlparse(path)
    if is_arm_id or (parsed.scheme and parsed.netloc) or path.startswith("${{"):
        return "passed through"
    if path.startswith("/"):
        return "uploaded"
    if ":" in path or "@" in path:
        return "looked up as a data asset"
    return "uploaded"


def expected_resolution(uri: str) -> str:
    """How a submission must treat an input given as `uri`: a data asset reference is looked up, a local path
    uploaded, anything else passed through."""
    if asset_reference(uri) is not None:
        return "looked up as a data asset"
    return "uploaded" if is_local_path(uri) else "passed through"


def is_local_path(uri: str) -> bool:
    """True for a path on this machine (uploaded with the job), False for azureml:, https:, abfss:, ..."""
    return ":" not in uri.split("/", 1)[0]


def check_input(spec: InputSpec) -> None:
    """Raise JobSpecError (one line naming the value) unless Azure ML takes `spec`'s type, mode and URI."""
    option = f"--input {spec.name}"
    _check_type_and_mode(option, spec.type, spec.mode, (INPUT_TYPES, INPUT_MODES, _OTHER_MODES),
                         f"a {spec.type} input")
    _check_uri(spec.uri, option)


def asset_reference(uri: str) -> DataAsset | None:
    """The workspace data asset `uri` names in the short form (`azureml:NAME:VERSION`, `azureml:NAME@latest`),
    or None for any other form (checked by check_input first)."""
    match = _ASSET.match(uri)
    if not match:
        return None
    if match["version"] is not None:
        return DataAsset(match["name"], version=match["version"])
    return DataAsset(match["name"], label=match["label"])


def _split_type(option: str, value: str, types: tuple[str, ...] = INPUT_TYPES) -> tuple[str, str]:
    head, sep, tail = value.partition(":")
    if sep and head in types:
        return head, tail
    names_a_type = head in _OTHER_TYPES or (
        re.fullmatch(r"[a-z][a-z_]*", head) is not None and head not in ("azureml", *URL_SCHEMES)
        and (tail.startswith("azureml:") or _SCHEME.match(tail) is not None))
    if sep and names_a_type:
        raise JobSpecError(f"{option}: type {head!r} is not one of {', '.join(types)}")
    return "uri_folder", value


def _output_mode(mode: str) -> str:
    return DEFAULT_OUTPUT_MODE if mode == "mount" else mode  # azure-ai-ml sends both as ReadWriteMount


def _split_mode(uri: str) -> tuple[str, str | None]:
    """`uri` without a trailing `:MODE`, and the mode (None when there is none). A trailing word after a
    colon is taken as a mode wherever nothing else can be meant by it, so a mistyped one is refused by
    name instead of becoming part of the path."""
    if uri.startswith("azureml:") and not uri.startswith("azureml://"):
        *parts, last = uri[len("azureml:"):].split(":")
        # NAME@LABEL:MODE, NAME:VERSION:MODE, or NAME:MODE (a version named like a mode is not one)
        after_version = len(parts) >= 2 or bool(parts and "@" in parts[0])
        named_mode = last in INPUT_MODES or last in _OTHER_MODES
        if parts and _MODE_LIKE.match(last) and (after_version or named_mode):
            return "azureml:" + ":".join(parts), last
        return uri, None
    head, sep, tail = uri.rpartition(":")
    if not sep or not head or head in URL_SCHEMES or not _MODE_LIKE.match(tail):
        return uri, None
    return head, tail


def _check_uri(uri: str, option: str) -> None:
    if not uri:
        raise JobSpecError(f"{option}: no URI (expected NAME=azureml:ASSET@latest, ...)")
    if uri.startswith("azureml:") and not uri.startswith("azureml://"):
        _check_asset(uri, option)
        return
    scheme = _SCHEME.match(uri)
    if scheme and scheme["scheme"].lower() == "azureml":
        if not any(pattern.match(uri) for pattern in _AZUREML_URIS):
            raise JobSpecError(f"{option}: {uri} is not a datastore path (azureml://datastores/NAME/paths/"
                               "PATH) or a data asset URI (.../data/NAME/versions/VERSION)")
        return
    if scheme:
        if scheme["scheme"].lower() not in URL_SCHEMES:
            raise JobSpecError(f"{option}: scheme {scheme['scheme']!r} is not one Azure ML reads "
                               f"({', '.join(('azureml', *URL_SCHEMES))})")
        return
    if ":" in uri.split("/", 1)[0]:
        raise JobSpecError(f"{option}: {uri!r} is not a data asset (azureml:NAME:VERSION), a datastore "
                           "path (azureml://datastores/...), a storage URL or a local path")


def _check_asset(uri: str, option: str) -> None:
    match = _ASSET.match(uri)
    if not match:
        raise JobSpecError(f"{option}: {uri!r} is not a data asset reference: expected azureml:NAME:VERSION "
                           "or azureml:NAME@latest")
    name, label, version = match["name"], match["label"], match["version"]
    if label is None and version is None:
        raise JobSpecError(f"{option}: azureml:{name} has no version (Azure ML requires one): give "
                           f"azureml:{name}:VERSION or azureml:{name}@latest")
    if label is not None and label != "latest":
        raise JobSpecError(f"{option}: label {label!r} in {uri}: azure-ai-ml resolves only @latest; give the "
                           f"version, azureml:{name}:VERSION")
    if version == "latest":
        raise JobSpecError(f"{option}: {uri} names version 'latest'; the latest version is azureml:{name}"
                           "@latest")
    if version is not None and not _VERSION.match(version):
        raise JobSpecError(f"{option}: version {version!r} in {uri}: letters, digits, '_', '.' and '-'")
