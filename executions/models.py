"""Executions (one occurrence of a task), their audit events, and worker registrations.

Status columns are written only by :mod:`executions.transitions`.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Now

from executions.histogram import BUCKETS


class ExecutionStatus(models.TextChoices):
    SCHEDULED = "SCHEDULED"  #: waiting for its due time (first run or a retry)
    PENDING = "PENDING"  #: published to the broker, waiting for a worker
    RUNNING = "RUNNING"  #: claimed by a worker; the runner is working on it
    SUCCEEDED = "SUCCEEDED"  #: terminal: the runner reported success
    FAILED = "FAILED"  #: terminal: permanently failed, attempts exhausted or not retryable
    CANCELLED = "CANCELLED"  #: terminal: cancelled by a user or by the platform


class ExecutionOrigin(models.TextChoices):
    SCHEDULE = "schedule"  #: an occurrence of the task's schedule, created by the materialiser
    TRIGGER = "trigger"  #: "run now" on request, outside the schedule
    RETRY = "retry"  #: a FAILED or CANCELLED execution run again on request (see ``retry_of``)
    #: a past fire time run on request (``POST .../backfill``): an occurrence of the schedule, but
    #: asked for late on purpose, so the misfire policy and ``max_age`` do not apply to it
    BACKFILL = "backfill"
    #: a step of a workflow: its task follows another (``after``), whose run ended as it asked
    #: (see ``upstream`` and ``workflow_run``)
    WORKFLOW = "workflow"
    #: an earlier execution run again by a bulk replay (``POST /api/v1/executions/replay``; see
    #: ``replay_of``), possibly with another input or config
    REPLAY = "replay"


#: Origins whose executions are occurrences of the task's schedule (they count toward ``max_runs``
#: and show in its timeline).
OCCURRENCE_ORIGINS = (ExecutionOrigin.SCHEDULE, ExecutionOrigin.BACKFILL)

TERMINAL_STATUSES = frozenset({ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED})
ACTIVE_STATUSES = frozenset({ExecutionStatus.SCHEDULED, ExecutionStatus.PENDING, ExecutionStatus.RUNNING})


class Execution(models.Model):
    # No index of its own: execution_occurrence (task, scheduled_for, ...) serves every lookup by task.
    # No foreign-key constraint either: its check (a query and a row lock per inserted row, run at
    # commit) was a fifth of PostgreSQL's work in a materialiser pass. The guarantee is kept in
    # two halves instead (migration 0016): every insert holds a lock on the task's row, taken
    # where the row was read (a materialiser batch's FOR UPDATE, whose rows give the owners), or
    # reads it for the owner in the insert itself, FOR KEY SHARE (run now, retry, backfill, task
    # creation), so no execution of a missing task can be written and no task can go while one
    # is being written; and a deferred constraint trigger refuses, as the constraint did, to
    # delete a task that still has executions. Deleting a task through Django deletes its
    # executions first (on_delete).
    task = models.ForeignKey(
        "tasks_app.Task", on_delete=models.CASCADE, related_name="executions", db_index=False, db_constraint=False
    )
    #: The occurrence this execution stands for; unique per task, so materialising twice is harmless.
    scheduled_for = models.DateTimeField()
    #: The fire time this execution was moved from by its task's business calendar (policy
    #: next_business_day or previous_business_day): ``scheduled_for`` is then the moved instant.
    moved_from = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=ExecutionStatus.choices, default=ExecutionStatus.SCHEDULED)
    attempt = models.PositiveIntegerField(default=1)
    #: When the monitor should next publish it (scheduled_for, or the retry time).
    due_at = models.DateTimeField()
    priority = models.PositiveSmallIntegerField(default=5)

    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    external_run_id = models.CharField(max_length=255, blank=True)
    #: Runner-private data needed to poll or cancel the external run (RunHandle.data).
    run_handle = models.JSONField(default=dict, blank=True)
    #: When an asynchronous run should next be polled (null: nothing to poll).
    next_poll_at = models.DateTimeField(null=True, blank=True)
    poll_count = models.PositiveIntegerField(default=0, db_default=0)
    #: Times this attempt's lease expired and the execution was handed to another worker.
    handbacks = models.PositiveSmallIntegerField(default=0, db_default=0)
    #: Handed back and not yet leased again: the next worker to lease it resumes it.
    orphaned = models.BooleanField(default=False, db_default=False)
    message_id = models.CharField(max_length=100, blank=True)
    #: Latest progress a job reported through its callback URL, and when it last reported.
    progress = models.CharField(max_length=500, blank=True, default="", db_default="")
    reported_at = models.DateTimeField(null=True, blank=True)
    #: Why this execution exists: its schedule, a trigger, or a retry of ``retry_of``.
    origin = models.CharField(
        max_length=16, choices=ExecutionOrigin.choices, default=ExecutionOrigin.SCHEDULE, db_default="schedule"
    )
    #: The FAILED or CANCELLED execution this one runs again (at most one retry each).
    retry_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries", db_index=False
    )
    #: Cancelled before it ever started because its task's schedule was replaced or paused. A
    #: superseded row leaves the (task, scheduled_for) uniqueness, so the occurrence can be
    #: materialised again by the new schedule or on resume.
    superseded = models.BooleanField(default=False, db_default=False)
    #: Its task's overlap policy was not "allow" when it was created: a worker claims it through
    #: :func:`executions.transitions.execution_claim_exclusive`, which applies the policy.
    exclusive = models.BooleanField(default=False, db_default=False)
    #: Why a SCHEDULED execution is held back although due (``max_concurrency 2``: its task's cap
    #: is reached); empty otherwise. Set by the checked claim, cleared when it is claimed.
    waiting = models.CharField(max_length=200, blank=True, default="", db_default="")
    #: The :class:`LimitBucket` a waiting execution waits for (a named limit's cap or rate), so a
    #: freed slot releases that bucket's waiters; null otherwise. No foreign key: it is a hint.
    waiting_on = models.BigIntegerField(null=True, blank=True)
    #: Its task's owner, copied when it is created (a task never changes owner): the runs of a
    #: user's own tasks (replay's default, the held-runs index) without a join.
    #: No foreign key, like ``RunRollup.team_id``: nothing to check per insert.
    owner_id = models.IntegerField()
    #: Not a column: whether a task followed this run's task when a worker's batch claim loaded it
    #: (``executions.transitions.executions_claim_loaded``), a hint for how its end is written.
    followed: bool = False
    #: Its task's team, copied when it is created like ``owner_id`` (and rewritten when the task
    #: moves to another team, :func:`tasks_api.moving.task_move`), so that "the runs of my
    #: teams" reads the executions alone, and the monitor's fair pick reads each team's next due
    #: runs from one index (``execution_team_fair_idx``) instead of joining every due row to its
    #: task: 0.6 ms instead of 22 ms a pick with 10,000 runs due. No foreign key: history
    #: outlives teams' rows.
    team_id = models.IntegerField()
    #: The workflow run it belongs to: the id of the run that started it (a root run's own id,
    #: set when its end starts a follower). Null for a run nothing followed.
    workflow_run = models.BigIntegerField(null=True, blank=True)
    #: A workflow step's upstream executions (ids): the runs whose ends started it (several for a
    #: task that follows several). Null for any other run.
    upstream = models.JSONField(null=True, blank=True)
    #: What the run was given (a JSON object, bounded): a trigger's input, a trigger URL's JSON
    #: body, a workflow step's upstream output. Fills its task's ``input_fills`` at run time. Null:
    #: nothing.
    input = models.JSONField(null=True, blank=True)
    #: A map step's item (``Task.map_over``): the item's index in its list (0 first), kept by its
    #: retries. Null for any other run.
    map_index = models.PositiveIntegerField(null=True, blank=True)
    #: The runner config this run uses instead of its task's, as a task's is stored (secrets
    #: encrypted): a replay's config override laid over the task's config. Null: the task's.
    config_override = models.JSONField(null=True, blank=True)
    #: The execution this one replays (``origin`` replay). Indexed where set only
    #: (``execution_replay_of_idx``): most runs are no replay.
    replay_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replays", db_index=False
    )
    #: The number of its task's version (``Task.version``) when it was created: the settings it
    #: ran with. Filled by a trigger on insert (executions/task_version.py), so that every way of
    #: creating executions records it without naming it; null only for executions older than it.
    task_version = models.PositiveIntegerField(null=True, blank=True)
    #: The W3C traceparent of the API request or trigger that created it, when tracing was on
    #: (tms_core/tracing.py): the run's trace continues that request's. Empty: a trace of its
    #: own (a scheduled run), whose ids are derived from the execution's id.
    traceparent = models.CharField(max_length=55, blank=True, default="", db_default="")
    #: The W3C tracestate that came with that traceparent (vendors' entries, at most 512
    #: characters): handed on with the run's trace context to the external run.
    tracestate = models.CharField(max_length=512, blank=True, default="", db_default="")

    created_at = models.DateTimeField(db_default=Now())
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    output = models.TextField(blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-scheduled_for", "-id"]
        constraints = [
            # One live execution per occurrence (materialising twice, or in two processes at once,
            # creates it once: ON CONFLICT DO NOTHING), and a task's executions by time. A
            # superseded row (replaced by an edit of the task) keys on its own id, a live one on
            # 0. One index rather than a partial unique one beside a (task, time) index: a pass
            # over 100,000 tasks inserts into one index less, with one task-id descent less per row.
            models.UniqueConstraint(
                "task",
                "scheduled_for",
                Case(When(superseded=True, then=F("id")), default=Value(0)),
                name="execution_occurrence",
            ),
            models.UniqueConstraint(
                fields=["retry_of"], condition=Q(retry_of__isnull=False), name="execution_single_retry"
            ),
            # A task runs once per workflow run: an upstream's end recorded twice (a redelivery, a
            # retried write) or two upstreams of a fan-in ending at once create its step once. A
            # retry on request (retry_of) of a step stays in its workflow run, beside it.
            models.UniqueConstraint(
                fields=["task", "workflow_run"],
                condition=Q(workflow_run__isnull=False, retry_of__isnull=True, map_index__isnull=True),
                name="execution_workflow_step",
            ),
            # A map step's item runs once per workflow run, as a step does (its retries beside it).
            models.UniqueConstraint(
                fields=["task", "workflow_run", "map_index"],
                condition=Q(workflow_run__isnull=False, retry_of__isnull=True, map_index__isnull=False),
                name="execution_workflow_map_item",
            ),
            models.CheckConstraint(condition=Q(attempt__gte=1), name="execution_attempt_positive"),
            models.CheckConstraint(
                condition=Q(superseded=False) | Q(status="CANCELLED"), name="execution_superseded_is_cancelled"
            ),
        ]
        indexes = [
            # The runs of one workflow run (the execution list's ?workflow_run=): steps only.
            models.Index(
                fields=["workflow_run"], condition=Q(workflow_run__isnull=False), name="execution_workflow_run_idx"
            ),
            # The monitor's due query: only SCHEDULED rows, by due time.
            models.Index(fields=["due_at"], condition=Q(status="SCHEDULED"), name="execution_due_idx"),
            models.Index(fields=["enqueued_at"], condition=Q(status="PENDING"), name="execution_pending_idx"),
            models.Index(fields=["next_poll_at"], condition=Q(status="RUNNING"), name="execution_poll_idx"),
            models.Index(fields=["lease_owner"], condition=Q(status="RUNNING"), name="execution_lease_idx"),
            # The back office's execution list (what ran and runs, newest first): keyset pages on
            # (scheduled_for, id), read as an index range from the last row shown.
            models.Index(fields=["-scheduled_for", "-id"], condition=~Q(status="SCHEDULED"), name="execution_ran_idx"),
            # Its complement: the API's execution lists (history first, keyset pages) merge a range
            # of each, so no index over every row is kept up by every status change.
            models.Index(fields=["scheduled_for", "id"], condition=Q(status="SCHEDULED"), name="execution_waiting_idx"),
            # The API's ?ordering=-finished_at / -started_at (either direction): keyset pages on
            # (column, id) over the rows that have the column; without them a page sorted the
            # whole table (4.8 s at 1,000,000 executions). Partial: a row enters each once, when
            # it starts or finishes.
            models.Index(
                fields=["-finished_at", "-id"], condition=Q(finished_at__isnull=False), name="execution_finished_idx"
            ),
            models.Index(
                fields=["-started_at", "-id"], condition=Q(started_at__isnull=False), name="execution_started_idx"
            ),
            # A task's next due run (the task list's next_run, tasks_api.states.with_state): one
            # entry per waiting run, where task_idx and due_idx ANDed as bitmaps read every
            # waiting run's entry for each task of the page (155 ms a page at 1,000,000).
            models.Index(fields=["task", "due_at"], condition=Q(status="SCHEDULED"), name="execution_task_due_idx"),
            # Replays of an execution (retention unlinks them when it prunes the execution): only
            # replays have an entry.
            models.Index(fields=["replay_of"], condition=Q(replay_of__isnull=False), name="execution_replay_of_idx"),
            # The waiters of a named limit's bucket, in due order (a freed slot releases them).
            models.Index(
                fields=["waiting_on", "scheduled_for"],
                condition=Q(status="SCHEDULED", waiting_on__isnull=False),
                name="execution_waiting_on_idx",
            ),
            # Runs held back although due (a task's max_concurrency, a named limit: ``waiting`` set),
            # by owner and fire time: the dashboard counts them in its due backlog (their due time
            # moved to the next re-check, so the due index alone missed them).
            models.Index(
                fields=["owner_id", "scheduled_for"],
                condition=Q(status="SCHEDULED") & ~Q(waiting=""),
                name="execution_held_idx",
            ),
            # The monitor's fair pick (executions.fairness): the teams that have runs waiting
            # (a skip scan over team_id), then each team's next due runs, priority by priority.
            models.Index(
                fields=["team_id", "priority", "due_at", "id"],
                condition=Q(status="SCHEDULED"),
                name="execution_team_fair_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"execution {self.pk} of task {self.task_id} ({self.status})"


class ExecutionEvent(models.Model):
    """Append-only audit row written in the same transaction as every status transition."""

    # No index of its own: event_execution_idx (execution, id) serves the timeline and the FK.
    # No database constraint either: transitions.py, the only writer, inserts each event in the
    # same statement as the row change it records (a RETURNING of that row), so the per-row
    # foreign key check could never fail and cost a lookup per event on the hottest write path.
    # Deleting an execution still deletes its events (Django's on_delete).
    execution = models.ForeignKey(
        Execution, on_delete=models.CASCADE, related_name="events", db_index=False, db_constraint=False
    )
    from_status = models.CharField(max_length=16, blank=True)
    to_status = models.CharField(max_length=16)
    attempt = models.PositiveIntegerField()
    at = models.DateTimeField(db_default=Now())
    actor = models.CharField(max_length=200, help_text="Who made the transition: monitor, worker id, user, ...")
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["execution", "id"], name="event_execution_idx")]

    def __str__(self) -> str:
        return f"{self.from_status or '-'} -> {self.to_status}"


class SkipReason(models.TextChoices):
    MISSED = "missed"  #: its time passed while nothing ran it (downtime, backlog); misfire policy skip
    COALESCED = "coalesced"  #: folded into one catch-up run (misfire policy run_once) or beyond run_all's bound
    PAUSED = "paused"  #: its time passed while the task was paused
    OVERLAP = "overlap"  #: the previous run was still running (overlap policy skip or queue_one)
    EXPIRED = "expired"  #: not started within its task's max_age after its fire time
    HOLIDAY = "holiday"  #: its day is closed in the task's calendar (policy skip); the detail names the holiday
    MOVED = "moved"  #: its day is closed in the task's calendar: it runs on a business day instead (detail: where)


class SkippedOccurrence(models.Model):
    """A fire time of a task that did not run, and why: the answer to "why did it not run at T?".

    Written in the same transaction as the materialiser's cursor move (misfires, pauses) or the
    claim that applied the overlap policy. Unique per (task, scheduled_for), so recording twice
    is harmless.
    """

    task = models.ForeignKey("tasks_app.Task", on_delete=models.CASCADE, related_name="skipped_occurrences")
    scheduled_for = models.DateTimeField()
    reason = models.CharField(max_length=16, choices=SkipReason.choices)
    detail = models.TextField(blank=True)
    #: The execution the overlap policy cancelled, if any.
    execution = models.ForeignKey(Execution, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    recorded_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["-scheduled_for"]
        constraints = [
            models.UniqueConstraint(fields=["task", "scheduled_for"], name="skipped_occurrence_unique"),
        ]
        # The dashboard's "skipped in the last 24 h, by reason" reads this range only.
        indexes = [models.Index(fields=["recorded_at", "reason"], name="skipped_recorded_idx")]

    def __str__(self) -> str:
        return f"{self.task_id} at {self.scheduled_for:%Y-%m-%d %H:%M:%S}: {self.reason}"


class WorkflowMap(models.Model):
    """A map step of a workflow run (a task with ``map_over``): the items its upstream's output
    listed, and once every item's run ended, how the step as a whole ended and what its followers
    get (the items' outputs in order). Written by :mod:`executions.transitions.follow` under the
    workflow run's lock: created when the step is due (with its first items' runs), finished by
    the end of its last item. Unique per task and workflow run."""

    task = models.ForeignKey("tasks_app.Task", on_delete=models.CASCADE, related_name="+", db_index=False)
    #: The workflow run (its root's execution id), as ``Execution.workflow_run``.
    workflow_run = models.BigIntegerField()
    #: The upstream run whose output listed the items.
    upstream = models.BigIntegerField()
    #: The items (each one an item run's input), in order.
    items = models.JSONField(default=list)
    #: How many items run at once (the task's ``map_concurrency`` when the step started).
    concurrency = models.PositiveSmallIntegerField()
    #: Empty while items run; SUCCEEDED (every item succeeded) or FAILED once every item ended
    #: (one failed for good), or at once when the list could not be read.
    status = models.CharField(max_length=16, blank=True, default="")
    #: Once ended: what its followers get as input, the list of its items' documents in order.
    result = models.JSONField(null=True, blank=True)
    #: Why it failed without running items (no list at its path, too many items).
    error = models.TextField(blank=True, default="")
    #: The run whose end ended the step (its last item's; the upstream's when it had no items).
    ended_by = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workflow_run", "task"], name="workflow_map_once")]

    def __str__(self) -> str:
        return f"map of {self.task_id} in workflow run {self.workflow_run}: {len(self.items)} items"


class WorkflowSkip(models.Model):
    """A step of a workflow run that will not run, and why: written by
    :mod:`executions.transitions.follow` in the transaction of the end that decided it (its join
    rule over its upstreams, a condition, a skipped upstream, its task paused), at most once per
    (task, workflow run), and never for a task that has a run in it. Its followers then follow
    their own join rules (a skipped step is neither a success nor a failure). A run of the task in
    the workflow run created later (an upstream retried on request) takes precedence over it.
    """

    task = models.ForeignKey("tasks_app.Task", on_delete=models.CASCADE, related_name="+", db_index=False)
    #: The workflow run (its root's execution id), as ``Execution.workflow_run``.
    workflow_run = models.BigIntegerField()
    reason = models.TextField()
    recorded_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workflow_run", "task"], name="workflow_skip_once")]

    def __str__(self) -> str:
        return f"{self.task_id} skipped in workflow run {self.workflow_run}: {self.reason}"


class WorkerStatus(models.TextChoices):
    ALIVE = "ALIVE"  #: heartbeating
    STOPPED = "STOPPED"  #: shut down cleanly
    DEAD = "DEAD"  #: stopped heartbeating; its executions were handed back


class Worker(models.Model):
    id = models.CharField(max_length=200, primary_key=True, help_text="host:pid")
    #: Celery's name for the worker (its ``-n``, e.g. ``clients@vm``): what Flower and ``celery
    #: inspect`` call it. Empty for rows written before it was kept.
    node_name = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="Celery's node name (-n), as Flower shows it",
    )
    hostname = models.CharField(max_length=150)
    pid = models.PositiveIntegerField()
    status = models.CharField(max_length=8, choices=WorkerStatus.choices, default=WorkerStatus.ALIVE)
    started_at = models.DateTimeField(db_default=Now())
    last_heartbeat = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["-last_heartbeat"]

    def __str__(self) -> str:
        return self.id


#: Shards per (minute, team, runner) rollup row: concurrent finishes of one minute spread over
#: this many rows (by the writing transaction's id; by execution id before migration 0030)
#: instead of queueing on one row lock. Frozen in the rollup triggers (migration 0006).
ROLLUP_SHARDS = 8

#: The histogram columns of :class:`RunRollup`, bucket by bucket (see :mod:`executions.histogram`).
LATENESS_COLUMNS = tuple(f"lateness_{i:02d}" for i in range(BUCKETS))
DURATION_COLUMNS = tuple(f"duration_{i:02d}" for i in range(BUCKETS))
#: Outcome columns of :class:`RunRollup`: the three terminal statuses, and attempts that failed
#: and were scheduled again (RUNNING -> SCHEDULED).
OUTCOME_COLUMNS = {"SUCCEEDED": "succeeded", "FAILED": "failed", "CANCELLED": "cancelled", "RETRIED": "retried"}
#: The extremes kept beside each histogram of :class:`RunRollup` (seconds; NULL when the row's
#: histogram is empty): the smallest of a row's values in each ``*_min``, the largest in each
#: ``*_max``. A percentile read off the buckets is clamped to them (executions.histogram.percentile).
MIN_COLUMNS = ("lateness_min", "duration_min")
MAX_COLUMNS = ("lateness_max", "duration_max")
#: Every counter column of :class:`RunRollup`, in a fixed order.
COUNTER_COLUMNS: tuple[str, ...] = (*OUTCOME_COLUMNS.values(), *LATENESS_COLUMNS, *DURATION_COLUMNS)
#: Every column of :class:`RunRollup` that rows are merged by: the counters (added), then the
#: extremes (the smallest of the ``*_min``, the largest of the ``*_max``).
MERGED_COLUMNS: tuple[str, ...] = (*COUNTER_COLUMNS, *MIN_COLUMNS, *MAX_COLUMNS)


class RunRollup(models.Model):
    """Finished attempts per (minute, team, runner, shard): counts by outcome and histograms of
    lateness and duration. The dashboard reads aggregates here, never from the executions.

    Written only by a database trigger on the execution table (migration 0006), in the same
    transaction as the status change it counts: an attempt is counted when its execution
    reaches SUCCEEDED, FAILED or CANCELLED (superseded rows excepted), or goes RUNNING ->
    SCHEDULED for a retry. Terminal states are final and each status write is conditional, so
    every attempt is counted exactly once, by whichever process ended it.

    * ``minute``: the minute (UTC) the attempt ended;
    * lateness: ``started_at - due_at`` of the attempt (how long after it was due a worker
      started it: jitter and retry backoff are part of ``due_at``, not lateness);
    * duration: end - ``started_at`` (a run resumed after its worker died includes the gap);
    * an execution cancelled before it started counts as cancelled, in neither histogram;
    * ``lateness_min``/``lateness_max``, ``duration_min``/``duration_max``: the extremes of the
      values counted in each histogram (NULL for none), which bound its percentiles.
    """

    minute = models.DateTimeField()
    #: The execution's team (its task's when it ended): a team's members see its figures. No
    #: foreign key: history outlives teams, and nothing to check per finish. Rows from before
    #: teams are their task owner's personal team's (migration 0029).
    team_id = models.IntegerField()
    runner = models.CharField(max_length=64)
    shard = models.SmallIntegerField()
    succeeded = models.PositiveIntegerField(default=0, db_default=0)
    failed = models.PositiveIntegerField(default=0, db_default=0)
    cancelled = models.PositiveIntegerField(default=0, db_default=0)
    retried = models.PositiveIntegerField(default=0, db_default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["minute", "team_id", "runner", "shard"], name="runrollup_unique_key"),
        ]
        # The shard rows still to be folded (see executions.rollup.rollup_compact): a few minutes' worth.
        indexes = [models.Index(fields=["minute"], condition=Q(shard__gt=0), name="runrollup_unfolded_idx")]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} team {self.team_id} {self.runner} #{self.shard}"


for _column in (*LATENESS_COLUMNS, *DURATION_COLUMNS):
    RunRollup.add_to_class(_column, models.PositiveIntegerField(default=0, db_default=0))
for _column in (*MIN_COLUMNS, *MAX_COLUMNS):
    RunRollup.add_to_class(_column, models.FloatField(null=True, blank=True))


class RollupEpoch(models.Model):
    """One row: a counter bumped, in the same transaction, by whatever changes minutes of the
    rollup after they have settled (:func:`executions.rollup.rollup_rebuild`,
    :func:`executions.rollup.rollup_prune`). Figures of settled minutes kept between dashboard
    renders are keyed by it (:func:`executions.rollup.rollup_series_settled`), so no process
    serves a settled minute from before such a change. The status trigger never bumps it: it
    writes only to the minute its statement runs in."""

    epoch = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"rollup epoch {self.epoch}"


class TaskRollup(models.Model):
    """Finished attempts of one task in one hour (UTC), for "the tasks failing most".

    Maintained by the same trigger as :class:`RunRollup`. ``failures`` counts attempts that
    ended FAILED or were retried after failing; ``attempts`` every counted attempt.
    """

    hour = models.DateTimeField()
    # No constraint: rows outlive a deleted task until pruned, and the trigger needs no FK check.
    task = models.ForeignKey(
        "tasks_app.Task", on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    #: The task's team (the execution's, when it ended; moved with the task,
    #: :func:`tasks_api.moving.task_move`). No foreign key, as :attr:`RunRollup.team_id`.
    team_id = models.IntegerField()
    #: As :attr:`RunRollup.shard`: the writing transaction's id modulo :data:`ROLLUP_SHARDS`, so that
    #: transactions ending runs of one task at once (a map step's items) do not take turns on one
    #: row; :func:`executions.rollup.rollup_compact` folds an hour's shards into 0 once it is past.
    shard = models.SmallIntegerField(default=0, db_default=0)
    attempts = models.PositiveIntegerField(default=0, db_default=0)
    failures = models.PositiveIntegerField(default=0, db_default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task", "hour", "shard"], name="taskrollup_unique_shard")]
        indexes = [
            # Only hours with failures: "failing most" reads these, not every task's every hour.
            # Covering (PostgreSQL): the top ten are picked by an index-only scan.
            models.Index(
                fields=["hour", "team_id"],
                include=["task", "failures"],
                condition=Q(failures__gt=0),
                name="taskrollup_failing_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"task {self.task_id} at {self.hour:%Y-%m-%d %H}:00"


class ArchiveIndex(models.Model):
    """Where pruned executions of one task went: one row per (archive file, task).

    Written by :mod:`executions.retention` in the transaction that deletes the executions, after
    the file was stored, so a row here always names a complete file. A file may hold several
    tasks' executions (one pruning batch); each task's row counts and checksums its own.
    """

    # No constraint: the index outlives the task (a deleted task's history stays findable).
    task = models.ForeignKey(
        "tasks_app.Task", on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    owner_id = models.IntegerField()
    #: The file's name in the ``tms_archive`` storage.
    file_name = models.CharField(max_length=300)
    #: The span of the archived executions' scheduled times.
    period_from = models.DateTimeField()
    period_to = models.DateTimeField()
    executions = models.PositiveIntegerField()
    events = models.PositiveIntegerField()
    skipped = models.PositiveIntegerField(help_text="Skipped-occurrence rows tied to the archived executions.")
    #: SHA-256 of the whole file (hex), as stored.
    file_sha256 = models.CharField(max_length=64)
    #: SHA-256 (hex) of this task's archived execution ids, ascending, one decimal per line.
    ids_sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["-period_to", "-id"]
        constraints = [models.UniqueConstraint(fields=["file_name", "task"], name="archiveindex_file_task")]
        indexes = [models.Index(fields=["task", "-period_to"], name="archiveindex_task_idx")]

    def __str__(self) -> str:
        return f"{self.file_name} (task {self.task_id}, {self.executions} executions)"


class LimitBucket(models.Model):
    """One budget of a named limit: the limit itself (scope ``key``), or one runner alias or
    target host of it (``key``). Its row is what concurrent claims lock (``FOR UPDATE``), so
    the claims of one budget are serialised across every worker and nothing else is.

    ``next_start_at`` is where the next run deferred by a rate window is booked: deferred runs
    are spread one rate interval apart instead of all waking when the window rolls."""

    limit = models.ForeignKey("tasks_app.Limit", on_delete=models.CASCADE, related_name="buckets")
    key = models.CharField(max_length=200)
    next_start_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["limit", "key"], name="limit_bucket_unique_key")]

    def __str__(self) -> str:
        return f"{self.limit_id}:{self.key}"


class LimitSlot(models.Model):
    """A concurrency slot held by a RUNNING execution: a lease, live while ``expires_at`` is
    ahead. The worker's lease keeper renews it with the execution's lease, so a worker that dies
    holding one frees it when it lapses; the end of the run deletes it at once."""

    bucket = models.ForeignKey(LimitBucket, on_delete=models.CASCADE, related_name="slots", db_index=False)
    execution = models.ForeignKey(Execution, on_delete=models.CASCADE, related_name="+")
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["bucket", "execution"], name="limit_slot_unique")]

    def __str__(self) -> str:
        return f"slot of {self.execution_id} in {self.bucket_id}"


class LimitStart(models.Model):
    """A start counted against a bucket's rate windows, at the time of the claim's event. Rows
    older than the bucket's longest window are deleted by the next claim of the bucket."""

    id = models.BigAutoField(primary_key=True)
    bucket = models.ForeignKey(LimitBucket, on_delete=models.CASCADE, related_name="+", db_index=False)
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["bucket", "at"], name="limit_start_bucket_at_idx")]

    def __str__(self) -> str:
        return f"start in {self.bucket_id} at {self.at}"


