"""The ``subprocess`` runner's copy of a task's uploaded artifact (binary or script) into a run folder.

A run never executes the shared artifact cache: each attempt gets a copy of its own, checked
against the SHA-256 recorded at upload, so what runs is what was uploaded, whatever happened to
the cache since, and a run user cannot replace what it runs.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from runners.base import RunnerError, RunSpec


def copy_artifact(spec: RunSpec, folder: Path, *, shared: bool) -> str:
    """Copy the artifact into ``folder`` and check the copy's SHA-256; return the copy's path.

    ``shared``: the folder is read by a run user (the sandbox's user and bwrap modes), so the
    copy is readable and executable by others, and writable by nobody. A missing artifact, a
    copy that fails or does not match its checksum is a :class:`RunnerError` that another attempt
    cannot fix.
    """
    if not spec.artifact_path:
        raise RunnerError("the task has no uploaded artifact to run", retryable=False)
    source = Path(spec.artifact_path)
    folder.mkdir(mode=0o755 if shared else 0o700, exist_ok=True)
    # A plain name: it becomes an argument of env(1) in bwrap mode, where "a=b" would be a variable.
    target = folder / (re.sub(r"[^A-Za-z0-9._-]", "_", source.name).lstrip(".") or "artifact")
    digest = hashlib.sha256()
    try:
        with source.open("rb") as src, target.open("wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
    except OSError as exc:
        raise RunnerError(f"cannot copy the artifact {source}: {exc}", retryable=False) from exc
    if spec.artifact_sha256 and digest.hexdigest() != spec.artifact_sha256:
        target.unlink(missing_ok=True)
        raise RunnerError(
            f"the artifact's copy does not match its checksum {spec.artifact_sha256}: not running it",
            retryable=False,
        )
    # Read and execute only, for the run user too: it cannot replace what it runs.
    target.chmod(0o555 if shared else 0o700)
    return str(target)
