"""The admin's forms that write through the services, as the API does (the same rules, the same
messages). The form saves while it is validated, inside the admin's transaction, so what a
service refuses becomes an error on the form's fields (:mod:`tms_core.form_errors`) and the
admin's own save has nothing left to do."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest

from tms_core.form_errors import SERVICE_ERRORS, add_service_errors


class ServiceModelForm(forms.ModelForm):
    """A ModelForm whose validation ends with :meth:`save_through_services` (not ModelForm's own
    model validation and save): the object the service returns becomes the form's instance."""

    #: Set by :meth:`ServiceFormAdmin.get_form`: the request (who acts, whose role is checked).
    request: HttpRequest

    def _post_clean(self) -> None:
        if self.errors:
            return
        try:
            with transaction.atomic():
                self.instance = self.save_through_services()
        except SERVICE_ERRORS as exc:
            add_service_errors(self, exc)
        except PermissionDenied as exc:  # a role the service checks: mostly the owner's in the team chosen
            self.add_error(self.refusal_field(), str(exc))

    def save_through_services(self) -> Any:
        """Create or change the object through its services (the form is valid); returns it."""
        raise NotImplementedError

    def refusal_field(self) -> str | None:
        """The field a refused permission is shown on: ``team`` where the form has it, else the form."""
        return "team" if "team" in self.fields else None


class ServiceFormAdmin(admin.ModelAdmin):
    """The admin of a :class:`ServiceModelForm`: gives the form the request, and saves nothing itself."""

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        assert issubclass(form, ServiceModelForm)  # modelform_factory subclasses self.form
        form.request = request  # a class made for this request by modelform_factory
        return form

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Nothing to do: the form saved the object through the services when it was validated."""
