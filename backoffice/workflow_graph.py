"""The workflow run page's graph: server-side SVG, drawn as the dashboard's charts are
(:mod:`backoffice.charts`: plain values in, escaped markup out, sized by a viewBox; no JavaScript
library, no CDN).

A column per depth (the longest chain of links from the root), a box per step with its task's
name and its state in words and a sign (colour is never the only cue), an arrow from each
upstream to its follower labelled with how it follows (``on``). A step that ran links to its
execution's page, one not run (yet) to its task's page. The SVG is a labelled group (a
``<title>`` and a ``<desc>`` saying how the run stands) rather than an image, so that its links
stay reachable by keyboard and screen readers; the page lists the steps in a table as well.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from django.urls import reverse
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from executions.workflow_runs import SKIPPED, WAITING, Link, Step, WorkflowRun
from tasks_app.models import Task

#: Per state: (stroke, fill, text ink, sign, word). Inks are the stylesheet's badge inks (AA contrast).
STATE_STYLE: dict[str, tuple[str, str, str, str, str]] = {
    "SUCCEEDED": ("#1f8a4c", "#e3f5ea", "#17693a", "\u2713", "succeeded"),
    "FAILED": ("#c63b3b", "#fbe5e5", "#a52a2a", "\u2717", "failed"),
    "CANCELLED": ("#8a8f9c", "#eceef3", "#5e6578", "\u2298", "cancelled"),
    "RUNNING": ("#2f7fd3", "#e2eefc", "#1f63ad", "\u25b6", "running"),
    "PENDING": ("#7a5bd3", "#eee9fb", "#5b3fb0", "\u25f7", "pending"),
    "SCHEDULED": ("#7a5bd3", "#eee9fb", "#5b3fb0", "\u25f7", "scheduled"),
    WAITING: ("#7a5bd3", "#ffffff", "#5b3fb0", "\u2026", "waiting"),
    SKIPPED: ("#8a8f9c", "#f5f6f8", "#5e6578", "\u2013", "will not run"),
}
T = TypeVar("T")
NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN = 230, 58, 80, 24, 16
#: Characters of a task's name a box shows (the whole name is in its title).
NAME_CHARS = 28
#: Characters of its state a box shows (the whole of it is in its title).
STATE_CHARS = 34


def state_word(step: Step) -> str:
    """A step's state in one word or two ("succeeded", "waiting", "will not run")."""
    return STATE_STYLE.get(step.state, STATE_STYLE[WAITING])[4]


def state_words(step: Step) -> str:
    """A step's state in words, with its run's id when it has one."""
    word = STATE_STYLE.get(step.state, STATE_STYLE[WAITING])[4]
    if step.execution is not None:
        retried = f", run {step.runs} times" if step.runs > 1 else ""
        return f"{word} (execution #{step.execution.pk}{retried})"
    return f"{word}{f': {step.note}' if step.note else ''}"


def _grid(columns: Mapping[int, Iterable[T]], key: Callable[[T], object]) -> dict[object, tuple[float, float]]:
    """The top left corner of each item's box, by ``key``: a column per depth, in order down it."""
    return {
        key(item): (MARGIN + depth * (NODE_W + GAP_X), MARGIN + row * (NODE_H + GAP_Y))
        for depth, items in columns.items()
        for row, item in enumerate(items)
    }


def _positions(run: WorkflowRun) -> dict[object, tuple[float, float]]:
    columns: dict[int, list[Step]] = {}
    for step in run.ordered():
        columns.setdefault(step.depth, []).append(step)
    return _grid(columns, lambda step: step.task.pk)


