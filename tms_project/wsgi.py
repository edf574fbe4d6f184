"""The WSGI application gunicorn serves.

Defaults to the production settings. ``make run`` serves it through the same gunicorn
configuration as the image (``docker/gunicorn.conf.py``) and names the local settings itself
(``tms_project/Procfile``).
"""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tms_project.settings.production")
application = get_wsgi_application()
