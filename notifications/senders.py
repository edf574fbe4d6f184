"""Sending one delivery to its channel: signed webhook, Slack-compatible webhook, e-mail.

Senders never touch the database: :mod:`notifications.dispatch` records what they report. Every
attempt of a delivery carries the same idempotency key (``Idempotency-Key`` header, or the
e-mail's ``Message-ID``), so a receiver that sees a delivery twice (its sender was killed after
sending, before recording) can drop the second copy.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import smtplib
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from runners.base import RunnerError
from runners.email import EmailRunner
from runners.http import HttpRunner
from runners.netguard import AddressPolicy, AddressRefused, Guard, guarded_session
from runners.registry import UnknownRunner, all_runners, get_runner
from runners.transport import causes, status_is_retryable

SIGNATURE_HEADER = "X-TMS-Signature"
TIMESTAMP_HEADER = "X-TMS-Timestamp"


class SendError(Exception):
    """A send that failed: ``permanent`` when sending again cannot help (a 4xx, a refused address)."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.permanent = permanent


def address_policy() -> AddressPolicy:
    """The private-address policy of the ``http`` runner (TMS_HTTP_ALLOWED_NETWORKS): webhooks
    may reach exactly what HTTP tasks may."""
    try:
        runner = get_runner("http")
    except UnknownRunner:
        return AddressPolicy()
    return runner.policy if isinstance(runner, HttpRunner) else AddressPolicy()


def email_runner() -> EmailRunner | None:
    """The e-mail runner whose limits e-mail channels obey: the ``email`` alias, else the first
    EmailRunner configured (None: no e-mail runner, so no recipient is allowed)."""
    try:
        runner = get_runner("email")
    except UnknownRunner:
        runner = None
    if isinstance(runner, EmailRunner):
        return runner
    return next((item for item in all_runners().values() if isinstance(item, EmailRunner)), None)


def recipient_refusal(address: str) -> str | None:
    """Why notifications may not be e-mailed to ``address``, or None: channels obey the e-mail
    runner's ``allowed_recipients``, as tasks do (nobody by default)."""
    runner = email_runner()
    if runner is None:
        return "No e-mail runner is configured, so notifications may not be e-mailed."
    if runner.recipient_allowed(address):
        return None
    return (
        f"Notifications may not be e-mailed to {address!r}. An operator can add it to the "
        f"allowed_recipients option of the {runner.alias!r} runner."
    )


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """Hex HMAC-SHA256 of ``"{timestamp}.{body}"`` under the channel's secret (X-TMS-Signature)."""
    return hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


#: A task's name is quoted in a notification at most this long (the rest is cut with "...").
NAME_CHARS = 80


def quoted_name(task: dict[str, Any]) -> str:
    """A task's name as a notification quotes it: in quotes, so that it reads as what it is
    (a name its owner chose) and never as the sentence around it; control characters (CR/LF
    that would break an e-mail header) as spaces; at most :data:`NAME_CHARS` characters.
    A task without a name is shown by its id."""
    name = task.get("name")
    if not name:
        return f"#{task.get('id') or '?'}"
    text = " ".join("".join(" " if ord(char) < 32 or ord(char) == 127 else char for char in str(name)).split())
    if len(text) > NAME_CHARS:
        text = text[: NAME_CHARS - 3] + "..."
    return f'"{text}"'


def render_text(payload: dict[str, Any]) -> tuple[str, str]:
    """(subject, text) of a notification, for Slack and e-mail: user text (the task's name) only
    quoted (:func:`quoted_name`), never as the subject itself."""
    task = payload.get("task") or {}
    name = quoted_name(task)
    event = payload.get("event", "")
    execution = payload.get("execution") or {}
    run = f" (execution {execution['id']}, attempt {execution.get('attempt')})" if execution.get("id") else ""
    headline = {
        "failing": f"Task {name} is failing{run}",
        "recovered": f"Task {name} recovered after {payload.get('failures', 0)} failure(s){run}",
        "retry": f"Task {name} failed an attempt and will retry{run}",
        "late": f"Task {name} started late{run}",
        "running_long": f"Task {name} is running longer than expected{run}",
        "skipped": f"Task {name} skipped an occurrence",
        "overdue": f"Task {name} has had no successful run within {payload.get('within', '?')}",
        "workflow_failed": f"A workflow run of task {name} failed (workflow run {payload.get('workflow_run')})",
        "workflow_recovered": (
            f"Workflow runs of task {name} recovered after {payload.get('failures', 0)} failed run(s)"
            f" (workflow run {payload.get('workflow_run')} succeeded)"
        ),
        "test": "Test notification from TMS",
    }.get(event, f"Task {name}: {event}{run}")
    if event == "digest":
        return _render_digest(payload)
    detail = payload.get("detail") or ""
    return f"[TMS] {headline}", f"{headline}.\n{detail}".strip()


def _render_digest(payload: dict[str, Any]) -> tuple[str, str]:
    total = payload.get("total", 0)
    headline = f"Digest: {total} notification(s)"
    lines = []
    for group in payload.get("counts") or []:
        task = group.get("task") or {}
        lines.append(f"- {quoted_name(task)}: {group.get('event')} x{group.get('count')}")
    if payload.get("counts_omitted"):
        lines.append(f"- ... and {payload['counts_omitted']} more")
    return f"[TMS] {headline}", "\n".join([f"{headline}:", *lines])