def _arrow(
    upstream: object,
    follower: object,
    start: tuple[float, float],
    end: tuple[float, float],
    says: str,
    on: str,
    *,
    stroke: str = "#3d4558",
    dash: str = "",
) -> str:
    """An arrow from the box at ``start`` to the one at ``end`` (their corners), labelled ``on``,
    its title ``says`` and on what."""
    (x1, y1), (x2, y2) = start, end
    x1, y1, x2, y2 = x1 + NODE_W, y1 + NODE_H / 2, x2 - 4, y2 + NODE_H / 2
    if x2 <= x1:  # same column or backwards (links changed since): go round below
        x2 = x1 + 4
    bend = max((x2 - x1) / 2, 20)
    mid_x, mid_y = (x1 + x2) / 2, (y1 + y2) / 2
    return (
        f'<g class="wf-edge" data-from="{upstream}" data-to="{follower}"><title>{escape(says)}</title>'
        f'<path d="M{x1:.1f},{y1:.1f} C{x1 + bend:.1f},{y1:.1f} {x2 - bend:.1f},{y2:.1f} {x2:.1f},{y2:.1f}" '
        f'fill="none" stroke="{stroke}" stroke-width="1.6"{dash} marker-end="url(#wf-arrow)"/>'
        f'<text x="{mid_x:.1f}" y="{mid_y - 4:.1f}" text-anchor="middle" fill="#4a5163" stroke="#fff" '
        f'stroke-width="3" paint-order="stroke">{escape(on)}</text></g>'
    )


def _edge(link: Link, run: WorkflowRun, at: dict[object, tuple[float, float]]) -> str:
    upstream, follower = run.steps[link.upstream].task, run.steps[link.task].task
    taken = run.link_words(link)
    says = f"{follower} runs after {upstream} on {link.label} ({taken})"
    stroke, dash = ("#3d4558", "") if link.taken else ("#9aa0ad", ' stroke-dasharray="5 4"')
    return _arrow(
        link.upstream,
        link.task,
        at[link.upstream],
        at[link.task],
        says,
        link.on if not link.condition else f"{link.on} if …",
        stroke=stroke,
        dash=dash,
    )


def _box(
    href: str,
    data: str,
    at: tuple[float, float],
    title: str,
    name: str,
    line: str,
    colours: tuple[str, str, str],
    dash: str = "",
) -> str:
    """A box linked to ``href`` with ``name`` in bold over ``line`` (each cut to fit; the whole of
    them in ``title``); ``data`` is its data attributes, ``colours`` its stroke, fill and ink."""
    x, y = at
    stroke, fill, ink = colours
    return (
        f'<a href="{href}" class="wf-node" {data}>'
        f"<title>{escape(title)}</title>"
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{NODE_W}" height="{NODE_H}" rx="7" fill="{fill}" '
        f'stroke="{stroke}" stroke-width="2"{dash}/>'
        f'<text x="{x + 10:.1f}" y="{y + 22:.1f}" fill="#1d2330" font-weight="600">{escape(name)}</text>'
        f'<text x="{x + 10:.1f}" y="{y + 42:.1f}" fill="{ink}">{escape(line)}</text></a>'
    )


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "\u2026"


def _node(step: Step, at: tuple[float, float]) -> str:
    stroke, fill, ink, sign, _ = STATE_STYLE.get(step.state, STATE_STYLE[WAITING])
    dash = ' stroke-dasharray="5 4"' if step.execution is None else ""
    name = str(step.task)
    words = state_words(step)
    href = (
        reverse("backoffice:execution", args=[step.execution.pk])
        if step.execution is not None
        else reverse("backoffice:task", args=[step.task.pk])
    )
    data = f'data-task="{step.task.pk}" data-state="{escape(step.state)}"'
    line = _cut(f"{sign} {words}", STATE_CHARS)
    return _box(href, data, at, f"{name}: {words}", _cut(name, NAME_CHARS), line, (stroke, fill, ink), dash)


