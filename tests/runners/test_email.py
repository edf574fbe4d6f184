"""The email runner against a real SMTP server (aiosmtpd) on 127.0.0.1."""

from __future__ import annotations

import email
import email.policy
import socket
import threading
import time
from collections.abc import Iterator
from email.message import EmailMessage
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from rest_framework import serializers

from runners.base import RunState
from runners.email import EmailRunner
from runners.registry import get_runner
from tests.runners.conftest import free_port, spec_maker

SMTP_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
make_spec = spec_maker(task_id="42", timeout=10.0)


class Mailbox:
    """aiosmtpd handler: records accepted messages; refuses recipients or data on request."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str], EmailMessage]] = []
        self.refuse_recipients: dict[str, str] = {}
        self.refuse_data: str | None = None

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: Any) -> str:
        if address in self.refuse_recipients:
            return self.refuse_recipients[address]
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.refuse_data:
            return self.refuse_data
        parsed = email.message_from_bytes(envelope.original_content or envelope.content, policy=email.policy.default)
        self.messages.append((envelope.mail_from, list(envelope.rcpt_tos), parsed))
        return "250 Message accepted for delivery"


@pytest.fixture
def mailbox() -> Iterator[tuple[Mailbox, int]]:
    handler = Mailbox()
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield handler, port
    finally:
        controller.stop()


def smtp_runner(port: int, **options: Any) -> EmailRunner:
    return EmailRunner(
        "email",
        {
            "backend": SMTP_BACKEND,
            "backend_options": {"host": "127.0.0.1", "port": port, "timeout": 5},
            "default_from": "TMS <tms@example.com>",
            "allowed_recipients": ["@*.example.com", "@example.com"],
            **options,
        },
    )


REPORT = {"to": ["alice@example.com"], "subject": "Nightly report", "body": "All green."}


def test_message_is_delivered_with_headers_and_a_key_derived_message_id(mailbox: tuple[Mailbox, int]) -> None:
    box, port = mailbox
    runner = smtp_runner(port)
    spec = make_spec(
        runner,
        {
            "to": ["alice@example.com"],
            "cc": ["bob@example.com"],
            "bcc": ["audit@example.com"],
            "reply_to": ["ops@example.com"],
            "subject": "Nightly report",
            "body": "All green.",
            "html_body": "<p>All <b>green</b>.</p>",
        },
        execution_id=12,
        attempt=1,
        task_id="42",
    )

    handle = runner.start(spec)

    assert handle.result is not None
    assert handle.result.state is RunState.SUCCEEDED
    assert handle.result.output == "sent to 3 recipient(s); Message-ID <tms-12-1.42@example.com>"
    assert handle.external_run_id == "<tms-12-1.42@example.com>"
    [(sender, recipients, message)] = box.messages
    assert sender == "tms@example.com"
    assert sorted(recipients) == ["alice@example.com", "audit@example.com", "bob@example.com"]
    assert message["Message-ID"] == "<tms-12-1.42@example.com>"
    assert message["Subject"] == "Nightly report"
    assert message["From"] == "TMS <tms@example.com>"
    assert (message["To"], message["Cc"], message["Reply-To"]) == (
        "alice@example.com",
        "bob@example.com",
        "ops@example.com",
    )
    assert message["Bcc"] is None
    assert message["X-TMS-Execution-Id"] == "12"
    assert message["X-TMS-Attempt"] == "1"
    assert message["X-TMS-Idempotency-Key"] == "tms-12-1"
    assert message.get_body(("plain",)).get_content().strip() == "All green."
    assert message.get_body(("html",)).get_content().strip() == "<p>All <b>green</b>.</p>"


def test_repeated_start_with_the_same_key_sends_the_same_message_id(mailbox: tuple[Mailbox, int]) -> None:
    """SMTP has no idempotency: a resumed attempt sends again, recognisably the same message."""
    box, port = mailbox
    runner, other_worker = smtp_runner(port), smtp_runner(port)
    spec = make_spec(runner, REPORT)

    first, second = runner.start(spec), other_worker.start(spec)

    assert first.external_run_id == second.external_run_id
    assert len(box.messages) == 2
    assert box.messages[0][2]["Message-ID"] == box.messages[1][2]["Message-ID"] == first.external_run_id
    # A new attempt is a new message.
    retry = make_spec(runner, REPORT, execution_id=spec.execution_id, attempt=2)
    assert runner.start(retry).external_run_id == f"<tms-{spec.execution_id}-2.42@example.com>"


def test_permanently_refused_recipient_fails_without_retry(mailbox: tuple[Mailbox, int]) -> None:
    box, port = mailbox
    box.refuse_recipients["ghost@example.com"] = "550 5.1.1 <ghost@example.com>: Recipient address rejected"
    runner = smtp_runner(port)

    result = runner.start(make_spec(runner, {**REPORT, "to": ["ghost@example.com"]})).result

    assert result is not None
    assert result.state is RunState.FAILED
    assert result.error.startswith("all recipients refused: ghost@example.com: 550 5.1.1")
    assert result.retryable is False
    assert box.messages == []


def test_temporarily_refused_recipient_is_retried(mailbox: tuple[Mailbox, int]) -> None:
    box, port = mailbox
    box.refuse_recipients["busy@example.com"] = "450 4.2.1 Mailbox busy, try again later"
    runner = smtp_runner(port)

    result = runner.start(make_spec(runner, {**REPORT, "to": ["busy@example.com"]})).result

    assert result is not None
    assert (result.state, result.retryable) == (RunState.FAILED, True)


def test_rejected_message_data_is_permanent(mailbox: tuple[Mailbox, int]) -> None:
    box, port = mailbox
    box.refuse_data = "554 5.6.0 Message rejected as spam"
    runner = smtp_runner(port)

    result = runner.start(make_spec(runner, REPORT)).result

    assert result is not None
    assert result.state is RunState.FAILED
    assert result.error == "SMTP error 554: 5.6.0 Message rejected as spam (SMTPDataError)"
    assert result.retryable is False


def test_connection_refused_is_retryable() -> None:
    runner = smtp_runner(free_port())  # nothing listens there

    result = runner.start(make_spec(runner, REPORT)).result

    assert result is not None
    assert result.state is RunState.FAILED
    assert result.error.startswith("cannot talk to the mail server")
    assert result.retryable is True


def test_silent_server_times_out_within_the_attempt_timeout() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # accepts connections but never greets
        port = listener.getsockname()[1]
        runner = smtp_runner(port, backend_options={"host": "127.0.0.1", "port": port})  # no timeout of its own
        spec = make_spec(runner, REPORT, timeout=0.5)

        started = time.monotonic()
        handle = runner.start(spec)

    assert time.monotonic() - started < 3
    assert handle.result is not None
    assert handle.result.state is RunState.FAILED
    assert handle.result.error.startswith("the mail server did not answer in time")
    assert handle.result.retryable is True
    runner.cancel(spec, handle)  # nothing to cancel: a no-op
    assert EmailRunner.supports_cancel is False


def test_default_backend_comes_from_settings(mailoutbox: list[Any]) -> None:
    # pytest-django switches settings.EMAIL_BACKEND to the locmem backend.
    runner = EmailRunner("email", {"message_id_domain": "mail.example.org", "allowed_recipients": ["@example.com"]})
    spec = make_spec(runner, REPORT, execution_id=5, attempt=2, task_id="weekly report")

    handle = runner.start(spec)

    assert handle.result is not None and handle.result.state is RunState.SUCCEEDED
    [message] = mailoutbox
    assert message.extra_headers["Message-ID"] == "<tms-5-2.weekly-report@mail.example.org>"
    assert message.from_email == "webmaster@localhost"


def test_allowed_sender_may_be_used(mailbox: tuple[Mailbox, int]) -> None:
    box, port = mailbox
    runner = smtp_runner(port, allowed_senders=["@reports.example.com"])

    runner.start(make_spec(runner, {**REPORT, "from_email": "daily@reports.example.com"}))

    assert box.messages[0][0] == "daily@reports.example.com"
    assert box.messages[0][2]["Message-ID"].endswith("@reports.example.com>")


def test_concurrent_sends_use_separate_connections(mailbox: tuple[Mailbox, int]) -> None:
    box, port = mailbox
    runner = smtp_runner(port)
    specs = [make_spec(runner, REPORT) for _ in range(4)]
    threads = [threading.Thread(target=runner.start, args=(spec,)) for spec in specs]

    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert sorted(m[2]["Message-ID"] for m in box.messages) == sorted(runner.message_id(spec) for spec in specs)


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({**REPORT, "to": ["not-an-address"]}, "to"),
        ({**REPORT, "to": []}, "to"),
        ({**REPORT, "to": [f"user{i}@example.com" for i in range(6)]}, "to"),
        ({**REPORT, "cc": ["bob@"]}, "cc"),
        ({**REPORT, "bcc": "audit@example.com"}, "bcc"),
        ({**REPORT, "subject": "Hi\r\nBcc: victim@example.com"}, "subject"),
        ({"to": ["alice@example.com"], "body": "x"}, "subject"),
        ({**REPORT, "from_email": "ceo@example.com"}, "from_email"),
        ({**REPORT, "from_email": "nope"}, "from_email"),
        ({**REPORT, "attachments": []}, "attachments"),
    ],
)
def test_bad_config_is_reported_per_field(config: dict[str, Any], field: str) -> None:
    runner = EmailRunner("email", {"max_recipients": 5, "allowed_recipients": ["*"]})

    with pytest.raises(serializers.ValidationError) as caught:
        runner.validate_config(config)

    assert field in caught.value.detail


def test_bad_options_are_configuration_errors() -> None:
    with pytest.raises(ImproperlyConfigured, match="unknown OPTIONS host"):
        EmailRunner("email", {"host": "smtp.example.com"})
    with pytest.raises(ImproperlyConfigured, match="message_id_domain"):
        EmailRunner("email", {"message_id_domain": "not a domain"})
    with pytest.raises(ImproperlyConfigured, match="backend_options"):
        EmailRunner("email", {"backend_options": ["host"]})


def test_runner_loads_from_the_tms_runners_setting(mailbox: tuple[Mailbox, int]) -> None:
    box, port = mailbox
    entry = {
        "BACKEND": "runners.email.EmailRunner",
        "OPTIONS": {
            "backend": SMTP_BACKEND,
            "backend_options": {"host": "127.0.0.1", "port": port},
            "default_from": "tms@example.com",
            "allowed_recipients": ["alice@example.com"],
        },
    }
    with override_settings(TMS_RUNNERS={"email": entry}):
        runner = get_runner("email")
        handle = runner.start(make_spec(runner, REPORT))  # type: ignore[arg-type]

    assert handle.result is not None and handle.result.state is RunState.SUCCEEDED
    assert len(box.messages) == 1


def test_email_timeout_setting_bounds_the_smtp_timeout(settings: Any) -> None:
    settings.EMAIL_TIMEOUT = 0.2
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        runner = smtp_runner(port, backend_options={"host": "127.0.0.1", "port": port})
        started = time.monotonic()
        result = runner.start(make_spec(runner, REPORT, timeout=30)).result

    assert time.monotonic() - started < 2
    assert result is not None and result.retryable is True
