#!/bin/sh
# Patroni's post_bootstrap (docker/patroni/patroni.yml): run once, on the node that initialised the
# cluster, with a superuser connection string as $1. Creates the role and the database TMS uses
# (DATABASE_URL of docker/compose.ha.yaml); the standby gets them by replication. The password is
# passed as a psql variable, quoted by psql (:'password'), never spliced into the SQL text.
set -eu
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD in docker/.env}"
psql "$1" -v ON_ERROR_STOP=1 -v password="$POSTGRES_PASSWORD" <<'SQL'
CREATE ROLE tms LOGIN PASSWORD :'password';
CREATE DATABASE tms OWNER tms;
SQL
