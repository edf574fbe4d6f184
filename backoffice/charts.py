"""Server-side SVG charts for the dashboard: no JavaScript library, no CDN, nothing to install.

Each function takes plain values (the dashboard snapshot's points) and returns safe SVG markup
sized by a viewBox, so the browser scales it to the card; every mark carries a ``<title>`` so
hovering it says what it is. Text is escaped; numbers are formatted here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from executions.dashboard import LatenessPoint, MinutePoint, RunnerDuration, UpcomingRun
from executions.histogram import bucket_bounds
from tasks_app.schedule_words import short_duration

#: Colours per run outcome (the stylesheet's palette).
OUTCOME_COLOURS = {"SUCCEEDED": "#1f8a4c", "FAILED": "#c63b3b", "CANCELLED": "#9aa0ad", "RETRIED": "#d88a12"}
P50_COLOUR, P99_COLOUR = "#2f5bd3", "#c63b3b"
_GRID = "#e6e8ee"


def _centred_note(x: float, y: float, text: str) -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="middle">{escape(text)}</text>'


def _svg(
    width: int, height: int, body: list[str], label: str, *, axis: Sequence[str] = (), axis_w: int = 0
) -> SafeString:
    """The chart's frame and SVG. ``axis``: the y-axis labels of a wide chart, drawn in an SVG of
    their own over the plot's left margin (``axis_w`` units wide, the plot's scale), which stays
    in place while the plot scrolls under it on a phone (``position: sticky`` in the stylesheet):
    in the plot itself they scrolled away with its earliest minutes, leaving bars without a scale.
    """
    # A frame the stylesheet sizes on a phone (wide charts keep a readable scale and scroll).
    frame = "wide" if width > 600 else "narrow"
    plot = (
        f'<svg class="chart-plot" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}" '
        f'xmlns="http://www.w3.org/2000/svg">{"".join(body)}</svg>'
    )
    if axis:
        # Its share of the canvas is the plot's margin's share of the plot, so both scale alike; its
        # card-coloured ground (shown where the plot scrolls) hides the bars scrolled beneath it. The
        # plot's image describes the chart.
        plot += (
            f'<svg class="chart-y-axis" viewBox="0 0 {axis_w} {height}" style="width: {100 * axis_w / width:.4f}%" '
            f'aria-hidden="true" xmlns="http://www.w3.org/2000/svg"><rect class="ground" width="{axis_w}" '
            f'height="{height}" fill="#fff"/>{"".join(axis)}</svg>'
        )
    return mark_safe(  # noqa: S308 - every piece of text in body and axis was escaped where it was made
        f'<div class="chart-frame {frame}" tabindex="0"><div class="chart-canvas">{plot}</div></div>'
    )


def _nice_max(value: float) -> float:
    """The smallest 1/2/5 x 10^n at or above ``value`` (an axis top that reads well)."""
    if value <= 0:
        return 1
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power  # pragma: no cover


def _tick_minutes(span: int) -> int:
    """Minutes between labelled grid lines for a span of ``span`` minutes (about 6-8 labels)."""
    for step in (5, 10, 15, 30, 60, 120, 180, 360):
        if span / step <= 8:
            return step
    return 720


def _time_axis(starts: Sequence[datetime], x0: float, plot_w: float, y: float) -> list[str]:
    """Vertical grid lines and HH:MM labels at round times (multiples of the tick step) among the
    points' start times, one point per ``plot_w / len(starts)``."""
    n = max(len(starts), 1)
    span = (starts[-1] - starts[0]).total_seconds() / 60 + 1 if starts else n
    step = _tick_minutes(int(span))
    body = []
    for index, when in enumerate(starts):
        if (when.hour * 60 + when.minute) % step:
            continue
        x = x0 + plot_w * (index + 0.5) / n
        body.append(f'<line x1="{x:.1f}" y1="8" x2="{x:.1f}" y2="{y:.1f}" stroke="{_GRID}"/>')
        body.append(f'<text x="{x:.1f}" y="{y + 14:.1f}" text-anchor="middle">{when:%H:%M}</text>')
    return body


def _when(point: MinutePoint) -> str:
    """A point's time for its tooltip: the minute, or a bin's first and last minute."""
    if point.span <= 1:
        return f"{point.minute:%H:%M}"
    return f"{point.minute:%H:%M}\u2013{point.minute + timedelta(minutes=point.span - 1):%H:%M}"


def per_words(minutes: int) -> str:
    """What one bar or point of a chart covers, in words: "minute", "5 minutes"."""
    return "minute" if minutes <= 1 else f"{minutes} minutes"


