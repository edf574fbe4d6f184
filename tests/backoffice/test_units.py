"""Masking of secrets, schedules in words and the SVG charts: the back office's pure helpers."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from backoffice import charts
from executions.dashboard import OUTCOMES, LatenessPoint, MinutePoint, RunnerDuration, UpcomingRun
from tasks_app.masking import MASK, mask_config, mask_url
from tasks_app.schedule_words import cron_words, duration_words, schedule_words, short_duration


def test_secret_looking_values_are_masked_and_the_rest_kept():
    config = {
        "url": "https://user:hunter2@example.com/hook?token=abc&page=2",
        "method": "POST",
        "headers": {"Authorization": "Bearer s3cret", "X-Api-Key": "k-123", "Accept": "application/json"},
        "json": {"text": "hello", "client_secret": "cs", "nested": [{"password": "pw", "n": 1}]},
        "env": {"DEBUG": "1", "HOME": "/root"},
        "cookie": {"a": "b"},
        "access_token": "",
        "command": ["/bin/echo", "hi"],
    }
    masked = mask_config(config)
    text = repr(masked)
    for secret in ("hunter2", "s3cret", "k-123", "abc", "cs", "pw", "/root", "'1'", "'b'"):
        assert secret not in text, secret
    assert masked["method"] == "POST"
    assert masked["headers"]["Accept"] == "application/json"
    assert masked["headers"]["Authorization"] == MASK
    assert masked["json"]["text"] == "hello" and masked["json"]["nested"][0]["n"] == 1
    assert masked["env"] == {"DEBUG": MASK, "HOME": MASK}
    assert masked["cookie"] == {"a": MASK}
    assert masked["access_token"] == ""  # nothing to hide
    assert masked["command"] == ["/bin/echo", "hi"]
    assert masked["url"].startswith("https://user:") and "page=2" in masked["url"]
    assert config["headers"]["Authorization"] == "Bearer s3cret"  # the original is untouched


def test_urls_without_secrets_are_left_alone():
    assert mask_url("https://example.com/a?b=c") == "https://example.com/a?b=c"
    assert mask_url("not a url") == "not a url"
    assert mask_config("https://x:y@h/p") == f"https://x:{MASK}@h/p"


def test_schedules_in_words():
    assert cron_words("*/5 * * * *") == "Every 5 minutes"
    assert cron_words("0 9 * * 1-5") == "At 09:00, Monday through Friday"
    assert cron_words("*/10 * * * * *") == "Every 10 seconds"  # six fields: seconds first
    assert cron_words("nonsense") == "nonsense"
    assert duration_words(timedelta(seconds=5400)) == "1 hour 30 minutes"
    assert duration_words(timedelta(milliseconds=250)) == "250 ms"
    task = SimpleNamespace(cron="0 9 * * 1-5", interval=None, timezone="Europe/Berlin", has_after=False)
    assert schedule_words(task) == "At 09:00, Monday through Friday (Europe/Berlin)"
    assert (
        schedule_words(SimpleNamespace(cron="", interval=timedelta(minutes=5), timezone="UTC", has_after=False))
        == "Every 5 minutes"
    )
    assert schedule_words(SimpleNamespace(cron="", interval=None, timezone="UTC", has_after=False)) == "Once"
    assert [short_duration(v) for v in (0.25, 12.34, 245, 7800)] == ["250 ms", "12.3 s", "4m05s", "2h10m"]


def _minutes(counts_at: dict[int, dict[str, int]]) -> list[MinutePoint]:
    first = datetime(2026, 11, 20, tzinfo=UTC)
    return [
        MinutePoint(first + timedelta(minutes=i), {o: counts_at.get(i, {}).get(o, 0) for o in OUTCOMES})
        for i in range(1440)
    ]


def test_runs_chart_draws_one_stacked_bar_per_busy_minute():
    svg = str(charts.runs_per_minute(_minutes({10: {"SUCCEEDED": 3, "FAILED": 1}, 700: {"RETRIED": 2}}), OUTCOMES))
    assert svg.startswith('<div class="chart-frame wide" tabindex="0"><div class="chart-canvas"><svg')
    assert svg.endswith("</svg></div></div>")
    # The y axis's labels in an SVG of their own (it stays put while the plot scrolls on a phone).
    axis = svg[svg.index('<svg class="chart-y-axis"') :]
    assert [label for label in ("0", "2.5", "5") if f">{label}</text>" in axis] == ["0", "2.5", "5"]
    assert svg.count("<g>") == 2  # two busy minutes
    assert svg.count(charts.OUTCOME_COLOURS["SUCCEEDED"]) == 1 and svg.count(charts.OUTCOME_COLOURS["RETRIED"]) == 1
    assert "00:10 UTC: 3 succeeded, 1 failed" in svg
    empty = str(charts.runs_per_minute(_minutes({}), OUTCOMES))
    assert "No runs ended" in empty


def test_lateness_duration_and_upcoming_charts():
    first = datetime(2026, 11, 20, tzinfo=UTC)
    points = [
        LatenessPoint(first + timedelta(minutes=i), 1, 0.05, 2.0)
        if i in (5, 6, 9)
        else LatenessPoint(first + timedelta(minutes=i), 0, None, None)
        for i in range(1440)
    ]
    svg = str(charts.lateness_per_minute(points))
    assert svg.count("<polyline") == 2 and svg.count("<circle") == 2  # 5-6 joined, 9 alone, per percentile
    bars = str(charts.duration_by_runner([RunnerDuration("sleep", 4, 1.0, 5.0), RunnerDuration("<x>", 1, 0.1, 0.1)]))
    assert (
        "sleep: 4 runs, p50 about 1.0 s (between 1.0 s and 2.5 s), p99 about 5.0 s" in bars
        and "&lt;x&gt;" in bars
        and "<x>" not in bars
    )
    now = first
    strip = str(charts.upcoming_strip([UpcomingRun("t1", "nightly", now + timedelta(minutes=30), 7)], now))
    assert "nightly at 00:30:00 UTC" in strip


def test_duration_axis_labels_leave_room_between_them():
    # A runner whose runs take from milliseconds to most of a day: nine decades on a 250-unit axis.
    svg = str(charts.duration_by_runner([RunnerDuration("sleep", 2, 0.002, 72000.0)]))
    ticks = re.findall(r'<line x1="([\d.]+)" y1="0"', svg)
    texts = re.findall(r'<text x="([\d.]+)" y="\d+" text-anchor="middle">(\w+)<', svg)
    labels = [(float(x), text) for x, text in texts]
    assert len(ticks) == 9  # every decade keeps its grid line
    assert [text for _, text in labels] == ["1ms", "100ms", "10s", "10m", "1d"]
    for (x1, a), (x2, b) in itertools.pairwise(labels):
        assert x2 - x1 >= (len(a) + len(b)) * charts._CHAR_W / 2, (a, b)