def _svg(at: Mapping[object, tuple[float, float]], title: str, desc: str, parts: Iterable[str]) -> SafeString:
    """The graph's SVG, sized to hold the boxes ``at``, scrolled within its card (by keyboard too)
    when wider than it, on a phone as anywhere; ``title`` and ``desc`` are plain text."""
    width = int(max((x for x, _ in at.values()), default=MARGIN) + NODE_W + MARGIN)
    height = int(max((y for _, y in at.values()), default=MARGIN) + NODE_H + MARGIN)
    body = [
        f'<title id="wf-graph-title">{escape(title)}</title>',
        f'<desc id="wf-graph-desc">{escape(desc)}</desc>',
        '<defs><marker id="wf-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#3d4558"/></marker></defs>',
        *parts,
    ]
    return mark_safe(  # noqa: S308 - every piece of text in body was escaped where it was made
        '<div class="workflow-frame" tabindex="0">'
        f'<svg viewBox="0 0 {width} {height}" width="{width}" role="group" aria-labelledby="wf-graph-title" '
        f'aria-describedby="wf-graph-desc" xmlns="http://www.w3.org/2000/svg" id="workflow-graph">'
        f"{''.join(body)}</svg></div>"
    )


def workflow_graph(run: WorkflowRun) -> SafeString:
    """The SVG of ``run``'s graph (see the module's description)."""
    at = _positions(run)
    counts: dict[str, int] = {}
    for step in run.steps.values():
        word = STATE_STYLE.get(step.state, STATE_STYLE[WAITING])[4]
        counts[word] = counts.get(word, 0) + 1
    summary = ", ".join(f"{count} {word}" for word, count in sorted(counts.items()))
    desc = (
        f"Workflow run {run.id} is {run.state_words}: {len(run.steps)} steps ({summary}). "
        "Each box is a step with its state; each arrow goes from a step to one that runs after it."
    )
    parts = [
        *(_edge(link, run, at) for link in run.links),
        *(_node(step, at[step.task.pk]) for step in run.ordered()),
    ]
    return _svg(at, f"Steps of workflow run {run.id}", desc, parts)


def link_depths(task_ids: list[uuid.UUID], links: list[tuple[uuid.UUID, uuid.UUID, str]]) -> dict[uuid.UUID, int]:
    """Each task's depth in a workflow: the longest chain of links from its root (no cycles)."""
    depth = dict.fromkeys(task_ids, 0)
    for _ in range(len(task_ids)):
        changed = False
        for follower, upstream, _on in links:
            if upstream in depth and follower in depth and depth[upstream] + 1 > depth[follower]:
                depth[follower], changed = depth[upstream] + 1, True
        if not changed:
            break
    return depth


def workflow_shape_graph(
    root: Task, tasks: dict[uuid.UUID, Task], links: list[tuple[uuid.UUID, uuid.UUID, str]]
) -> SafeString:
    """The SVG of a workflow itself (not one of its runs): a box per task, linked to its page, in
    a column per depth, an arrow per link labelled with its ``on``; drawn as :func:`workflow_graph`."""
    depth = link_depths(list(tasks), links)
    columns: dict[int, list[Task]] = {}
    for task in sorted(tasks.values(), key=lambda t: (depth[t.pk], str(t).lower(), str(t.pk))):
        columns.setdefault(depth[task.pk], []).append(task)
    at = _grid(columns, lambda task: task.pk)
    edges = [
        _arrow(
            upstream,
            follower,
            at[upstream],
            at[follower],
            f"{tasks[follower]} runs after {tasks[upstream]} on {on}",
            on,
        )
        for follower, upstream, on in links
        if follower in at and upstream in at
    ]
    nodes = []
    for task in tasks.values():
        name = str(task)
        status = task.get_status_display().lower() if task.status != "ACTIVE" else "active"
        role = "root" if task.pk == root.pk else f"step {depth[task.pk]}"
        words = f"{role}, {status}"
        colours = ("#2f7fd3", "#e2eefc", "#1f63ad") if task.pk == root.pk else ("#5e6578", "#f5f6f8", "#3d4558")
        href = reverse("backoffice:task", args=[task.pk])
        nodes.append(
            _box(
                href, f'data-task="{task.pk}"', at[task.pk], f"{name}: {words}", _cut(name, NAME_CHARS), words, colours
            )
        )
    desc = (
        f"Workflow of {root}: {len(tasks)} tasks, {len(edges)} links. Each box is a task; each arrow goes from "
        "a task to one that runs after it, labelled with the end it follows (success, failure, completion)."
    )
    return _svg(at, f"Tasks of the workflow of {root}", desc, [*edges, *nodes])
