"""`python -m hvdazure.cli`: the `hvdazure` command, for where its console script is not on PATH."""

from __future__ import annotations

import sys

from hvdazure.cli import main

sys.exit(main())