def plain_error(exc: BaseException, where: str, timeout: float) -> str:
    """What went wrong in words a person reads: which server could not be reached and why, never
    a library's exception text (``_GuardedHTTPConnectionPool(host=...) Max retries exceeded``)."""
    chain = list(causes(exc))
    names = {type(item).__name__ for item in chain}
    if names & {"NameResolutionError", "gaierror"}:
        return f"Could not find {where}: its name does not resolve (DNS)."
    if any(isinstance(item, ConnectionRefusedError) for item in chain):
        return f"Could not connect to {where}: the connection was refused (nothing listens there)."
    if any(isinstance(item, TimeoutError) for item in chain) or names & {"ConnectTimeoutError", "ReadTimeoutError"}:
        return f"No answer from {where} within {timeout:g} s."
    if any(isinstance(item, ssl.SSLError) for item in chain) or "SSLError" in names:
        return f"The TLS handshake with {where} failed (certificate or protocol)."
    if any(isinstance(item, ConnectionResetError) for item in chain):
        return _sentence(f"{where} closed the connection before answering.")
    if names & {"ConnectionError", "NewConnectionError", "ProtocolError", "RemoteDisconnected"}:
        return f"Could not connect to {where}."
    return f"Sending to {where} failed: {type(exc).__name__}."


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _host(url: str) -> str:
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"the receiver {parts.hostname or '?'}{port}"


def _post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> None:
    try:
        with Guard(address_policy(), timeout) as guard, guarded_session(guard) as session:
            response = session.post(url, data=body, headers=headers, timeout=timeout, allow_redirects=False)
    except AddressRefused as exc:
        raise SendError(f"The address is not reachable from TMS: {exc}", permanent=True) from exc
    except RunnerError as exc:
        raise SendError(str(exc), permanent=not exc.retryable) from exc
    except ValueError as exc:  # a URL requests cannot use
        raise SendError(f"The URL cannot be used: {exc}", permanent=True) from exc
    except OSError as exc:  # requests' errors are OSErrors
        raise SendError(plain_error(exc, _host(url), timeout)) from exc
    if 200 <= response.status_code < 300:
        return
    text = f"{_sentence(_host(url))} answered HTTP {response.status_code}: {response.text[:200]}"
    # A 3xx (redirects are not followed) or a 4xx is the receiver refusing for good, unless it says
    # "try again later" (runners.transport.RETRYABLE_STATUSES).
    permanent = response.status_code >= 300 and not status_is_retryable(response.status_code)
    raise SendError(text, permanent=permanent)


def _smtp_server() -> str:
    """Where Django sends e-mail (EMAIL_HOST:EMAIL_PORT), for error texts."""
    return f"{settings.EMAIL_HOST}:{settings.EMAIL_PORT}"


def _smtp_text(text: bytes | str) -> str:
    return (text.decode(errors="replace") if isinstance(text, bytes) else str(text)).strip()[:200]


def send(*, kind: str, target: str, secret: str, key: str, payload: dict[str, Any], timeout: float) -> None:
    """Send ``payload`` once to a channel of ``kind``; raise :class:`SendError` if it did not go."""
    if kind == "email":
        # Checked again at each send: the operator may have narrowed the list since.
        if (refusal := recipient_refusal(target)) is not None:
            raise SendError(f"not sent: {refusal}", permanent=True)
        subject, text = render_text(payload)
        message = EmailMessage(
            subject,
            text + "\n\n" + json.dumps(payload, indent=2, sort_keys=True),
            settings.DEFAULT_FROM_EMAIL,
            [target],
            # The same Message-ID on every attempt: mail systems drop a duplicate by it.
            headers={"Message-ID": f"<{key}@tms.notifications>", "X-TMS-Idempotency-Key": key},
            connection=get_connection(timeout=timeout),
        )
        server = _smtp_server()
        try:
            message.send()
        except smtplib.SMTPResponseException as exc:
            said = _smtp_text(exc.smtp_error)
            raise SendError(
                f"The SMTP server {server} refused the message: {exc.smtp_code} {said}", permanent=exc.smtp_code >= 500
            ) from exc
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            refused = "; ".join(f"{addr} ({code} {_smtp_text(text)})" for addr, (code, text) in exc.recipients.items())
            raise SendError(
                f"The SMTP server {server} refused the recipient: {refused}", permanent=all(c >= 500 for c in codes)
            ) from exc
        except (OSError, smtplib.SMTPException) as exc:
            raise SendError(plain_error(exc, f"the SMTP server {server}", timeout)) from exc
        return
    if kind == "slack":
        body = json.dumps({"text": render_text(payload)[1]}).encode()
        _post(target, body, {"Content-Type": "application/json", "Idempotency-Key": key}, timeout)
        return
    body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "Idempotency-Key": key,
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: signature(secret, timestamp, body),
    }
    _post(target, body, headers, timeout)
