"""Submit samples/torch_digits.py to an Azure ML compute cluster with the Python API (hvdazure.azure).

The same job as

    hvdazure submit samples/torch_digits.py --code samples --compute gpu-cluster --nodes 2 \
        --vm-size Standard_NC24ads_A100_v4 --image myacr.azurecr.io/hvdazure-torch-gpu:0.1.0 \
        --experiment hvdazure-digits --env NCCL_DEBUG=WARN --dry-run -- --set epochs=15 --set lr=0.05

Without --submit it is a dry run: the job YAML is written and checked by azure-ai-ml offline, and nothing
needs Azure. With --submit (and a workspace's config.json, `az login`), the job is submitted.

    python samples/azure_submit.py                                  # dry run, writes azure-job/job.yml
    python samples/azure_submit.py --submit --image myacr.azurecr.io/hvdazure-torch-gpu:0.1.0 \
        --compute gpu-cluster
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hvdazure.azure import JobSpec, SubmitError, WorkspaceRef, dry_run, submit

SAMPLES = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compute", default="gpu-cluster")
    parser.add_argument("--image", default="myacr.azurecr.io/hvdazure-torch-gpu:0.1.0")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--vm-size", default="Standard_NC24ads_A100_v4", help="one GPU per node: 1 rank each")
    parser.add_argument("--submit", action="store_true", help="submit (needs a workspace and a login)")
    parser.add_argument("--workspace-config", help="the workspace's config.json (default: found from here)")
    args = parser.parse_args()

    spec = JobSpec(
        script=str(SAMPLES / "torch_digits.py"),
        code_dir=str(SAMPLES),  # only the samples are uploaded; the job starts in this directory
        compute=args.compute,
        nodes=args.nodes,
        vm_size=args.vm_size,  # processes per node and NCCL settings follow the VM size
        image=args.image,
        script_args=["--set", "epochs=15", "--set", "lr=0.05"],
        experiment="hvdazure-digits",
        env={"NCCL_DEBUG": "WARN"},
    )
    try:
        if not args.submit:
            result = dry_run(spec, Path.cwd() / "azure-job" / "job.yml")
            print("\n".join(result.report()))
            return 0
        workspace = WorkspaceRef.from_options(config=args.workspace_config)
        job = submit(spec, workspace)
    except SubmitError as exc:
        print(f"azure_submit: {exc}", file=sys.stderr)
        return 2
    print(f"submitted {job.name}: {job.studio_url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