class WorkflowRunHold(models.TextChoices):
    """Whether a workflow run may start further steps (:class:`WorkflowRunControl`)."""

    ACTIVE = "active"  #: its steps' ends start their followers, as always
    PAUSED = "paused"  #: no step starts; the running ones finish; a resume starts what was held
    CANCELLED = "cancelled"  #: no step starts any more; its active steps were cancelled


class WorkflowRunControl(models.Model):
    """What was asked of one workflow run: pause, resume, cancel, and its automatic retries (issue 48). Keyed by the
    run's id (its root's execution id); written lazily, by the first such request, so a workflow
    run nobody paused or cancelled has no row (and costs its steps' ends one indexed read).

    Written only by :mod:`executions.transitions.hold`, under the workflow run's advisory lock,
    the one a step's end holds while it reads this row (:func:`~executions.transitions.hold.halted_runs`):
    a step's end either starts its followers before a pause commits, or sees the pause.
    No foreign key: retention deletes executions with SQL of its own, and a row outliving its
    runs is harmless."""

    workflow_run = models.BigIntegerField(primary_key=True)
    hold = models.CharField(max_length=16, choices=WorkflowRunHold.choices, default=WorkflowRunHold.ACTIVE)
    changed_at = models.DateTimeField(db_default=Now())
    #: Who made the last change (a user, ``system``).
    changed_by = models.CharField(max_length=200, blank=True, default="")
    #: Why (shown on the run): "paused by alice", "cancelled by user".
    reason = models.CharField(max_length=500, blank=True, default="")
    #: How many times it was retried after failing, by its root task's ``workflow_retries``.
    retries = models.PositiveSmallIntegerField(default=0, db_default=0)

    def __str__(self) -> str:
        return f"workflow run {self.workflow_run}: {self.hold}"


