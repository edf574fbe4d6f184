"""Large runner SDKs are imported when a run needs them, not when a process starts.

Every process builds every configured runner at start, to fail at once on a bad TMS_RUNNERS;
the Kubernetes client and boto3 were about 0.6 s of CPU and 42 MB of each process's start. A
Celery worker imports them before it forks its pool, so that its pool processes share them.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.processes import ROOT, process_env
from tms_core.lazy import LazyModule

SDKS = ("kubernetes", "boto3", "botocore")


def test_a_started_process_with_every_runner_built_has_imported_no_runner_sdk():
    code = (
        "import json, sys, django; django.setup(); import tms_project.celery, executions.tasks; "
        "from runners.registry import all_runners; runners = sorted(all_runners()); "
        f"print(json.dumps([runners, [name for name in {SDKS!r} if name in sys.modules]]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=process_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    runners, imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"kubernetes", "lambda"} <= set(runners)
    assert imported == []


def test_a_celery_worker_imports_them_before_it_forks_its_pool():
    code = (
        "import json, sys, django; django.setup(); import tms_project.celery; "
        "from executions.tasks import _prepare_worker; _prepare_worker(sender=None); "
        f"print(json.dumps([name for name in {SDKS!r} if name in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=process_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == list(SDKS)


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
