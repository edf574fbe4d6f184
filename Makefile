# TMS: `make run` starts the whole platform, `make test` runs the whole suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8000
FLOWER_PORT ?= 5555
# prometheus_client multiprocess folder of `make run` (emptied at each start; tms_core/metrics.py)
METRICS_DIR ?= var/metrics

.PHONY: run test bench install services browser axe sandbox prometheus pgbouncer patroni haproxy lint docs format migrate clean ha-broker ha-pgbouncer ha-db ha-haproxy

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# requirements.txt: what TMS needs to run (all the docker image installs); requirements-dev.txt:
# that plus the tests, the linters and make run's process manager.
$(VENV)/.installed: requirements.txt requirements-dev.txt | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

migrate: install
	$(BIN)/python manage.py migrate --noinput

## Start web (API + admin), worker, beat, monitor and Flower; Ctrl-C stops them all (tooling/run_platform.py:
## honcho, once no earlier make run of this checkout is found still running). The back office
## links Flower where this starts it (TMS_FLOWER_URL from FLOWER_PORT, unless TMS_FLOWER_URL is set),
## and trigger, upload and callback URLs point at PORT (TMS_PUBLIC_URL, unless it is set).
run: migrate
	$(BIN)/python manage.py tms_demo --port $(PORT) --flower-port $(FLOWER_PORT)
	PROMETHEUS_MULTIPROC_DIR=$(METRICS_DIR) $(BIN)/python -c 'from tms_core.metrics import clean_multiproc_dir; clean_multiproc_dir()'
	PATH="$(abspath $(BIN)):$$PATH" PORT=$(PORT) FLOWER_PORT=$(FLOWER_PORT) DJANGO_DEBUG=$${DJANGO_DEBUG:-true} \
		TMS_FLOWER_URL="$${TMS_FLOWER_URL:-http://127.0.0.1:$(FLOWER_PORT)}" PROMETHEUS_MULTIPROC_DIR=$(METRICS_DIR) \
		TMS_PUBLIC_URL="$${TMS_PUBLIC_URL:-http://127.0.0.1:$(PORT)}" \
		$(BIN)/python -m tooling.run_platform --procfile tms_project/Procfile --app-root . start

## Lint, check (or start) PostgreSQL and RabbitMQ, then run the whole suite against them: most of it
## in TEST_WORKERS parallel pytest processes (pytest-xdist; its tests mostly wait on real worker
## and monitor processes), then tests/outages alone, since they restart the services every other
## test uses. Both parts run; either failing fails the target.
TEST_WORKERS ?= 2
test: install lint services browser axe sandbox prometheus pgbouncer patroni haproxy
	@status=0; \
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal --ignore=tests/outages || status=$$?; \
	$(BIN)/pytest tests/outages || status=$$?; \
	exit $$status

## The main benchmark scenarios (tms_bench: burst, herd of 1,000, sustained load at half and 75 % of
## the burst rate and at 123 and 500 runs/s, each beside Celery's own ETA tasks, create) in under
## 10 minutes on the configured PostgreSQL and RabbitMQ, each headline figure printed beside the one
## recorded in BENCH_BASELINE and marked when worse by more than the noise the run measured (on
## another machine than the record's, only the ratios to bare Celery; the rest for reference).
## `make bench RECORD=1` records this run's figures there instead (do it on purpose, when a change
## and its figures are accepted).
## Never part of make test: timings are figures to read, not assertions.
BENCH_BASELINE ?= docs/bench-baseline.json
# The loopback services unless the environment names others (--prepare creates the database if missing),
# on queues of the benchmark's own: a worker of another run on the same broker would take its messages.
BENCH_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/tms_bench
BENCH_BROKER_URL ?= amqp://guest:guest@127.0.0.1:5672//
bench: install services
	DATABASE_URL=$${DATABASE_URL:-$(BENCH_DATABASE_URL)} CELERY_BROKER_URL=$${CELERY_BROKER_URL:-$(BENCH_BROKER_URL)} \
	TMS_QUEUE=$${TMS_QUEUE:-tms.bench} TMS_NOTIFY_QUEUE=$${TMS_NOTIFY_QUEUE:-tms.bench.notify} \
	DJANGO_SETTINGS_MODULE=$${DJANGO_SETTINGS_MODULE:-tms_project.settings.local} DJANGO_DEBUG=false \
		$(BIN)/python manage.py tms_bench --scenario burst --scenario herd --scenario sustained --scenario create \
		--herd-soon --sustained-share 0.5 --sustained-share 0.75 --sustained-rate 123 --sustained-rate 500 --prepare --json var/bench/last.json \
		--compare $(BENCH_BASELINE) $(if $(RECORD),--record)

