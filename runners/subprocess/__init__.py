"""The ``subprocess`` runner (moved into a package; split follows)."""

from runners.subprocess.runner import SUPERVISOR, SubprocessRunner, _process_started

__all__ = ["SUPERVISOR", "SubprocessRunner", "_process_started"]
