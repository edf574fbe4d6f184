#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main() -> None:
    # A checkout runs the local settings; the docker image sets DJANGO_SETTINGS_MODULE to production.
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tms_project.settings.local")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