## Shell snippets of the recipes below that install Debian's packages a test needs. CHOOSE_SUDO
## sets $sudo: empty as root, "sudo" where sudo asks for no password, "none" otherwise;
## NEED_SUDO does the same but stops with the recipe's $need instead of "none". apt_install
## installs the packages $(1) with $sudo, quietly; if that fails it stops, naming $(2) and $need.
CHOOSE_SUDO = if [ "$$(id -u)" = 0 ]; then sudo=""; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo"; \
	else sudo="none"; fi
NEED_SUDO = $(CHOOSE_SUDO); [ "$$sudo" != none ] || { echo "$$need" >&2; exit 1; }
apt_install = $$sudo apt-get update -q >/dev/null \
	&& DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q $(1) >/dev/null \
	|| { echo "Installing $(2) failed. $$need" >&2; exit 1; }

## Chromium and chromedriver for the browser tests (tests/browser), from Debian's packages:
## installed as root (or with sudo) when missing; otherwise stop and say what to install.
CHROMIUM ?= /usr/bin/chromium
CHROMEDRIVER ?= /usr/bin/chromedriver
browser:
	@if [ -x "$(CHROMIUM)" ] && [ -x "$(CHROMEDRIVER)" ]; then exit 0; fi; \
	need="The browser tests need Chromium and its WebDriver: install Debian's packages with 'apt-get install -y chromium chromium-driver' (as root), then run make test again."; \
	$(NEED_SUDO); \
	echo "Installing chromium and chromium-driver for the browser tests..."; \
	$(call apt_install,chromium chromium-driver,chromium and chromium-driver); \
	[ -x "$(CHROMIUM)" ] && [ -x "$(CHROMEDRIVER)" ] || { echo "$$need" >&2; exit 1; }

## axe-core for the accessibility checks of the browser tests (tests/browser/axe.py): npm's package,
## pinned, installed into the virtualenv (not the repository) with Debian's npm; npm is installed as
## root (or with sudo) when missing, otherwise stop and say what to install.
AXE_VERSION ?= 4.14.1
AXE_DIR := $(VENV)/axe
$(AXE_DIR)/.installed-$(AXE_VERSION): | $(BIN)/python
	@if ! command -v npm >/dev/null 2>&1; then \
		need="The accessibility tests need npm to install axe-core: install Debian's package with 'apt-get install -y npm' (as root), then run make test again."; \
		$(NEED_SUDO); \
		echo "Installing npm for the accessibility tests..."; \
		$(call apt_install,npm,npm); \
	fi
	rm -rf $(AXE_DIR) && mkdir -p $(AXE_DIR)
	npm install --prefix $(AXE_DIR) --no-save --no-package-lock --no-audit --no-fund --silent axe-core@$(AXE_VERSION)
	@test -f $(AXE_DIR)/node_modules/axe-core/axe.min.js || { echo "npm did not install axe-core $(AXE_VERSION)" >&2; exit 1; }
	touch $@

axe: $(AXE_DIR)/.installed-$(AXE_VERSION)

