"""The API's JSON parser: DRF's, with bounds on size and nesting."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
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
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        # DRF reads a JSON body from the request's stream, past Django's DATA_UPLOAD_MAX_MEMORY_SIZE
        # check (which only guards request.body and form data): apply the same bound here, reading
        # one byte more than it allows, never the whole body. The API answers 413 (api.errors).
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and stream is not None:
            body = stream.read(limit + 1)
            if len(body) > limit:
                raise RequestDataTooBig(f"Request body exceeded DATA_UPLOAD_MAX_MEMORY_SIZE ({limit}).")
            stream = io.BytesIO(body)
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested more than {MAX_DEPTH} levels deep.") from None
        if _depth_exceeds(data, MAX_DEPTH):
            raise ParseError(f"JSON parse error - nested more than {MAX_DEPTH} levels deep.")
        return data