def runs_per_minute(
    points: Sequence[MinutePoint],
    outcomes: Sequence[str],
    *,
    width: int = 960,
    height: int = 190,
    span: str = "24 hours",
    per_minutes: int = 1,
) -> SafeString:
    """Stacked bars: runs that ended in each minute (or each bin of ``per_minutes``; a point's
    ``span`` says how many it holds), by outcome (bottom to top in ``outcomes``), over the last
    ``span``."""
    # The left margin holds "25000" at a phone's label size (the y axis is cut at its left edge there).
    x0, top, bottom = 56, 8, height - 22
    plot_w, plot_h = width - x0 - 6, bottom - top
    n = max(len(points), 1)
    totals = [sum(p.counts.values()) for p in points]
    peak = _nice_max(max(totals, default=0))
    body = [f'<rect x="{x0}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafbfc"/>']
    axis = []
    for fraction in (0, 0.5, 1):
        y = bottom - plot_h * fraction
        body.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + plot_w}" y2="{y:.1f}" stroke="{_GRID}"/>')
        axis.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{peak * fraction:g}</text>')
    if points:
        body += _time_axis([p.minute for p in points], x0, plot_w, bottom)
    bar_w = plot_w / n
    # Wide bars (a short span) get a gap between them; many thin bars touch.
    drawn_w = bar_w * 0.8 if bar_w > 4 else max(bar_w, 1.2)
    colours = [(outcome, OUTCOME_COLOURS.get(outcome, "#888")) for outcome in outcomes]
    for index, point in enumerate(points):
        if not totals[index]:
            continue
        counts: Mapping[str, int] = point.counts
        x = x0 + index * bar_w
        y = bottom
        detail = ", ".join(f"{counts.get(o, 0)} {o.lower()}" for o in outcomes if counts.get(o))
        parts = [f"<title>{_when(point)} UTC: {escape(detail)}</title>"]
        for outcome, colour in colours:
            count = counts.get(outcome, 0)
            if not count:
                continue
            h = plot_h * count / peak
            y -= h
            parts.append(f'<rect x="{x:.2f}" y="{y:.2f}" width="{drawn_w:.2f}" height="{h:.2f}" fill="{colour}"/>')
        body.append(f"<g>{''.join(parts)}</g>")
    if not any(totals):
        body.append(_centred_note(x0 + plot_w / 2, top + plot_h / 2, f"No runs ended in the last {span}"))
    label = f"Runs per {per_words(per_minutes)} over the last {span}, stacked by outcome"
    return _svg(width, height, body, label, axis=axis, axis_w=x0)


#: Log-scale bounds for seconds: 1 ms to 1 day.
_LOG_LO, _LOG_HI = 0.001, 86400.0
_LOG_TICKS = [
    (0.001, "1ms"),
    (0.01, "10ms"),
    (0.1, "100ms"),
    (1, "1s"),
    (10, "10s"),
    (60, "1m"),
    (600, "10m"),
    (3600, "1h"),
    (86400, "1d"),
]


def _log_range(values: Sequence[float]) -> tuple[float, float]:
    present = [v for v in values if v and v > 0]
    if not present:
        return 0.01, 10.0
    # The decade strictly below the smallest value, so even that one draws a visible mark.
    lo = max(_LOG_LO, 10 ** math.floor(math.log10(min(present) * 0.999)))
    hi = min(_LOG_HI, 10 ** math.ceil(math.log10(max(present) * 1.01)))
    return lo, max(hi, lo * 10)


def _log_y(value: float, lo: float, hi: float, top: float, plot_h: float) -> float:
    value = min(max(value, lo), hi)
    return top + plot_h * (1 - (math.log10(value) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)))


def lateness_per_minute(
    points: Sequence[LatenessPoint],
    *,
    width: int = 960,
    height: int = 190,
    span: str = "24 hours",
    per_minutes: int = 1,
) -> SafeString:
    """p50 and p99 lateness (seconds, log scale) per minute (or per bin of ``per_minutes``) over
    the last ``span``; gaps where nothing started."""
    x0, top, bottom = 60, 8, height - 22  # "100ms" whole at a phone's label size
    plot_w, plot_h = width - x0 - 6, bottom - top
    n = max(len(points), 1)
    values = [v for p in points for v in (p.p50, p.p99) if v is not None]
    lo, hi = _log_range(values)
    body = [f'<rect x="{x0}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafbfc"/>']
    axis = []
    for tick, label in _LOG_TICKS:
        if lo <= tick <= hi:
            y = _log_y(tick, lo, hi, top, plot_h)
            body.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + plot_w}" y2="{y:.1f}" stroke="{_GRID}"/>')
            axis.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    if points:
        body += _time_axis([p.minute for p in points], x0, plot_w, bottom)
    step = plot_w / n
    for attr, colour in (("p99", P99_COLOUR), ("p50", P50_COLOUR)):
        segment: list[str] = []
        segments = []
        for index, point in enumerate(points):
            value = getattr(point, attr)
            if value is None:
                if segment:
                    segments.append(segment)
                segment = []
                continue
            x = x0 + (index + 0.5) * step
            segment.append(f"{x:.1f},{_log_y(value, lo, hi, top, plot_h):.1f}")
        if segment:
            segments.append(segment)
        for segment in segments:
            if len(segment) == 1:
                cx, cy = segment[0].split(",")
                body.append(f'<circle cx="{cx}" cy="{cy}" r="1.6" fill="{colour}"/>')
            else:
                body.append(
                    f'<polyline points="{" ".join(segment)}" fill="none" stroke="{colour}" stroke-width="1.4" '
                    'stroke-linejoin="round"/>'
                )
    if not values:
        body.append(_centred_note(x0 + plot_w / 2, top + plot_h / 2, f"No runs started in the last {span}"))
    label = f"Lateness p50 and p99 per {per_words(per_minutes)} over the last {span}"
    return _svg(width, height, body, label, axis=axis, axis_w=x0)


