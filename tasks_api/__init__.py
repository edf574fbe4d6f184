"""Tasks as users see them, above the engine: the task services (every write from the API, the
admin, the back office and ``manage.py tms_task``), the REST API and its serializers, the read
selectors, the admin, named limits, the audit and artifact APIs and the original ``/tasks`` API.

The task core the engine needs (the models, schedules, secrets, quotas, audit log, artifacts) is
:mod:`tasks_app`, below :mod:`executions`; this package sits above both. An installed app with no
models of its own, so that the admin and ``manage.py tms_task`` are found.
"""
