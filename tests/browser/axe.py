"""axe-core in the browser tests: the accessibility checks of a real page in Chromium.

axe-core comes from npm's ``axe-core`` package, pinned in the Makefile (``AXE_VERSION``) and
installed by ``make axe`` (a step of ``make test``) into the virtualenv (``.venv/axe``), which is
not in the repository; nothing is fetched at test time.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

#: Where ``make axe`` installs the package (``npm install --prefix $(VENV)/axe``).
AXE_JS = Path(sys.prefix) / "axe" / "node_modules" / "axe-core" / "axe.min.js"
#: The impacts a page may not have any of.
BLOCKING = ("critical", "serious")


def _source() -> str:
    if not AXE_JS.exists():
        pytest.fail(
            f"{AXE_JS} not found: the accessibility tests need npm's axe-core (`make axe` installs the pinned "
            "version; `make test` runs it)."
        )
    return AXE_JS.read_text()


def axe_version(driver: Any) -> str:
    driver.execute_script(_source())
    return str(driver.execute_script("return axe.version"))


def axe_run(driver: Any) -> list[dict[str, Any]]:
    """axe-core's violations on the page the driver shows (every rule axe runs by default)."""
    driver.execute_script(_source())
    driver.set_script_timeout(60)
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']})"
        ".then(r => done(r.violations)).catch(e => done({error: String(e)}));"
    )
    if isinstance(result, dict):
        raise AssertionError(f"axe-core failed: {result['error']}")
    return list(result)


def impact_counts(violations: list[dict[str, Any]]) -> Counter[str]:
    """Violating nodes per impact (``critical``, ``serious``, ``moderate``, ``minor``)."""
    counts: Counter[str] = Counter()
    for violation in violations:
        counts[violation.get("impact") or "unknown"] += len(violation["nodes"])
    return counts


def describe(violations: list[dict[str, Any]], impacts: tuple[str, ...] = BLOCKING) -> str:
    """The violations of ``impacts`` in words: rule, impact, node count and the first targets."""
    lines = []
    for v in violations:
        if v.get("impact") not in impacts:
            continue
        targets = ", ".join(" ".join(node["target"]) for node in v["nodes"][:3])
        first = v["nodes"][0].get("failureSummary", "").replace("\n", " ")[:200]
        lines.append(f"{v['id']} ({v['impact']}, {len(v['nodes'])} nodes): {v['help']} - {targets} - {first}")
    return "\n".join(lines)
