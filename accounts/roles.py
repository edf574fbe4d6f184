"""What an identity provider's group may grant (``TMS_OIDC_GROUPS``: group -> role).

Today: ``staff`` (read-only support: sees everyone's tasks and runs, as the staff flag does) and
``superuser`` (everything, the admin included). Team roles (e.g. ``team:<team>:<role>``) will be
added to :data:`ROLES` once teams exist, and map through the same setting; a value not listed is
refused at start-up. No Django import here: the settings read it.
"""

from __future__ import annotations

STAFF = "staff"
SUPERUSER = "superuser"
ROLES = frozenset({STAFF, SUPERUSER})
