"""The ``email`` runner: sends one message per attempt through a Django e-mail backend.

Sending is synchronous: ``start`` hands the message to the backend (SMTP by default, within the
attempt's timeout) and returns the result. The ``Message-ID`` is derived from the idempotency
key, ``<tms-<execution>-<attempt>.<task id>@<domain>>``, with the domain taken from the
``message_id_domain`` option or the sender's address (never from the host name, so every worker
produces the same id). SMTP has no idempotency of its own: if a worker dies after the server
accepted the message but before TMS recorded the outcome, the resumed attempt sends it again, and
the copy carries the same ``Message-ID``, by which mail stores, list servers and most clients
recognise and fold duplicates. Each message also carries ``X-TMS-Execution-Id``,
``X-TMS-Attempt``, ``X-TMS-Task-Id`` and ``X-TMS-Idempotency-Key`` headers.

Failures: a 5xx SMTP answer (recipient refused, message rejected, authentication failed) is
permanent and is not retried; 4xx answers, dropped connections, refused connections and timeouts
are retried. When a server refuses only some recipients, Django's SMTP backend delivers to the
others without raising, so partial refusals are not reported. A sent message cannot be recalled:
``cancel`` does nothing.

Limits: tasks may only send to the recipients the operator allows (``allowed_recipients``:
addresses, ``@domain``, ``@*.domain`` for its subdomains too, or ``*``; nothing by default), checked
when a task is saved (400 on ``to``, ``cc`` or ``bcc``) and again before each send, since the
option may have changed since. Each owner may send at most ``max_per_minute`` messages in any
60 seconds through this runner (:meth:`EmailRunner.launch_rate`: the worker-side services count
sends in PostgreSQL and defer one that would exceed it), and a task may fire at most every
``MIN_INTERVAL`` seconds (300 by default for this runner).
"""

from __future__ import annotations

import logging
import re
import smtplib
import ssl
from collections.abc import Mapping
from email.utils import parseaddr
from typing import Any, ClassVar

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.mail import BadHeaderError, EmailMultiAlternatives, get_connection
from rest_framework import serializers

from runners.base import BaseRunner, RunHandle, RunResult, RunSpec

logger = logging.getLogger(__name__)

#: Largest body (plain or HTML) a task may configure.
MAX_BODY_CHARS = 1024 * 1024
_DOMAIN = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$")


def _addresses(**kwargs: Any) -> serializers.ListField:
    return serializers.ListField(child=serializers.EmailField(max_length=254), **kwargs)


class EmailConfigSerializer(serializers.Serializer):
    to = _addresses(min_length=1, help_text="Recipients (e-mail addresses).")
    cc = _addresses(default=list)
    bcc = _addresses(default=list)
    reply_to = _addresses(default=list, max_length=10)
    subject = serializers.CharField(max_length=998)
    body = serializers.CharField(
        allow_blank=True, default="", trim_whitespace=False, max_length=MAX_BODY_CHARS, help_text="Plain-text body."
    )
    html_body = serializers.CharField(
        required=False, trim_whitespace=False, max_length=MAX_BODY_CHARS, help_text="Optional HTML alternative."
    )
    from_email = serializers.EmailField(required=False, help_text="Sender; defaults to the runner's default_from.")

    def validate_subject(self, value: str) -> str:
        if any(char in value for char in "\r\n\0"):
            raise serializers.ValidationError("The subject must be a single line.")
        return value


