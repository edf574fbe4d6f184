"""A module imported on first use, for the large client SDKs that only some runs need.

Every TMS process builds every configured runner at start (``runners.apps``), so that a bad
``TMS_RUNNERS`` entry fails at once; a runner's SDK, though, is only needed once it launches or
polls a run. The Kubernetes client and boto3 were about 0.6 s of CPU and 42 MB of each process's
start (``python -X importtime``), paid by web, beat and the monitor too, which never call them.
A Celery worker still imports them, before it forks its pool (``BaseRunner.preload``), so that its
pool processes share one copy.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule:
    """Stands for the module ``name`` and imports it at the first attribute read.

    An ``except lazy.SomeError:`` clause reads the attribute only when an exception reaches it,
    so a block whose exceptions come from the SDK has imported it by then.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def load(self) -> ModuleType:
        """The module, imported now if it was not yet."""
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return self._module

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.load(), attribute)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}{'' if self._module is None else ' (imported)'}>"
