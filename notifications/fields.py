"""A text column encrypted at rest with the task secrets' keys (:mod:`tasks_app.secrets`)."""

from __future__ import annotations

from typing import Any

from django.db import models

from tasks_app.secrets import text_open, text_seal


class SealedTextField(models.TextField):
    """Text stored as ``"$enc:<Fernet token>"`` and plain in memory.

    Written encrypted with the first key of ``TMS_SECRET_KEYS`` and decrypted when read, so code
    holding a model instance sees the plain value while the column never holds it. ``max_length``
    is validation only (the column is ``text``: a token is longer than its value). Lookups on the
    column cannot match (every encryption is different): nothing filters on it.
    """

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return value if value is None else text_open(value)

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        return text_seal(value) if isinstance(value, str) else value
