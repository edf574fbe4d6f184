"""The dashboard at ``/``: placeholder until the rollup data is merged."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    return render(request, "backoffice/dashboard.html", {})


@login_required
def dashboard_fragment(request: HttpRequest) -> HttpResponse:
    return render(request, "backoffice/_dashboard_body.html", {})
