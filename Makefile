# TMS: `make run` starts the whole platform, `make test` runs the whole suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8000
FLOWER_PORT ?= 5555

.PHONY: run test install services lint format migrate clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: requirements.txt | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	touch $@

install: $(VENV)/.installed

migrate: install
	$(BIN)/python manage.py migrate --noinput

## Start web (API + admin), worker, beat, monitor and Flower; Ctrl-C stops them all.
run: migrate
	$(BIN)/python manage.py tms_demo --port $(PORT) --flower-port $(FLOWER_PORT)
	PATH="$(abspath $(BIN)):$$PATH" PORT=$(PORT) FLOWER_PORT=$(FLOWER_PORT) DJANGO_DEBUG=$${DJANGO_DEBUG:-true} \
		$(BIN)/honcho --procfile tms_project/Procfile --app-root . start

## Check (or start) PostgreSQL and RabbitMQ, then run the whole suite against them.
test: install services
	$(BIN)/pytest

services:
	bash tests/ensure_services.sh

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf var/ .pytest_cache .ruff_cache
