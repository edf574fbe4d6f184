"""The HTTP exchange that the ``http`` and ``function`` runners share, and how its failures are judged.

Both runners send one request at a time with :func:`send`: no redirect followed by requests itself
(the ``http`` runner follows them hop by hop, each hop checked again; the ``function`` runner not
at all), a connect and read timeout, the body streamed and read up to a cap (:class:`Reply`).
What the transport raises becomes a :class:`~runners.base.RunnerError` saying whether another try
can help (:func:`transport_error`), and an answer's status is judged by :func:`status_is_retryable`:

- retryable: timeouts, connections refused or reset, name resolution and TLS failures, HTTP 5xx,
  408, 425 and 429;
- permanent: an address the network guard refuses (:mod:`runners.netguard`), an invalid URL or
  header, any other 4xx.

Error texts name the origin (``scheme://host:port``), never the path or query, which may hold
secrets. The session is the caller's: the ``http`` runner's goes through the network guard
(:func:`runners.netguard.guarded_session`), whose :class:`~runners.netguard.Guard` also bounds the
whole exchange by a deadline; the ``function`` runner's is guarded the same way for its deadline,
its reach being its operator's allow-listed URLs. A run's status document (``{"status", "output",
"error", "retryable"}``), which both runners poll, is read by :func:`status_document_result`, so a
state means the same to both. Notification webhooks (:mod:`notifications.senders`) judge their answers
and word their errors by the same rules. This module never touches the database.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import socket
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.structures import CaseInsensitiveDict
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError, ReadTimeoutError

from runners.base import RunnerError, RunResult, bounded_head
from runners.netguard import AddressRefused, Guard

_READ_CHUNK = 8192
_ERROR_EXCERPT_CHARS = 200


@dataclasses.dataclass(frozen=True)
class Reply:
    """The answer to one request, with its body read up to a cap.

    ``location`` is the redirect target when the caller asked to follow redirects and the answer
    is one (its body is then not read).
    """

    status: int
    reason: str
    headers: CaseInsensitiveDict[str]
    url: str
    body: bytes
    truncated: bool
    limit: int
    location: str | None = None

    @property
    def text(self) -> str:
        """The body as text (UTF-8, invalid bytes replaced), marked when it was cut off."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # When truncated, a multi-byte character cut in half is dropped rather than replaced.
        text = decoder.decode(self.body, final=not self.truncated)
        if self.truncated:
            text += f"\n[truncated: response exceeded {self.limit} bytes]"
        return text

    @property
    def origin(self) -> str:
        return origin(self.url)

    def capped(self, limit: int) -> Reply:
        """This reply with its body cut to ``limit`` bytes."""
        if len(self.body) <= limit:
            return self
        return dataclasses.replace(self, body=self.body[:limit], truncated=True, limit=limit)


def origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: errors never quote paths or queries, which may hold secrets."""
    try:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    except ValueError:
        return "the endpoint"


def excerpt(text: str, limit: int = _ERROR_EXCERPT_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters: a body quoted in an error."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def json_document(body: bytes) -> Any:
    """The JSON document in ``body``, or None when it is not JSON."""
    try:
        return json.loads(body)
    except ValueError:
        return None


#: 4xx statuses that are transient all the same: 408 Request Timeout, 425 Too Early (the server
#: would not risk a replayed request: sent again, it is not early) and 429 Too Many Requests.
RETRYABLE_STATUSES = frozenset({408, 425, 429})


def status_is_retryable(status: int) -> bool:
    """Whether an HTTP error status is worth another try: 5xx and :data:`RETRYABLE_STATUSES`."""
    return status >= 500 or status in RETRYABLE_STATUSES


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and everything it wraps (requests and urllib3 wrap through args and ``reason``)."""
    seen: set[int] = set()
    queue: deque[Any] = deque([exc])
    while queue:  # breadth first: the outermost, most specific wrappers come first
        current = queue.popleft()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        queue.extend([current.__cause__, current.__context__, getattr(current, "reason", None), *current.args])


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is a connect or read timeout."""
    if isinstance(exc, requests.Timeout):
        return True
    for cause in causes(exc):
        if isinstance(cause, NewConnectionError):
            return False  # urllib3 makes "connection refused" a subclass of its connect timeout
        if isinstance(cause, ReadTimeoutError | ConnectTimeoutError | TimeoutError):
            return True
    return False


def root_reason(exc: BaseException) -> str:
    """A short cause without the URL (requests' messages quote the path, which may hold secrets)."""
    for cause in causes(exc):
        if isinstance(cause, socket.gaierror):
            return f"name resolution failed ({cause.strerror or cause})"
        if isinstance(cause, OSError) and cause.strerror and not isinstance(cause, NewConnectionError):
            return cause.strerror
    return type(exc).__name__


def transport_error(exc: BaseException, url: str, *, seconds: float, expired: bool = False) -> RunnerError:
    """Translate what the transport raised into a RunnerError saying whether a retry can help.

    ``seconds`` is the time the exchange had, ``expired`` whether a deadline over all of it
    passed (a :class:`~runners.netguard.Guard`'s watchdog, which ends a read as if the peer had).
    """
    where = origin(url)
    if isinstance(exc, RunnerError):
        return exc
    if isinstance(exc, AddressRefused):
        return RunnerError(f"refused: {exc}", retryable=False)
    if expired or is_timeout(exc):
        return RunnerError(f"timed out after {seconds:g}s waiting for {where}")
    if isinstance(exc, requests.exceptions.InvalidURL | requests.exceptions.InvalidSchema):
        return RunnerError(f"invalid URL for {where}", retryable=False)
    if isinstance(exc, requests.exceptions.InvalidHeader):
        return RunnerError(f"invalid request header: {exc}", retryable=False)
    if isinstance(exc, requests.exceptions.SSLError):
        return RunnerError(f"TLS error talking to {where}: {root_reason(exc)}")
    if isinstance(exc, requests.exceptions.ConnectionError):
        return RunnerError(f"cannot connect to {where}: {root_reason(exc)}")
    return RunnerError(f"request to {where} failed: {root_reason(exc)}")


def read_bounded(response: requests.Response, limit: int) -> tuple[bytes, bool]:
    """Read at most ``limit`` bytes of the (decoded) body; say whether there was more."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_content(chunk_size=_READ_CHUNK):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return b"".join(chunks)[:limit], size > limit


def send(
    session: requests.Session,
    method: str,
    url: str,
    *,
    headers: Mapping[str, str],
    body: bytes | str | None,
    seconds: float,
    limit: int,
    guard: Guard | None = None,
    follow_redirects: bool = False,
    verify: bool = True,
) -> Reply:
    """Send one request (requests follows no redirect) and read its answer; raise RunnerError when it failed.

    ``seconds`` bounds the connect and each read; with a ``guard`` the time left before its
    deadline does, and an answer cut off by the deadline is a timeout however complete it looks.
    ``follow_redirects``: a redirect comes back with its ``location`` (and no body) for the
    caller to follow.
    """
    try:
        if guard is not None:
            seconds = guard.remaining()
            if seconds <= 0:
                raise TimeoutError("deadline passed")
        response = session.request(
            method,
            url,
            headers=headers,
            data=body,
            timeout=(seconds, seconds),
            allow_redirects=False,
            stream=True,
            verify=verify,
        )
        with response:
            location = session.get_redirect_target(response) if follow_redirects else None
            data, truncated = b"", False
            if location is None:
                data, truncated = read_bounded(response, limit)
                if guard is not None and guard.expired:
                    # The watchdog's shutdown reads as end-of-data to http.client, so a
                    # cut-off response can look complete: it is a timeout all the same.
                    raise TimeoutError("deadline passed")
            return Reply(
                status=response.status_code,
                reason=response.reason or "",
                headers=response.headers,
                url=response.url,
                body=data,
                truncated=truncated,
                limit=limit,
                location=location,
            )
    except Exception as exc:
        if guard is not None:
            raise transport_error(exc, url, seconds=guard.seconds, expired=guard.expired) from exc
        raise transport_error(exc, url, seconds=seconds) from exc


#: The states a status document may report, with the synonyms platforms use for each.
RUNNING_STATES = frozenset({"queued", "pending", "accepted", "running", "in_progress", "started"})
SUCCEEDED_STATES = frozenset({"succeeded", "success", "completed", "complete", "done"})
FAILED_STATES = frozenset({"failed", "failure", "error", "errored"})
CANCELLED_STATES = frozenset({"cancelled", "canceled", "aborted"})
FINISHED_STATES = SUCCEEDED_STATES | FAILED_STATES | CANCELLED_STATES


def document_state(document: Mapping[str, Any]) -> str:
    """The ``status`` of a status document, lower case and trimmed ("" when it has none)."""
    status = document.get("status")
    return status.strip().lower() if isinstance(status, str) else ""


def status_document_result(document: Mapping[str, Any], *, limit: int, source: str) -> RunResult:
    """Read a run's status document into a RunResult, the same way for every runner that polls one.

    ``output`` and ``error`` (text or any JSON) are cut to ``limit`` bytes. A failure is worth
    another attempt unless the document says ``"retryable": false``. A run cancelled on the
    platform is not retried unless it says ``"retryable": true``: somebody stopped it there on
    purpose, and a new attempt would start it again behind their back. An unknown state is a
    permanent failure that quotes it; ``source`` (an origin, never a path) says who answered.
    """
    state = document_state(document)
    output = _document_text(document.get("output"), limit)
    retryable = document.get("retryable")
    if state in RUNNING_STATES:
        return RunResult.running(output)
    if state in SUCCEEDED_STATES:
        return RunResult.succeeded(output)
    if state in FAILED_STATES:
        error = _document_text(document.get("error"), limit) or "the run reported failure"
        return RunResult.failed(error, output=output, retryable=retryable if isinstance(retryable, bool) else True)
    if state in CANCELLED_STATES:
        return RunResult.failed(
            f"the run was cancelled on the platform ({source})", output=output, retryable=retryable is True
        )
    shown = excerpt(str(document.get("status", "")), 50)
    return RunResult.failed(f"unknown run status {shown!r} from {source}", output=output, retryable=False)


def _document_text(value: Any, limit: int) -> str:
    if value is None or value == "":
        return ""
    return bounded_head(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False), limit)