def _bucket_words(value: float | None) -> str:
    """Which histogram bucket an interpolated percentile lies in, in words."""
    if value is None:
        return "no runs"
    low, high = bucket_bounds(value)
    if high is None:
        return f"at least {short_duration(low)}"
    return f"between {short_duration(low)} and {short_duration(high)}"


#: The widest a chart's text is drawn, in SVG units per character: the phone's label size (14
#: units, backoffice.css) times a wide sans-serif's advance (DejaVu's digits are 0.64 em, its "m" 0.97).
_CHAR_W = 10.0


def _spaced_labels(ticks: Sequence[tuple[float, str]], gap: float = 6.0) -> list[tuple[float, str]]:
    """The centred labels of ``ticks`` (x, text) that do not overlap, from the left: a label too
    close to the last one kept is left out (its grid line stays). On a range of days, the log
    axis's nine decades are 28 units apart and "100ms" is about 45 wide: all drawn, they ran into
    each other."""
    kept: list[tuple[float, str]] = []
    for x, label in ticks:
        if kept:
            last_x, last = kept[-1]
            if x - last_x < (len(last) + len(label)) * _CHAR_W / 2 + gap:
                continue
        kept.append((x, label))
    return kept


def duration_by_runner(rows: Sequence[RunnerDuration], *, width: int = 460) -> SafeString:
    """Horizontal bars per runner: p50 (solid) over p99 (light), log scale of seconds."""
    row_h, x0, right = 30, 90, 120
    height = max(len(rows), 1) * row_h + 24
    plot_w = width - x0 - right
    values = [v for r in rows for v in (r.p50, r.p99) if v]
    lo, hi = _log_range(values)

    def x_of(value: float | None) -> float:
        if not value:
            return 0
        value = min(max(value, lo), hi)
        return plot_w * (math.log10(value) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

    body = []
    ticks = [(x0 + x_of(tick), label) for tick, label in _LOG_TICKS if lo <= tick <= hi]
    for x, _ in ticks:
        body.append(f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{height - 18}" stroke="{_GRID}"/>')
    for x, label in _spaced_labels(ticks):
        body.append(f'<text x="{x:.1f}" y="{height - 5}" text-anchor="middle">{label}</text>')
    for index, row in enumerate(rows):
        y = index * row_h + 4
        runner = escape(row.runner)
        p50, p99, count = row.p50, row.p99, row.count
        title = (
            f"{runner}: {count} runs, p50 about {short_duration(p50)} ({_bucket_words(p50)}), "
            f"p99 about {short_duration(p99)} ({_bucket_words(p99)})"
        )
        body.append(
            f"<g><title>{title}</title>"
            f'<text x="{x0 - 8}" y="{y + 16}" text-anchor="end">{runner}</text>'
            f'<rect x="{x0}" y="{y + 3}" width="{x_of(p99):.1f}" height="18" rx="3" fill="#f3c7c7"/>'
            f'<rect x="{x0}" y="{y + 7}" width="{x_of(p50):.1f}" height="10" rx="2" fill="{P50_COLOUR}"/>'
            f'<text x="{x0 + plot_w + 6}" y="{y + 16}">{short_duration(p50)} / {short_duration(p99)}</text></g>'
        )
    if not rows:
        body.append(f'<text x="{width / 2}" y="18" text-anchor="middle">No finished runs in 24 h</text>')
    return _svg(width, height, body, "Run duration per runner, p50 and p99")


def upcoming_strip(runs: Sequence[UpcomingRun], now: datetime, *, width: int = 460, height: int = 56) -> SafeString:
    """The next hour as a strip: one tick per upcoming run (hover for the task and time)."""
    x0, plot_w, y = 22, width - 44, 22
    body = [f'<line x1="{x0}" y1="{y}" x2="{x0 + plot_w}" y2="{y}" stroke="#c8cdd8" stroke-width="2"/>']
    for minutes in range(0, 61, 10):
        x = x0 + plot_w * minutes / 60
        body.append(f'<line x1="{x:.1f}" y1="{y - 5}" x2="{x:.1f}" y2="{y + 5}" stroke="#c8cdd8"/>')
        label = f"+{minutes}m" if minutes else "now"
        body.append(f'<text x="{x:.1f}" y="{y + 22}" text-anchor="middle">{label}</text>')
    for run in runs:
        offset = (run.due_at - now).total_seconds() / 60
        if not 0 <= offset <= 60:
            continue
        x = x0 + plot_w * offset / 60
        name = escape(run.name or run.task_id)
        body.append(
            f"<g><title>{name} at {run.due_at:%H:%M:%S} UTC</title>"
            f'<circle cx="{x:.1f}" cy="{y}" r="5" fill="{P50_COLOUR}" fill-opacity="0.75"/></g>'
        )
    return _svg(width, height, body, "Runs due in the next hour")
