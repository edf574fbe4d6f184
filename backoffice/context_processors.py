"""Template context every back-office page shares."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest


def backoffice(request: HttpRequest) -> dict[str, Any]:
    """Links the navigation bar needs (Flower lives in its own process, on its own port). A page's
    own context must not reuse these names (the execution page's is ``flower_task_url``)."""
    return {"flower_url": settings.TMS_FLOWER_URL}
