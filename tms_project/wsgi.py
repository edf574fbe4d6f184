"""The WSGI application gunicorn serves.

Defaults to the production settings: only a deployment serves through WSGI (``make run`` uses
``manage.py runserver``, which names the local settings before loading this module).
"""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tms_project.settings.production")
application = get_wsgi_application()
