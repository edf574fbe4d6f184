"""The team concept's REST layer, above its domain (:mod:`tasks_app.teams`): ``/api/v1/teams`` and
their members (:mod:`.api`), and the plumbing every API over team-owned rows shares (:mod:`.scope`:
views that see the caller's teams' rows, the ``team`` field, ``?team=``). Below the engine's API
(``executions/api.py`` uses the scope), above the task core."""
