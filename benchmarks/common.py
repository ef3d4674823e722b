"""What the scripts here share: the JSON report. (What users run, `hvdazure bench`, is in hvdazure/bench/.)"""

from __future__ import annotations

import json
from pathlib import Path


def write_result(path: Path, result: dict) -> None:
    """Write a benchmark's result as JSON (creating its folder) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")
