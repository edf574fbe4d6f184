"""Other people's checkers for /metrics: ``promtool check metrics`` (the exposition lints clean)
and a real Prometheus server that scrapes a saved TMS scrape and answers every query of the shipped
Grafana dashboard (docker/grafana/dashboards/tms.json).

Both binaries come from Debian's ``prometheus`` package, which ``make test`` (the Makefile's
``prometheus`` step) unpacks, at a pinned version, into ``var/tools/prometheus``.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from tests.processes import LOG_DIR, ROOT, ManagedProcess
from tests.web import free_port

#: Where the Makefile's ``prometheus`` step unpacks the binaries (TMS_PROMETHEUS_BIN overrides).
BIN = Path(os.environ.get("TMS_PROMETHEUS_BIN", ROOT / "var" / "tools" / "prometheus" / "usr" / "bin"))
DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "tms.json"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def tool(name: str) -> str:
    path = BIN / name
    assert path.is_file() and os.access(path, os.X_OK), (
        f"{path} is missing: `make prometheus` (a step of make test) unpacks Debian's prometheus package there"
    )
    return str(path)


def promtool_check_metrics(text: str) -> None:
    """``promtool check metrics``: parses the exposition and lints it (names, suffixes, help)."""
    result = subprocess.run(
        [tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"promtool check metrics: {result.stdout}{result.stderr}"


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


class _Exposition(BaseHTTPRequestHandler):
    text = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(self.text)))
        self.end_headers()
        self.wfile.write(self.text)

    def log_message(self, *args: Any) -> None:  # quiet
        pass


@contextmanager
def prometheus_scraping(text: str, *, scrapes: int = 3) -> Iterator[str]:
    """A real Prometheus server scraping ``text`` (served on a free port) every second; yields its
    base URL once it has scraped ``scrapes`` times (a rate over a window needs two samples)."""
    handler = type("Exposition", (_Exposition,), {"text": text.encode()})
    exposition = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=exposition.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="tms-prometheus-") as folder:
        config = Path(folder) / "prometheus.yml"
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                    "scrape_configs": [
                        {
                            "job_name": "tms-web",
                            "static_configs": [{"targets": [f"127.0.0.1:{exposition.server_address[1]}"]}],
                        }
                    ],
                }
            )
        )
        port = free_port()
        server = ManagedProcess(
            "prometheus",
            [
                tool("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={Path(folder) / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            LOG_DIR,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                assert server.alive, f"prometheus exited: {server.log()[-3000:]}"
                samples = _query_or_none(base, 'count_over_time(up{job="tms-web"}[1m])')
                if samples and float(samples[0]["value"][1]) >= scrapes:
                    (up,) = query(base, 'up{job="tms-web"}')
                    assert up["value"][1] == "1", f"the scrape failed: {server.log()[-3000:]}"
                    break
                assert time.monotonic() < deadline, f"prometheus scraped fewer than {scrapes} times in 30 s"
                time.sleep(0.25)
            yield base
        finally:
            server.stop()
            exposition.shutdown()
            exposition.server_close()


def _query_or_none(base: str, expr: str) -> list[dict] | None:
    try:
        return query(base, expr)
    except requests.ConnectionError:
        return None


def query(base: str, expr: str) -> list[dict]:
    """The instant vector (or scalar, as one sample) of ``expr``; fails on a query error."""
    response = requests.get(f"{base}/api/v1/query", params={"query": expr}, timeout=10)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", (expr, body)
    data = body["data"]
    if data["resultType"] == "scalar":
        return [{"metric": {}, "value": data["result"]}]
    return data["result"]
