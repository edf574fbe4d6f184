"""Settings package.

- ``base``: everything shared, read from the environment; no secret key of its own.
- ``local``: a checkout (``make run``; the default of ``manage.py`` and ``celery``): DEBUG on, the
  public development key allowed, human-readable logs.
- ``production``: the docker image (``DJANGO_SETTINGS_MODULE`` set there; the default of
  ``wsgi``): refuses to start without a real secret key, with DEBUG on or without allowed hosts.
- ``test``: the pytest suite, on the real PostgreSQL and RabbitMQ.
"""
