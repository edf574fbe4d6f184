"""A real OpenID Connect provider for the SSO tests: oidc-provider-mock on 127.0.0.1, a free port.

Run as a script (``python oidc_provider_server.py``): it binds port 0, prints ``listening <port>``
and serves until killed. A test picks who signs in by posting a ``sub`` to the provider's
authorization form, and sets that subject's claims first with ``PUT /users/<sub>`` (JSON).
"""

import os

# The mock speaks plain HTTP on the loopback; authlib refuses that unless told.
os.environ["AUTHLIB_INSECURE_TRANSPORT"] = "1"

import werkzeug.serving
from oidc_provider_mock import app

server = werkzeug.serving.make_server("127.0.0.1", 0, app(require_nonce=True), threaded=True)
print(f"listening {server.server_port}", flush=True)
server.serve_forever()