class ApprovalDecision(models.TextChoices):
    APPROVED = "approved"
    REJECTED = "rejected"


class Approval(models.Model):
    """A person's decision on a run of an ``approval`` step (issue 48): who, when, what, why.

    Written by :mod:`executions.approvals` in the transaction of the run's end, and only by the
    decision that won that end (a conditional transition): one row per run and attempt. A run
    still waiting has no row (it is a RUNNING execution of an approval runner). No foreign key to
    the execution: retention deletes executions with SQL of its own (as for
    :class:`WorkflowRunControl`); ``task_id`` and the execution's id name what was decided."""

    id = models.BigAutoField(primary_key=True)
    execution_id = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    task_id = models.UUIDField()
    #: When the run began waiting (the attempt's start).
    requested_at = models.DateTimeField(null=True, blank=True)
    decision = models.CharField(max_length=16, choices=ApprovalDecision.choices)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    #: The approver's username when they decided (kept if the user is deleted).
    decided_by_name = models.CharField(max_length=150)
    decided_at = models.DateTimeField(db_default=Now())
    comment = models.TextField(blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["execution_id", "attempt"], name="approval_once_per_attempt")]

    def __str__(self) -> str:
        return f"execution {self.execution_id}: {self.decision} by {self.decided_by_name}"


