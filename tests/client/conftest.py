"""What an outside client meets: a Python client generated from the live schema by
openapi-python-client, talking HTTP to a live server, with openapi-core validating every request
it sends and every response it gets against that same schema.

The client is generated once per test session (a few seconds), offline, from the schema the live
server serves; every test of this folder then drives the API through it. A request or response
the schema does not describe fails the test that made it, with openapi-core's reasons.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import requests
from openapi_core import OpenAPI
from openapi_core.datatypes import RequestParameters
from werkzeug.datastructures import Headers, ImmutableMultiDict

from tests.conftest import account_key_for

#: The generated package's name (``import tms_client``).
PACKAGE = "tms_client"


def generate_client(schema: dict[str, Any], folder: Path) -> ModuleType:
    """Generate the client for ``schema`` into ``folder`` and import it.

    Runs openapi-python-client as a user would (its command line, no network: the schema is a
    file), without its post-generation hooks (they format the code with a ruff on PATH). Any
    generator warning fails: it means part of the schema could not be turned into a client.
    """
    schema_file, config_file = folder / "schema.json", folder / "config.yaml"
    schema_file.write_text(json.dumps(schema))
    config_file.write_text(f"post_hooks: []\nproject_name_override: {PACKAGE}\npackage_name_override: {PACKAGE}\n")
    output = folder / PACKAGE
    argv = [sys.executable, "-m", "openapi_python_client", "generate", "--path", str(schema_file)]
    argv += ["--config", str(config_file), "--meta", "none", "--output-path", str(output), "--overwrite"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    said = done.stdout + done.stderr
    if "No module named openapi_python_client" in said:
        pytest.fail("openapi-python-client is not installed: run `make install` (requirements-dev.txt pins it)")
    assert done.returncode == 0, said
    assert "Warning" not in said and "Error" not in said, said
    sys.path.insert(0, str(folder))
    for name in [name for name in sys.modules if name == PACKAGE or name.startswith(f"{PACKAGE}.")]:
        del sys.modules[name]  # a client generated earlier in this process (another schema)
    return importlib.import_module(PACKAGE)


def api(module: str) -> ModuleType:
    """One generated operation module, e.g. ``api("tasks.tasks_partial_update")``."""
    return importlib.import_module(f"{PACKAGE}.api.{module}")


def models() -> ModuleType:
    """The generated models (``models().TaskCreateNoopRequest``, ...)."""
    return importlib.import_module(f"{PACKAGE}.models")


# --- openapi-core around httpx ------------------------------------------------------------------


class _OpenAPIRequest:
    """An httpx request as openapi-core reads one (its ``Request`` protocol)."""

    def __init__(self, request: httpx.Request) -> None:
        url = request.url
        self.host_url = f"{url.scheme}://{url.netloc.decode()}"
        self.path = url.path
        self.method = request.method.lower()
        self.body: bytes | None = request.content or None
        self.content_type = request.headers.get("Content-Type", "")
        self.parameters = RequestParameters(
            query=ImmutableMultiDict(list(url.params.multi_items())),
            header=Headers(list(request.headers.multi_items())),
            cookie=ImmutableMultiDict(),
        )


class _OpenAPIResponse:
    """An httpx response as openapi-core reads one (its ``Response`` protocol)."""

    def __init__(self, response: httpx.Response) -> None:
        self.status_code = response.status_code
        self.headers = Headers(list(response.headers.multi_items()))
        self.content_type = response.headers.get("Content-Type", "")
        self.data: bytes | None = response.content


class ValidatingTransport(httpx.BaseTransport):
    """Sends each request over real HTTP, and validates it and its response against the schema
    (openapi-core): a request or an answer the schema does not describe is an AssertionError
    naming the operation and openapi-core's reasons. ``exchanges`` records what was validated."""

    def __init__(self, spec: OpenAPI) -> None:
        self.spec = spec
        self.inner = httpx.HTTPTransport()
        self.exchanges: list[tuple[str, str, int]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        openapi_request = _OpenAPIRequest(request)
        what = f"{request.method} {request.url.path}"
        outcome = self.spec.unmarshal_request(openapi_request)
        if outcome.errors:
            raise AssertionError(f"{what}: the request does not match the schema: {_reasons(outcome.errors)}")
        response = self.inner.handle_request(request)
        response.read()
        result = self.spec.unmarshal_response(openapi_request, _OpenAPIResponse(response))
        if result.errors:
            raise AssertionError(
                f"{what} answered {response.status_code}, which does not match the schema: "
                f"{_reasons(result.errors)}\n{response.text[:2000]}"
            )
        self.exchanges.append((request.method, request.url.path, response.status_code))
        return response

    def close(self) -> None:
        self.inner.close()


def _reasons(errors: list[Exception]) -> str:
    """openapi-core's errors with their causes (a schema error lists each failing keyword)."""
    lines = []
    for error in errors:
        lines.append(repr(error))
        cause = error.__cause__
        while cause is not None:
            lines.append(f"  caused by {cause!r}")
            for sub in getattr(cause, "schema_errors", ()) or ():
                lines.append(f"    {sub.message} at {list(sub.absolute_path)}")
            cause = cause.__cause__
    return "\n".join(lines)


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def live_schema(live_server) -> dict[str, Any]:
    """The schema as the live server serves it to clients."""
    response = requests.get(f"{live_server.url}/api/schema/?format=json", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="session")
def generated_client(live_schema, tmp_path_factory) -> ModuleType:
    """The client openapi-python-client generates from the live schema (once per session)."""
    return generate_client(live_schema, tmp_path_factory.mktemp("generated-client"))


@pytest.fixture(scope="session")
def openapi_spec(live_schema) -> OpenAPI:
    return OpenAPI.from_dict(live_schema)


class Session:
    """A generated ``AuthenticatedClient`` for one user whose every exchange is validated."""

    def __init__(self, package: ModuleType, spec: OpenAPI, base_url: str, key: str, **kwargs: Any) -> None:
        self.transport = ValidatingTransport(spec)
        self.client = package.AuthenticatedClient(
            base_url=base_url,
            token=key,
            raise_on_unexpected_status=True,
            timeout=httpx.Timeout(30),
            httpx_args={"transport": self.transport},
            **kwargs,
        )

    def call(self, module: str, *args: Any, expect: int = 200, **kwargs: Any) -> Any:
        """Call operation ``module`` (``"tasks.tasks_create"``); assert its status, return the parsed body."""
        response = api(module).sync_detailed(*args, client=self.client, **kwargs)
        assert response.status_code == expect, (module, response.status_code, response.content[:2000])
        return response.parsed


@pytest.fixture
def client_session(generated_client, openapi_spec, live_server, user) -> Iterator[Session]:
    """``user``'s generated client on the live server (it sends ``Authorization: Bearer <key>``,
    the generated client's default)."""
    key = account_key_for(user)
    session = Session(generated_client, openapi_spec, live_server.url, key)
    yield session
    session.transport.close()
