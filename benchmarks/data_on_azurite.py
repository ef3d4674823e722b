"""`hvdazure bench data` against Azure Blob as this machine can have it: Azurite (Microsoft's emulator) on
127.0.0.1 behind the test suite's fault proxy, which adds a latency to every request and caps the
bandwidth, as a remote store would.

    python benchmarks/data_on_azurite.py [--latency-ms 20] [--mbps 200] [-np 2] [--quick] [--json OUT]

The benchmark writes its dataset into a fresh container through the proxy, reads it on -np ranks and
reports as `hvdazure bench data --url` does (the raw read of the same bytes through the same proxy is its
floor). Azurite and the proxy are the ones the storage tests use (tests/storage), started here for the run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from storage.azurite import running_azurite  # noqa: E402 (after the path above)
from storage.fault_proxy import FaultProxy  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added to every request (default 20)")
    parser.add_argument("--mbps", type=float, default=200.0,
                        help="bandwidth cap of the proxy, MB/s per connection (default 200)")
    parser.add_argument("-np", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hvdazure-azurite-") as location, \
            running_azurite(Path(location)) as azurite:
        container = azurite.create_container()
        with FaultProxy(("127.0.0.1", azurite.port), latency=args.latency_ms / 1000,
                        bandwidth=args.mbps * 1e6) as proxy:
            env = {**os.environ, "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string(proxy.port)}
            command = [sys.executable, "-m", "hvdazure.cli", "bench", "data", "-np", str(args.np),
                       "--url", f"abfs://{container}"] + (["--quick"] if args.quick else []) + (
                ["--json", args.json] if args.json else [])
            print(f"Azurite behind a proxy: {args.latency_ms:g} ms per request, {args.mbps:g} MB/s cap",
                  flush=True)
            return subprocess.run(command, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
