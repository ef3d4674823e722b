"""The files a submission uploads from the code directory, by the rules Azure ML's SDKs apply.

The code directory is uploaded as the job's snapshot, less what `.amlignore` excludes, or `.gitignore` when
there is no `.amlignore` (only the file at the top of the directory counts, as in azure-ai-ml; the last
matching pattern decides, `!pattern` re-includes). Azure ML refuses snapshots over its limit, and a large one
makes every submission slow, so hvdazure counts before uploading and warns above 300 MB or 2000 files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# Azure ML's snapshot limit; above it the upload is slow or refused. Named for the warning's text.
WARN_BYTES = 300 * 1024 * 1024
WARN_FILES = 2000
IGNORE_FILES = (".amlignore", ".gitignore")  # in this order: .amlignore wins


@dataclass(frozen=True)
class CodeSnapshot:
    """What would be uploaded: paths relative to the code directory, and their total size."""

    code_dir: Path
    files: tuple[str, ...]
    total_bytes: int
    ignore_file: str | None  # ".amlignore", ".gitignore" or None

    def contains(self, relative_path: str) -> bool:
        return Path(relative_path).as_posix() in self.files

    def size_warning(self) -> str | None:
        """One line when the snapshot is over Azure ML's limit, else None."""
        if self.total_bytes <= WARN_BYTES and len(self.files) <= WARN_FILES:
            return None
        largest = _largest_top_level_entries(self)
        where = f" (rules from {self.ignore_file})" if self.ignore_file else " (no .amlignore or .gitignore)"
        return (f"the code directory {self.code_dir} holds {len(self.files)} files, "
                f"{self.total_bytes / 2**20:.0f} MB to upload{where}: above Azure ML's snapshot limit of "
                f"{WARN_BYTES // 2**20} MB or {WARN_FILES} files; largest: {largest}. Add the data and "
                "environments to .amlignore, or pass a smaller --code directory")


def scan(code_dir: str | os.PathLike) -> CodeSnapshot:
    """Walk `code_dir` as the upload would (following symbolic links) and apply its ignore file."""
    root = Path(code_dir).resolve()
    ignore_name, spec = _ignore_spec(root)
    # A directory can be skipped whole only when no `!pattern` could re-include something below it.
    can_prune = spec is not None and not any(not p.include for p in spec.patterns if p.include is not None)
    files: list[str] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        relative_dir = Path(dirpath).relative_to(root)
        if can_prune:
            dirnames[:] = [d for d in dirnames if not spec.match_file((relative_dir / d).as_posix() + "/")]
        for name in filenames:
            relative = (relative_dir / name).as_posix()
            if spec is not None and spec.match_file(relative):
                continue
            try:
                total += (Path(dirpath) / name).stat().st_size
            except OSError:  # a dangling link: the upload skips it too
                continue
            files.append(relative)
    return CodeSnapshot(code_dir=root, files=tuple(sorted(files)), total_bytes=total, ignore_file=ignore_name)


def is_ignored(code_dir: str | os.PathLike, relative_path: str) -> bool:
    """Whether the ignore file of `code_dir` excludes `relative_path`, which need not exist yet."""
    _, spec = _ignore_spec(Path(code_dir).resolve())
    return spec is not None and spec.match_file(Path(relative_path).as_posix())


def _ignore_spec(root: Path):  # -> tuple[str | None, pathspec.PathSpec | None]
    import pathspec

    for name in IGNORE_FILES:
        path = root / name
        if path.is_file():
            lines = path.read_text(errors="replace").splitlines()
            return name, pathspec.PathSpec.from_lines("gitwildmatch", lines)
    return None, None


def _largest_top_level_entries(snapshot: CodeSnapshot, count: int = 3) -> str:
    sizes: dict[str, int] = {}
    for relative in snapshot.files:
        top = relative.split("/", 1)[0] + ("/" if "/" in relative else "")
        try:
            sizes[top] = sizes.get(top, 0) + (snapshot.code_dir / relative).stat().st_size
        except OSError:
            continue
    ranked = sorted(sizes.items(), key=lambda item: -item[1])[:count]
    return ", ".join(f"{name} {size / 2**20:.0f} MB" for name, size in ranked)
