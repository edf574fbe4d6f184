"""What every API view and serializer shares: owner scoping and strict input."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework import serializers


class OwnerScopedMixin:
    """Restricts a view's queryset to the requesting user's rows; staff see everything.

    Every view over user data inherits this, so another owner's ids answer 404. ``owner_field``
    names the lookup from the model to its owning user.
    """

    owner_field: str = "owner"

    def get_queryset(self) -> QuerySet:
        queryset = super().get_queryset()  # type: ignore[misc]
        user = self.request.user  # type: ignore[attr-defined]
        if getattr(self, "swagger_fake_view", False):
            return queryset.none()
        if user.is_staff:
            return queryset
        return queryset.filter(**{self.owner_field: user})


class StrictInputMixin:
    """Rejects fields the serializer does not know, instead of silently ignoring them."""

    def to_internal_value(self, data: Any) -> Any:
        unknown: dict[str, list[str]] = {}
        if isinstance(data, dict):
            known = set(self.fields)  # type: ignore[attr-defined]
            unknown = {key: ["Unknown field."] for key in data if key not in known}
        try:
            value = super().to_internal_value(data)  # type: ignore[misc]
        except serializers.ValidationError as exc:
            if unknown and isinstance(exc.detail, dict):
                raise serializers.ValidationError({**exc.detail, **unknown}) from None
            raise
        if unknown:
            raise serializers.ValidationError(unknown)
        return value
