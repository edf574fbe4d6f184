"""The API's JSON parser: DRF's, with a bound on nesting."""

from __future__ import annotations

from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError

#: Deepest nesting of arrays and objects a request body may have; more is refused with a 400
#: instead of exhausting the interpreter's recursion (in the decoder, or later, in validation).
MAX_DEPTH = 32


def _depth_exceeds(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


class JSONParser(parsers.JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested more than {MAX_DEPTH} levels deep.") from None
        if _depth_exceeds(data, MAX_DEPTH):
            raise ParseError(f"JSON parse error - nested more than {MAX_DEPTH} levels deep.")
        return data
