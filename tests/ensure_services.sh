#!/usr/bin/env bash
# Make sure the PostgreSQL and RabbitMQ the suite needs are reachable. Local services that are
# installed but stopped are started; otherwise this fails and says what to start.
set -u
PGHOST=${PGHOST:-127.0.0.1}; PGPORT=${PGPORT:-5432}
AMQP_HOST=${AMQP_HOST:-127.0.0.1}; AMQP_PORT=${AMQP_PORT:-5672}

reachable() { timeout 2 bash -c ">/dev/tcp/$1/$2" 2>/dev/null; }

wait_for() {  # name host port seconds
  for _ in $(seq 1 "$4"); do reachable "$2" "$3" && return 0; sleep 1; done
  return 1
}

if ! reachable "$PGHOST" "$PGPORT"; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    echo "PostgreSQL is not reachable on $PGHOST:$PGPORT; starting the local cluster"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
  fi
  wait_for PostgreSQL "$PGHOST" "$PGPORT" 30 || {
    echo "ERROR: PostgreSQL is not reachable on $PGHOST:$PGPORT. Start PostgreSQL 15 (trust auth for user postgres)," >&2
    echo "       e.g. 'pg_ctlcluster --skip-systemctl-redirect 15 main start', or set DATABASE_URL." >&2
    exit 1
  }
fi

if ! reachable "$AMQP_HOST" "$AMQP_PORT"; then
  if command -v rabbitmq-server >/dev/null 2>&1; then
    echo "RabbitMQ is not reachable on $AMQP_HOST:$AMQP_PORT; starting the local broker"
    rabbitmq-server -detached || true
  fi
  wait_for RabbitMQ "$AMQP_HOST" "$AMQP_PORT" 60 || {
    echo "ERROR: RabbitMQ is not reachable on $AMQP_HOST:$AMQP_PORT. Start it ('rabbitmq-server -detached')," >&2
    echo "       or set CELERY_BROKER_URL." >&2
    exit 1
  }
fi
echo "PostgreSQL ($PGHOST:$PGPORT) and RabbitMQ ($AMQP_HOST:$AMQP_PORT) are reachable."