class ReceivedEvent(models.Model):
    """A named event posted to ``POST /api/v1/events/{name}`` (or a signed event URL), kept for
    the wait-for-event steps that match it (``wait_event`` runner) and for the record of what it
    started. One row per team it was posted in: an event only ever reaches its team's tasks.
    Pruned with the executions by retention (``executions.retention``)."""

    name = models.CharField(max_length=200)
    team_id = models.IntegerField()
    payload = models.JSONField(default=dict, blank=True)
    #: The ``Idempotency-Key`` it came with (empty: none).
    key = models.CharField(max_length=255, blank=True, default="")
    received_at = models.DateTimeField(db_default=Now())
    #: Who posted it (a username, or ``event-url:<id>``).
    actor = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        indexes = [
            models.Index(fields=["team_id", "name", "received_at"], name="received_event_match_idx"),
            models.Index(fields=["received_at"], name="received_event_age_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.received_at:%Y-%m-%d %H:%M:%S})"


class EventRun(models.Model):
    """A run a :class:`ReceivedEvent` started (or joined, debounced) for one subscribed task, with
    the debounce key it was given: the pending run the next event of the same key joins."""

    event = models.ForeignKey(ReceivedEvent, on_delete=models.CASCADE, related_name="runs")
    task = models.ForeignKey("tasks_app.Task", on_delete=models.CASCADE, related_name="+", db_index=False)
    execution_id = models.BigIntegerField()
    #: The value of the subscription's ``debounce_key`` in the payload, as JSON text ('' without debounce).
    debounce_key = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["task", "debounce_key", "-execution_id"], name="event_run_debounce_idx")]

    def __str__(self) -> str:
        return f"event {self.event_id}: execution {self.execution_id}"
