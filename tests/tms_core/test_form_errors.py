"""The one module that puts serializer and service errors on Django forms (admin and pages)."""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework.exceptions import ValidationError as DrfValidationError

from tms_core.errors import ConflictError, InvalidInput
from tms_core.form_errors import add_errors, add_service_errors, error_map, exception_messages


class NameForm(forms.Form):
    name = forms.CharField(required=False)
    start = forms.CharField(required=False)


def _bound() -> NameForm:
    form = NameForm({})
    assert form.is_valid()
    return form


def test_a_named_field_gets_its_messages_and_the_rest_goes_above_the_form_with_its_name() -> None:
    form = _bound()
    add_service_errors(
        form,
        InvalidInput({"name": ["Too long."], "config": {"url": ["Enter a valid URL."]}, "non_field_errors": ["No."]}),
    )
    assert form.errors["name"] == ["Too long."]
    assert form.non_field_errors() == ["config: url: Enter a valid URL.", "No."]


def test_field_map_puts_an_api_field_on_the_form_field_named_otherwise() -> None:
    form = _bound()
    add_errors(form, {"start_at": ["Must have an offset."]}, field_map={"start_at": "start"})
    assert form.errors == {"start": ["Must have an offset."]}


def test_serializer_domain_and_django_errors_all_land_on_the_form() -> None:
    form = _bound()
    add_service_errors(form, DrfValidationError({"name": ["Required."]}))
    add_service_errors(form, ConflictError("Already finished."))
    add_service_errors(form, DjangoValidationError({"__all__": ["Overlaps."], "start": ["Bad."]}))
    assert form.errors["name"] == ["Required."] and form.errors["start"] == ["Bad."]
    assert form.non_field_errors() == ["Already finished.", "Overlaps."]


def test_messages_for_buttons_without_a_form_name_their_field() -> None:
    exc = InvalidInput({"detail": ["Paused."], "end_at": ["Before start."]})
    assert exception_messages(exc) == ["Paused.", "end_at: Before start."]
    assert error_map(exc) == {"__all__": ["Paused."], "end_at": ["Before start."]}
