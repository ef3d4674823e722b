"""MkDocs hooks (mkdocs.yml `hooks:`): what the site's build does beyond rendering Markdown.

- `<!-- generated: config-table -->` and `<!-- generated: cli-reference -->` become the tables that
  reference.py generates from the code, at every build.
- A code block marked `<!-- run -->` (the test suite runs it: tests/docs/) or `<!-- illustration -->` (it
  does not) gets a title that says which.
- Every page is checked against the code (checks.py): a stale name, path, config field or command line is
  a warning, and `mkdocs build --strict` (make docs-check, part of make test) fails on it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mkdocs.plugins import get_plugin_logger

sys.path.insert(0, str(Path(__file__).resolve().parent))

import checks
import reference

log = get_plugin_logger("hvdazure-docs")

GENERATED = {
    "config-table": reference.config_table,
    "cli-reference": reference.cli_reference,
}
TITLES = {
    "run": "Runs in the test suite",
    "illustration": "Illustration: not run by the tests",
}
_GENERATED = re.compile(r"<!--\s*generated:\s*([\w-]+)\s*-->")
_MARKED_FENCE = re.compile(r"(<!--\s*(run|illustration)\b[^>]*-->[ \t]*\n([ \t]*)```+[ \t]*)(\w+)[ \t]*\n")


def on_page_markdown(markdown: str, page, config, files) -> str:
    for problem in checks.stale_references(markdown):
        log.warning(f"{page.file.src_path}: {problem}")
    markdown = _MARKED_FENCE.sub(lambda m: f'{m.group(1)}{m.group(4)} title="{TITLES[m.group(2)]}"\n',
                                 markdown)
    return _GENERATED.sub(lambda m: _generate(m.group(1), page.file.src_path), markdown)


def _generate(name: str, where: str) -> str:
    if name not in GENERATED:
        log.warning(f"{where}: no generator named {name!r} (known: {', '.join(GENERATED)})")
        return ""
    return GENERATED[name]()
