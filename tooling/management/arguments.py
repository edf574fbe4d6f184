"""argparse types shared by the management commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def positive(kind: type) -> Callable[[str], Any]:
    """An argparse type: ``kind(text)``, refused (a usage error) unless greater than zero."""

    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise ValueError(text)
        return value

    parse.__name__ = kind.__name__
    return parse
