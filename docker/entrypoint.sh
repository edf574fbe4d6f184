#!/bin/sh
# TMS container entrypoint: one image, one role per container.
#
#   entrypoint.sh web       the API, admin and probes, served by gunicorn (docker/gunicorn.conf.py)
#   entrypoint.sh worker    a Celery worker (TMS_WORKER_CONCURRENCY processes, default 4)
#   entrypoint.sh beat      Celery beat with django_celery_beat's DatabaseScheduler
#   entrypoint.sh monitor   the monitor: publishes due executions
#   entrypoint.sh flower    Flower on FLOWER_PORT (default 5555); refuses to start without FLOWER_BASIC_AUTH
#   entrypoint.sh migrate   apply migrations (and register beat's system jobs), then exit
#   entrypoint.sh CMD ...   anything else runs as is, e.g. `python manage.py tms_check`
#
# Each role execs its process, so it receives the container's signals (SIGTERM on stop) itself.
set -eu

# The roles this script starts (a test checks that docker/compose.yaml runs each of them).
ROLES="web worker beat monitor flower migrate"

# The application is the folder above this script: /app in the image, the checkout in tests.
cd "$(dirname "$0")/.."

# Logging (level and format) comes from TMS_LOG_LEVEL and TMS_LOG_FORMAT only, read by the settings
# in every process (tms_project/celery.py takes over Celery's logging set-up, so Celery's
# -l/--loglevel would do nothing): no role passes a level of its own.

role="${1:-web}"
case "$role" in
    web)
        exec gunicorn --config docker/gunicorn.conf.py tms_project.wsgi
        ;;
    worker)
        exec celery -A tms_project worker \
            --concurrency "${TMS_WORKER_CONCURRENCY:-4}" --without-mingle --without-gossip
        ;;
    beat)
        # The schedule lives in PostgreSQL (DatabaseScheduler); no schedule or pid file on disk.
        exec celery -A tms_project beat --pidfile=
        ;;
    monitor)
        exec python manage.py run_monitor
        ;;
    flower)
        # Flower can inspect, revoke and rate-limit tasks: never expose it without credentials.
        if [ -z "${FLOWER_BASIC_AUTH:-}" ] && [ -z "${FLOWER_AUTH:-}" ]; then
            echo "entrypoint: flower needs FLOWER_BASIC_AUTH=user:password (or FLOWER_AUTH for OAuth)" >&2
            exit 64
        fi
        # Flower's metrics are its own, served at its own /metrics: kept in its memory, never in the
        # multiprocess folder the TMS roles share (the web's /metrics would serve them too).
        unset PROMETHEUS_MULTIPROC_DIR
        exec celery -A tms_project flower --address="${FLOWER_ADDRESS:-0.0.0.0}" --port="${FLOWER_PORT:-5555}"
        ;;
    migrate)
        # Runs once before every other role starts: empty the shared multiprocess metrics folder
        # (files of processes from an earlier start would otherwise be summed for ever).
        python -c 'from tms_core.metrics import clean_multiproc_dir; clean_multiproc_dir()'
        exec python manage.py migrate --noinput
        ;;
    help | -h | --help)
        echo "usage: entrypoint.sh ROLE | COMMAND [ARG ...]; roles: $ROLES"
        ;;
    *)
        exec "$@"
        ;;
esac
