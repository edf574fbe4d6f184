"""Structured logs: the configuration from the environment, the execution ids on each line, and a
real worker and monitor whose stderr is JSON, line by line, with the ids on the execution's lines."""

from __future__ import annotations

import io
import json
import logging
import logging.config

import pytest

from executions.models import Execution
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tests.factories import UserFactory
from tests.processes import running, start_monitor, start_worker, wait_for, wait_worker_ready
from tms_core.logcontext import bound, log_context
from tms_project.log_config import LoggingConfigError, build_logging


def _capture(fmt: str) -> tuple[logging.Logger, io.StringIO]:
    """A logger writing through the configured handler (its filter and formatter) into a buffer."""
    config = build_logging(fmt=fmt, level="INFO")
    handler_conf = config["handlers"]["console"]
    stream = io.StringIO()
    config["handlers"]["console"] = {**handler_conf, "stream": stream}
    config["root"] = {"handlers": [], "level": "INFO"}
    config["loggers"] = {"tms.test.logs": {"handlers": ["console"], "level": "INFO", "propagate": False}}
    config["disable_existing_loggers"] = False
    logging.config.dictConfig(config)
    return logging.getLogger("tms.test.logs"), stream


@pytest.fixture
def restore_logging():
    yield
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)


@pytest.mark.parametrize(
    ("fmt", "level", "message"),
    [
        ("xml", "INFO", "TMS_LOG_FORMAT must be one of json, plain, not 'xml'"),
        ("json", "LOUD", "TMS_LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL, not 'LOUD'"),
    ],
)
def test_bad_format_or_level_is_refused_with_the_variable_named(fmt, level, message):
    with pytest.raises(LoggingConfigError) as caught:
        build_logging(fmt=fmt, level=level)
    assert str(caught.value) == message


def test_json_line_carries_the_bound_ids_and_only_inside_the_block(restore_logging):
    logger, stream = _capture("json")
    with log_context(execution_id=7, attempt=2, worker_id="host:1:2"):
        with log_context(task_id="t-1", tracing_id="trace-9"):
            logger.info("inside %s", "both")
        logger.warning("inside one")
    logger.info("outside")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(lines) == 3
    assert lines[0]["message"] == "inside both" and lines[0]["level"] == "INFO"
    assert {k: lines[0][k] for k in ("execution_id", "attempt", "worker_id", "task_id", "tracing_id")} == {
        "execution_id": 7,
        "attempt": 2,
        "worker_id": "host:1:2",
        "task_id": "t-1",
        "tracing_id": "trace-9",
    }
    assert lines[1]["execution_id"] == 7 and "task_id" not in lines[1]
    assert "execution_id" not in lines[2] and lines[2]["logger"] == "tms.test.logs"
    assert bound() == {}


def test_plain_line_shows_the_ids_in_brackets(restore_logging):
    logger, stream = _capture("plain")
    with log_context(execution_id=3, attempt=1, tracing_id=""):
        logger.info("hello")
    line = stream.getvalue().strip()
    assert line.endswith("INFO tms.test.logs: hello [execution_id=3 attempt=1]"), line


def test_unknown_context_field_is_an_error():
    with pytest.raises(TypeError, match="unknown log context fields: executionid"), log_context(executionid=1):
        pass


def _json_lines(text: str) -> list[dict]:
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"stderr line {number} is not JSON: {line!r}")
    return lines


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_real_worker_and_monitor_write_json_with_the_execution_ids():
    owner = UserFactory()
    json_env = {"TMS_LOG_FORMAT": "json", "TMS_LOG_LEVEL": "DEBUG"}
    worker = start_worker("json-worker", concurrency=1, split_stderr=True, **json_env)
    monitor = start_monitor("json-monitor", split_stderr=True, **json_env)
    with running(worker, monitor):
        wait_worker_ready(worker)
        task = task_create(
            owner=owner, runner="subprocess", config={"command": ["sleep", "2"]}, tracing_id="trace-abc-123"
        )
        wait_for(lambda: Execution.objects.filter(task=task, status=S.SUCCEEDED).exists(), timeout=40, what="SUCCEEDED")
    (execution,) = Execution.objects.filter(task=task)
    worker_lines, monitor_lines = _json_lines(worker.stderr()), _json_lines(monitor.stderr())
    assert worker_lines and monitor_lines
    assert all({"time", "level", "logger", "message"} <= set(line) for line in worker_lines + monitor_lines)

    mine = [line for line in worker_lines if line.get("execution_id") == execution.pk]
    # The run message (claimed; the 1 s inline wait ends with the run recorded) and at least one
    # poll message (leased; resuming), each with the execution's ids.
    messages = " | ".join(line["message"] for line in mine)
    assert "claimed; starting runner subprocess" in messages and "leased; resuming" in messages, messages
    for line in mine:
        assert line["attempt"] == 1
        assert line["task_id"] == str(task.pk)
        assert line["tracing_id"] == "trace-abc-123"
        assert line["worker_id"].startswith(execution.events.get(to_status=S.RUNNING).actor.rsplit(":", 1)[0])
        assert line["celery_task_id"]
    assert any(line["logger"] == "celery.app.trace" for line in mine)
    published = [line for line in monitor_lines if line.get("execution_id") == execution.pk]
    assert any("published (run)" in line["message"] for line in published), monitor_lines[-20:]
    assert all(line["attempt"] == 1 for line in published)


def test_added_ids_stay_until_the_binding_ends_and_nothing_leaks_where_nothing_is_bound():
    from tms_core import logcontext

    logcontext.add(task_id="t")
    assert bound() == {}
    token = logcontext.bind(execution_id=1)
    with log_context(attempt=1):
        pass
    logcontext.add(task_id="t", tracing_id="")
    assert bound() == {"execution_id": 1, "task_id": "t"}
    logcontext.unbind(token)
    assert bound() == {}
