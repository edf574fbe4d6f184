"""The docker image installs the runtime requirements only: requirements.txt holds what TMS needs to
run, requirements-dev.txt adds the tests, linters and `make run`'s process manager, and every
production module loads with nothing of the development set importable."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata

from cryptography.fernet import Fernet
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.processes import ROOT

RUNTIME = ROOT / "requirements.txt"
DEV = ROOT / "requirements-dev.txt"
#: What the image runs: the product's packages and the installed apps (tooling is left out of the
#: image: the production settings do not install it).
IMAGE_PACKAGES = (
    "tms_core",
    "runners",
    "tasks_app",
    "executions",
    "tasks_api",
    "notifications",
    "tms_project",
    "ops",
    "backoffice",
)


def pins(path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Distribution name -> pinned version of each requirement line (includes are skipped)."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-r "):
            continue
        requirement = Requirement(line)
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"{path.name}: {line} is not pinned"
        found[canonicalize_name(requirement.name)] = specifier.version
    return found


def runtime_closure() -> set[str]:
    """The runtime requirements and everything they need, as installed here."""
    seen: set[str] = set()
    todo = list(pins(RUNTIME))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for line in metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return seen


def test_runtime_and_dev_requirements_are_split_and_pinned():
    runtime, dev = pins(RUNTIME), pins(DEV)
    assert not set(runtime) & set(dev), "a requirement is listed twice"
    assert re.search(r"^-r requirements\.txt$", DEV.read_text(), flags=re.MULTILINE)
    for tool in ("pytest", "pytest-django", "ruff", "mypy", "honcho", "selenium", "hypothesis", "schemathesis"):
        assert tool in dev and tool not in runtime, tool
    for needed in ("django", "celery", "gunicorn", "psycopg2-binary", "prometheus-client", "python-json-logger"):
        assert needed in runtime, needed
    # What is installed here is what the files pin.
    for name, version in {**runtime, **dev}.items():
        assert metadata.version(name) == version, name


def test_the_image_installs_the_runtime_requirements_only_and_make_install_both():
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "requirements-dev" not in dockerfile
    assert dockerfile.count("--requirement requirements.txt") == 2  # wheels built, then installed
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install --quiet -r requirements-dev.txt" in makefile
    assert re.search(r"^\$\(VENV\)/\.installed: requirements\.txt requirements-dev\.txt", makefile, re.MULTILINE)


def test_every_module_of_the_image_loads_without_the_development_packages():
    """As in the image: the development-only distributions (and what only they need) cannot be
    imported, and every module loads, the WSGI and Celery apps start and `check` passes."""
    runtime = runtime_closure()
    blocked = sorted(
        {
            module
            for module, distributions in metadata.packages_distributions().items()
            if not {canonicalize_name(d) for d in distributions} & runtime and not module.startswith("_")
        }
    )
    assert {"pytest", "honcho", "selenium", "hypothesis", "mypy"} <= set(blocked)
    script = f"""
import importlib, importlib.abc, pkgutil, sys
BLOCKED = set({blocked!r}) | {{"tooling"}}  # not in the image (docker/Dockerfile.dockerignore)

class DevOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{{name}} is not in the image", name=name)
        return None

sys.meta_path.insert(0, DevOnly())
import django
django.setup()
import tms_project.wsgi, tms_project.celery
loaded = 0
for package in {IMAGE_PACKAGES!r}:
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        importlib.import_module(info.name)
        loaded += 1
from django.core.management import call_command
call_command("check")
print("loaded", loaded)
"""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tms_project.settings.production",
        "DJANGO_SECRET_KEY": "x" * 10 + "production-like-key-for-the-import-check-0123456789",
        "DJANGO_ALLOWED_HOSTS": "tms.example",
        # A key of its own: production refuses the test settings' (a key from the repository).
        "TMS_SECRET_KEYS": Fernet.generate_key().decode(),
    }
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split("loaded", 1)[1]) > 100
