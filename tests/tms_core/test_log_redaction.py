"""Secrets bound with ``logcontext.redacting`` never reach a log line, exception texts included."""

from __future__ import annotations

import io
import logging

from tms_core import logcontext
from tms_core.logcontext import REDACTED, ContextFilter, PlainFormatter


def _logger() -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(PlainFormatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("tests.redaction")
    logger.handlers, logger.propagate = [handler], False
    logger.setLevel(logging.INFO)
    return logger, stream


def test_bound_secrets_are_masked_in_messages_and_tracebacks():
    logger, stream = _logger()
    with logcontext.redacting(("sk-live-9f8e7d",)), logcontext.log_context(execution_id=7):
        logger.info("calling https://example.com/?api_key=%s", "sk-live-9f8e7d")
        try:
            raise ValueError("rejected header value 'Bearer sk-live-9f8e7d'")
        except ValueError:
            logger.exception("runner crashed")
    logger.info("after the block: sk-live-9f8e7d is no longer a bound secret")
    text = stream.getvalue()
    lines = text.splitlines()
    assert f"api_key={REDACTED}" in lines[0] and "execution_id=7" in lines[0]
    assert f"rejected header value 'Bearer {REDACTED}'" in text and "Traceback" in text
    assert text.count("sk-live-9f8e7d") == 1 and lines[-1].startswith("INFO after the block")