## Sandboxed subprocess runs (runners/sandbox.py): bubblewrap, slirp4netns and nftables from Debian's
## packages (slirp4netns and nft give a run with egress open its filtered network) and the run users
## (manage.py tms_sandbox_setup), as root (or with sudo); otherwise stop and say what is missing.
BWRAP ?= /usr/bin/bwrap
SLIRP4NETNS ?= /usr/bin/slirp4netns
NFT ?= /usr/sbin/nft
sandbox: install
	@$(CHOOSE_SUDO); \
	need="Sandboxed runs need bubblewrap, slirp4netns, nftables and the run users: as root, run 'apt-get install -y bubblewrap slirp4netns nftables iproute2' and '$(BIN)/python manage.py tms_sandbox_setup', then make test again."; \
	if [ ! -x "$(BWRAP)" ] || [ ! -x "$(SLIRP4NETNS)" ] || [ ! -x "$(NFT)" ] || ! command -v ip >/dev/null 2>&1; then \
		[ "$$sudo" != none ] || { echo "$$need" >&2; exit 1; }; \
		echo "Installing bubblewrap, slirp4netns, nftables and iproute2 for sandboxed subprocess runs..."; \
		$(call apt_install,bubblewrap slirp4netns nftables iproute2,the sandbox's packages); \
	fi; \
	if ! $(BIN)/python manage.py tms_sandbox_setup --check >/dev/null 2>&1; then \
		[ "$$sudo" != none ] || { echo "$$need" >&2; exit 1; }; \
		$$sudo $(BIN)/python manage.py tms_sandbox_setup || { echo "$$need" >&2; exit 1; }; \
	fi

## A Debian package a test needs, installed as root (or with sudo) when its binary $(1) is
## missing, its own service stopped and disabled (the tests start private ones); otherwise stop
## and say what to install. $(2): the package; $(3): who needs it (`The X tests need`); $(4): the
## same for the progress line (`the X tests`).
define debian_package
	@if [ -x "$(1)" ]; then exit 0; fi; \
	need="$(3) Debian's $(2): install it with 'apt-get install -y $(2)' (as root), then run make test again."; \
	$(NEED_SUDO); \
	echo "Installing $(2) for $(4)..."; \
	$(call apt_install,$(2),$(2)); \
	if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then \
		$$sudo systemctl disable --now $(2) >/dev/null 2>&1 || true; \
	else \
		$$sudo service $(2) stop >/dev/null 2>&1 || true; \
	fi; \
	[ -x "$(1)" ] || { echo "$$need" >&2; exit 1; }
endef

## PgBouncer for the tests of TMS behind a transaction-pooling pooler (tests/ha/test_pgbouncer.py,
## tooling/harness/pgbouncer.py, which starts a private one on a free port): Debian's package, as
## debian_package does it (the package's own service, on port 6432, is stopped and disabled).
PGBOUNCER_BIN ?= /usr/sbin/pgbouncer
pgbouncer:
	$(call debian_package,$(PGBOUNCER_BIN),pgbouncer,The PgBouncer tests need,the PgBouncer tests)

## Prometheus and promtool for the metrics checks (tests/ops/test_prometheus.py), from Debian's
## package `prometheus` at a pinned version, unpacked into $(PROMETHEUS_DIR), not installed: installing
## it would start a Prometheus service on port 9090. apt-get download needs Debian's package lists
## (apt-get update, as root or with sudo, when they lack the package); otherwise stop and say so.
PROMETHEUS_VERSION ?= 2.42.0+ds-5+deb12u1
PROMETHEUS_DIR ?= var/tools/prometheus
prometheus:
	@stamp="$(PROMETHEUS_DIR)/version"; \
	if [ -x "$(PROMETHEUS_DIR)/usr/bin/prometheus" ] && [ -x "$(PROMETHEUS_DIR)/usr/bin/promtool" ] \
		&& [ "$$(cat $$stamp 2>/dev/null)" = "$(PROMETHEUS_VERSION)" ]; then exit 0; fi; \
	need="The metrics checks need Debian's prometheus package $(PROMETHEUS_VERSION) (prometheus and promtool): as root, run 'apt-get update', then make test again."; \
	$(CHOOSE_SUDO); \
	echo "Unpacking Debian's prometheus $(PROMETHEUS_VERSION) into $(PROMETHEUS_DIR) for the metrics checks..."; \
	rm -rf "$(PROMETHEUS_DIR)" && mkdir -p "$(PROMETHEUS_DIR)/deb" && cd "$(PROMETHEUS_DIR)/deb" || exit 1; \
	if ! apt-get download -q "prometheus=$(PROMETHEUS_VERSION)" >/dev/null 2>&1; then \
		[ "$$sudo" != none ] || { echo "$$need" >&2; exit 1; }; \
		$$sudo apt-get update -q >/dev/null && apt-get download -q "prometheus=$(PROMETHEUS_VERSION)" >/dev/null 2>&1 \
			|| { echo "Downloading prometheus $(PROMETHEUS_VERSION) failed. $$need" >&2; exit 1; }; \
	fi; \
	dpkg-deb -x prometheus_*.deb .. && cd .. && rm -rf deb && echo "$(PROMETHEUS_VERSION)" > version \
		&& [ -x usr/bin/prometheus ] && [ -x usr/bin/promtool ] || { echo "Unpacking prometheus failed. $$need" >&2; exit 1; }

services:
	bash tests/ensure_services.sh

## A private three-node RabbitMQ cluster of the installed rabbitmq-server (tooling/harness/rabbit_cluster.py)
## to try TMS on: AMQP on 127.0.0.1:56721-56723, data under /tmp/tms-ha-rabbit-*, no plugins; never
## the shared node on 5672. It prints the CELERY_BROKER_URL failover list to give TMS's processes,
## takes `stop N`, `kill N`, `start N` and `status` from the terminal, and Ctrl-C (or `quit`)
## stops every node and deletes its folder. The tests of tests/ha start their own, on free ports.
ha-broker: install
	$(BIN)/python -m tooling.harness.rabbit_cluster

## A private PgBouncer (transaction pooling, a free port) in front of the local PostgreSQL, for a
## person to try TMS behind it: prints the settings to export; Ctrl-C stops it.
ha-pgbouncer: install pgbouncer
	$(BIN)/python -m tooling.harness.pgbouncer

## Patroni and etcd for the PostgreSQL failover tests (tests/ha, tooling/harness/pg_cluster.py), from
## Debian's packages, installed as root (or with sudo) when missing; otherwise stop and say what to
## install. The tests start their own etcd and Patroni on private ports: the etcd service the package
## may start on the default port 2379 is stopped (and its boot-time start disabled).
PATRONI ?= /usr/bin/patroni
ETCD ?= /usr/bin/etcd
patroni:
	@if [ -x "$(PATRONI)" ] && [ -x "$(ETCD)" ]; then exit 0; fi; \
	need="The PostgreSQL failover tests need Patroni and etcd: install Debian's packages with 'apt-get install -y patroni etcd-server etcd-client' (as root), stop the etcd service it starts ('service etcd stop'), then run make test again."; \
	$(NEED_SUDO); \
	echo "Installing patroni, etcd-server and etcd-client for the PostgreSQL failover tests..."; \
	$(call apt_install,patroni etcd-server etcd-client,patroni and etcd); \
	$$sudo service etcd stop >/dev/null 2>&1 || true; \
	if command -v systemctl >/dev/null 2>&1; then $$sudo systemctl disable --now etcd patroni >/dev/null 2>&1 || true; fi; \
	[ -x "$(PATRONI)" ] && [ -x "$(ETCD)" ] || { echo "$$need" >&2; exit 1; }

## A private Patroni-managed PostgreSQL pair (etcd, two PostgreSQL 15 nodes on free ports, under a
## /tmp/tms-ha-pg-* folder) for a person to try: prints its DATABASE_URL, takes kill / switchover /
## status / quit.
ha-db: install patroni
	$(BIN)/python -m tooling.harness.pg_cluster

## HAProxy for the PostgreSQL failover test through one address (tests/ha/test_haproxy_failover.py,
## tooling/harness/haproxy.py, which runs docker/haproxy/haproxy.cfg on free ports): Debian's
## package, as debian_package does it (the package's own service, /etc/haproxy, is stopped and disabled).
HAPROXY ?= /usr/sbin/haproxy
haproxy:
	$(call debian_package,$(HAPROXY),haproxy,The HAProxy failover test needs,the HAProxy failover test)

## The private Patroni pair of ha-db with HAProxy in front of it (docker/haproxy/haproxy.cfg on a
## free port): prints the single-host DATABASE_URL, takes kill / switchover / status / quit.
ha-haproxy: install patroni haproxy
	$(BIN)/python -m tooling.harness.haproxy

## ruff (style and common bugs), mypy (types, with the Django and DRF plugins; configured in
## pyproject.toml) and the documentation site built strictly (a broken link or anchor, or a page
## missing from the nav of mkdocs.yml, fails).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(MKDOCS) build --strict

## The documentation site (MkDocs, Material theme) from docs/ into var/site: open var/site/index.html.
## NO_MKDOCS_2_WARNING silences the theme's notice about its own future, printed on every build.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs
docs: install
	$(MKDOCS) build --strict

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf var/ .pytest_cache .ruff_cache .mypy_cache
