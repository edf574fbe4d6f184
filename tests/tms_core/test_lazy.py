"""Large runner SDKs are imported when a run needs them, not when a process starts.

Every process builds every configured runner at start, to fail at once on a bad TMS_RUNNERS;
the Kubernetes client and boto3 were about 0.6 s of CPU and 42 MB of each process's start. A
Celery worker imports them before it forks its pool, so that its pool processes share them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.processes import ROOT, process_env
from tms_core.lazy import LazyModule

SDKS = ("kubernetes", "boto3", "botocore")


def _in_a_fresh_process(setup: str) -> Any:
    """Run ``setup`` after Django's set-up in a new Python process; return the JSON it prints."""
    code = f"import json, sys, django; django.setup(); import tms_project.celery; {setup}"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=process_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


_IMPORTED = f"[name for name in {SDKS!r} if name in sys.modules]"


def test_a_started_process_with_every_runner_built_has_imported_no_runner_sdk():
    runners, imported = _in_a_fresh_process(
        "import executions.tasks; from runners.registry import all_runners; "
        f"print(json.dumps([sorted(all_runners()), {_IMPORTED}]))"
    )
    assert {"kubernetes", "lambda"} <= set(runners)
    assert imported == []


def test_a_celery_worker_imports_them_before_it_forks_its_pool():
    imported = _in_a_fresh_process(
        f"from executions.tasks import _prepare_worker; _prepare_worker(sender=None); print(json.dumps({_IMPORTED}))"
    )
    assert imported == list(SDKS)


def test_a_lazy_module_imports_at_the_first_attribute_and_raises_what_the_module_would():
    lazy = LazyModule("json.decoder")
    assert "(imported)" not in repr(lazy)
    caught = None
    try:
        lazy.JSONDecoder().decode("{")
    except lazy.JSONDecodeError as exc:  # the except clause reads the attribute: the real class
        caught = exc
    assert "Expecting property name" in str(caught)
    assert "(imported)" in repr(lazy)
    assert lazy.JSONDecodeError is sys.modules["json.decoder"].JSONDecodeError