class EmailRunner(BaseRunner):
    """Sends the configured e-mail through a Django e-mail backend; see the module docstring."""

    option_defaults: ClassVar[dict[str, Any]] = {
        #: Dotted path of a Django e-mail backend; None: ``settings.EMAIL_BACKEND``.
        "backend": None,
        #: Keyword arguments for the backend (host, port, username, password, use_tls, timeout, ...).
        "backend_options": {},
        #: Sender when a task names none; None: ``settings.DEFAULT_FROM_EMAIL``.
        "default_from": None,
        #: Senders tasks may set in ``from_email``: addresses, ``@domain`` entries, or ``*``.
        "allowed_senders": [],
        #: Domain of generated Message-IDs; None: the sender's domain.
        "message_id_domain": None,
        #: Most recipients (to + cc + bcc) one message may have.
        "max_recipients": 50,
        #: Recipients tasks may send to: addresses, ``@domain``, ``@*.domain`` (the domain and its
        #: subdomains), or ``*`` for anyone. Empty (the default): nobody.
        "allowed_recipients": [],
        #: Messages one owner may send through this runner in any 60 seconds (0: no limit).
        "max_per_minute": 10,
    }
    config_serializer_class = EmailConfigSerializer
    #: reply_to too: a reply quoting the message goes there.
    destination_config_fields = ("to", "cc", "bcc", "reply_to")
    supports_cancel = False
    #: A mail per five minutes per task at most, unless TMS_RUNNERS sets MIN_INTERVAL.
    default_min_interval = 300.0

    def __init__(self, alias: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(alias, options)
        if not isinstance(self.options["backend_options"], Mapping):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: backend_options must be a dict.")
        senders = self.options["allowed_senders"]
        if not isinstance(senders, list | tuple) or not all(isinstance(item, str) for item in senders):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: allowed_senders must be a list of strings.")
        domain = self.options["message_id_domain"]
        if domain is not None and (not isinstance(domain, str) or not _DOMAIN.match(domain)):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: message_id_domain must be a domain name.")
        limit = self.options["max_recipients"]
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: max_recipients must be a positive integer.")
        recipients = self.options["allowed_recipients"]
        if not isinstance(recipients, list | tuple) or not all(isinstance(item, str) for item in recipients):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: allowed_recipients must be a list of strings.")
        rate = self.options["max_per_minute"]
        if isinstance(rate, bool) or not isinstance(rate, int) or rate < 0:
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: max_per_minute must be 0 (no limit) or more.")

    # -- validation ---------------------------------------------------------------------------

    def validate_config(self, config: Any) -> dict[str, Any]:
        """Validate the config; also check the recipient count and the sender against the options."""
        data = super().validate_config(config)
        total = len(data["to"]) + len(data.get("cc", [])) + len(data.get("bcc", []))
        if total > self.options["max_recipients"]:
            raise serializers.ValidationError(
                {"to": [f"At most {self.options['max_recipients']} recipients (to, cc and bcc together)."]}
            )
        for field in ("to", "cc", "bcc"):
            refused = [address for address in data.get(field, []) if not self.recipient_allowed(address)]
            if refused:
                self.refuse(field, f"Tasks may not send to {', '.join(map(repr, refused))}.", "allowed_recipients")
        sender = data.get("from_email")
        if sender and not self.sender_allowed(sender):
            self.refuse("from_email", f"Tasks may not send as {sender!r}.", "allowed_senders")
        return data

    def recipient_allowed(self, address: str) -> bool:
        """Whether ``allowed_recipients`` lets tasks send to ``address``."""
        address = parseaddr(address)[1].lower()
        domain = address.rpartition("@")[2]
        if not domain:
            return False
        for entry in self.options["allowed_recipients"]:
            entry = entry.strip().lower()
            if entry == "*" or entry == address:
                return True
            if entry.startswith("@*.") and (domain == entry[3:] or domain.endswith("." + entry[3:])):
                return True
            if entry.startswith("@") and entry[1:] == domain:
                return True
        return False

    def launch_rate(self) -> tuple[int, float] | None:
        """``max_per_minute`` sends per owner in any 60 seconds (None when 0: no limit)."""
        rate = self.options["max_per_minute"]
        return (rate, 60.0) if rate else None

    def sender_allowed(self, address: str) -> bool:
        address = address.lower()
        domain = address.rpartition("@")[2]
        for entry in self.options["allowed_senders"]:
            entry = entry.lower()
            if entry == "*" or entry == address or (entry.startswith("@") and entry[1:] == domain):
                return True
        return False

    # -- runner interface ---------------------------------------------------------------------

    def start(self, spec: RunSpec) -> RunHandle:
        """Send the message; the handle's ``result`` says whether the backend took it."""
        message = self.build_message(spec)
        message_id = message.extra_headers["Message-ID"]
        recipients = message.recipients()
        # Checked again at send time: the allow-list may have shrunk since the task was saved.
        refused = [address for address in recipients if not self.recipient_allowed(address)]
        if refused:
            error = f"not sent: recipients not allowed (allowed_recipients): {', '.join(sorted(refused))}"
            result = RunResult.failed(error, retryable=False)
            return RunHandle(message_id, data={"message_id": message_id}, result=result)
        options = dict(self.options["backend_options"])
        # Never wait on the mail server longer than the attempt may take.
        timeout = float(spec.timeout)
        configured = options.get("timeout") or getattr(settings, "EMAIL_TIMEOUT", None)
        if configured:
            timeout = min(timeout, float(configured))
        options["timeout"] = timeout
        try:
            connection = get_connection(self.options["backend"], fail_silently=False, **options)
            sent = connection.send_messages([message])
        except Exception as exc:  # noqa: BLE001 - every backend failure becomes a result, classified below
            result = _failure(exc)
            logger.info("email runner %r: sending %s failed: %s", self.alias, message_id, result.error)
            return RunHandle(message_id, data={"message_id": message_id}, result=result)
        if not sent:
            result = RunResult.failed("the e-mail backend reported that it sent nothing")
        else:
            result = RunResult.succeeded(f"sent to {len(recipients)} recipient(s); Message-ID {message_id}")
        return RunHandle(message_id, data={"message_id": message_id, "recipients": len(recipients)}, result=result)

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:
        """Never needed: the message is sent inside :meth:`start`."""
        return RunResult.failed("e-mail is sent synchronously; there is nothing to poll", retryable=False)

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:
        """A sent message cannot be recalled."""
        return None

    # -- message ------------------------------------------------------------------------------

    def sender(self, spec: RunSpec) -> str:
        return spec.config.get("from_email") or self.options["default_from"] or settings.DEFAULT_FROM_EMAIL

    def message_id(self, spec: RunSpec) -> str:
        """``<tms-<execution>-<attempt>.<task id>@<domain>>``: the same for every send of one attempt."""
        domain = self.options["message_id_domain"] or parseaddr(self.sender(spec))[1].rpartition("@")[2]
        if not domain or not _DOMAIN.match(domain):
            domain = "tms.invalid"
        task = re.sub(r"[^A-Za-z0-9_-]+", "-", str(spec.task_id)).strip("-") or "task"
        return f"<{spec.idempotency_key}.{task}@{domain}>"

    def build_message(self, spec: RunSpec) -> EmailMultiAlternatives:
        """The message for one attempt of ``spec``."""
        config = spec.config
        headers = {
            "Message-ID": self.message_id(spec),
            "X-TMS-Execution-Id": str(spec.execution_id),
            "X-TMS-Attempt": str(spec.attempt),
            "X-TMS-Task-Id": str(spec.task_id),
            "X-TMS-Idempotency-Key": spec.idempotency_key,
        }
        if spec.tracing_id:
            headers["X-TMS-Tracing-Id"] = spec.tracing_id
        message = EmailMultiAlternatives(
            subject=config["subject"],
            body=config.get("body", ""),
            from_email=self.sender(spec),
            to=list(config["to"]),
            cc=list(config.get("cc", [])),
            bcc=list(config.get("bcc", [])),
            reply_to=list(config.get("reply_to", [])),
            headers=headers,
        )
        if config.get("html_body"):
            message.attach_alternative(config["html_body"], "text/html")
        return message


def _failure(exc: BaseException) -> RunResult:
    """Classify a sending error: 5xx answers are permanent, everything transient is retried."""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        refusals = exc.recipients
        codes = [code for code, _ in refusals.values()]
        detail = "; ".join(f"{address}: {code} {_text(text)}" for address, (code, text) in sorted(refusals.items()))
        return RunResult.failed(f"all recipients refused: {detail}", retryable=any(code < 500 for code in codes))
    if isinstance(exc, smtplib.SMTPResponseException):  # sender refused, data rejected, auth, helo, connect
        code = exc.smtp_code
        return RunResult.failed(
            f"SMTP error {code}: {_text(exc.smtp_error)} ({type(exc).__name__})", retryable=not 500 <= code < 600
        )
    if isinstance(exc, smtplib.SMTPNotSupportedError):
        return RunResult.failed(f"the mail server does not support a required extension: {exc}", retryable=False)
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        if isinstance(exc.__context__, TimeoutError):  # smtplib reports a read timeout as a disconnect
            return RunResult.failed(f"the mail server did not answer in time: {exc.__context__}")
        return RunResult.failed(f"the mail server closed the connection: {exc}")
    if isinstance(exc, ssl.SSLCertVerificationError):
        return RunResult.failed(f"the mail server's TLS certificate was refused: {exc}", retryable=False)
    if isinstance(exc, TimeoutError):
        return RunResult.failed(f"the mail server did not answer in time: {exc}")
    if isinstance(exc, OSError | smtplib.SMTPException):
        return RunResult.failed(f"cannot talk to the mail server: {exc}")
    if isinstance(exc, BadHeaderError | ValueError):
        return RunResult.failed(f"the message is invalid: {exc}", retryable=False)
    if isinstance(exc, ImportError | ImproperlyConfigured | TypeError):
        return RunResult.failed(f"the e-mail backend is misconfigured: {exc}", retryable=False)
    return RunResult.failed(f"{type(exc).__name__}: {exc}")


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
