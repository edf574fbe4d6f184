from __future__ import annotations

import os
import signal
from dataclasses import asdict
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from tms_core.clock import db_now
from tooling.harness.bench import (
    DEFAULT_SCENARIOS,
    ON_REQUEST,
    SCENARIOS,
    THROUGH,
    THROUGH_SCENARIOS,
    BenchConfig,
    Figures,
    machine,
    run_bench,
    table,
    through_table,
)
from tooling.harness.compare import Figure, compare, headline, load_average, load_recorded, record, same_machine
from tooling.management.arguments import positive


def _stop_on_sigterm() -> None:
    """End the run on SIGTERM (``kill``, a CI job's timeout) as on Ctrl-C: by unwinding, so that
    the platform processes it started, each in a session of its own that no signal to this one
    reaches, are stopped on the way out. Python's default for SIGTERM ended the command alone
    and left its workers and monitor consuming the queue."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def prepare_database() -> None:
    """Create the configured PostgreSQL database when it is missing (from the server's ``postgres`` database)."""
    import psycopg2
    from psycopg2 import sql

    params = connection.get_connection_params()
    name = params.pop("database", None) or params.pop("dbname", None)
    params["dbname"] = "postgres"
    admin = psycopg2.connect(**params)
    admin.autocommit = True  # CREATE DATABASE cannot run inside a transaction
    try:
        with admin.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
            if cursor.fetchone() is None:
                cursor.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    finally:
        admin.close()


#: The sizes of the scenarios' runs: each option a positive whole number, by default the
#: :class:`BenchConfig` field of its name; (option, help).
_SCENARIO_SIZES: tuple[tuple[str, str | None], ...] = (
    ("--herd-tasks", "herd size"),
    ("--restore-tasks", "restore size: tasks that appear all due at once, not materialised"),
    ("--workflow-runs", "workflows: workflow runs of chained noop steps (beside as many independent runs as steps)"),
    ("--workflow-steps", "workflows: steps per run"),
    (
        "--workflow-map-runs",
        "workflows: workflow runs that map items and join them (beside as many independent runs as items)",
    ),
    ("--workflow-map-items", "workflows: items each map-and-join workflow run maps"),
    ("--herd-concurrency", "processes per herd worker"),
    ("--monitors", "herd monitors"),
    ("--scale-executions", "sustained_filled, dashboard, pages, lists, prune: executions in the tables"),
    ("--scale-tasks", "sustained_filled, dashboard, pages, lists, prune: tasks in the tables"),
    ("--create-requests", None),
    ("--bulk-tasks", None),
    ("--dashboard-renders", "per user"),
    ("--list-requests", "per list path (lists)"),
    ("--fair-herd", "owner A's runs (fairness)"),
    ("--fair-few", "owner B's runs (fairness)"),
)


class Command(BaseCommand):
    help = (
        "Benchmark the platform on the configured PostgreSQL and RabbitMQ with real monitor and worker "
        "processes, beside a bare-Celery baseline of the same run. Scenarios: " + ", ".join(SCENARIOS) + "."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        defaults = BenchConfig()
        parser.add_argument(
            "--scenario",
            action="append",
            choices=[*SCENARIOS, "all"],
            help=f"repeatable; default all, which is every scenario but {', '.join(ON_REQUEST)} (run only when named)",
        )
        # In this order, which is the order --help lists them in.
        self._add_load_arguments(parser, defaults)
        self._add_scenario_sizes(parser, defaults)
        self._add_run_switches(parser)
        self._add_through_arguments(parser, defaults)
        self._add_recording_arguments(parser)

    def _add_load_arguments(self, parser: CommandParser, defaults: BenchConfig) -> None:
        """The burst and sustained load, and the workers that take it."""
        parser.add_argument("--tasks", type=positive(int), default=defaults.tasks, help="burst size")
        parser.add_argument("--rate", type=positive(float), default=None, help="sustained executions/s")
        parser.add_argument(
            "--sustained-share",
            type=positive(float),
            action="append",
            default=None,
            help="repeatable: a sustained run at this fraction of the burst rate of the same run (needs the burst "
            "scenario; overrides --rate)",
        )
        parser.add_argument(
            "--sustained-rate",
            type=positive(float),
            action="append",
            default=None,
            help="repeatable: a sustained run at this many executions/s as well (named sustained_at_<rate>)",
        )
        parser.add_argument(
            "--no-celery-eta",
            action="store_true",
            help="sustained: skip the comparison with Celery's own ETA tasks at the same rate",
        )
        parser.add_argument("--duration", type=positive(float), default=defaults.duration, help="sustained seconds")
        parser.add_argument("--workers", type=positive(int), default=defaults.workers)
        parser.add_argument("--concurrency", type=positive(int), default=defaults.concurrency)

    def _add_scenario_sizes(self, parser: CommandParser, defaults: BenchConfig) -> None:
        """The size and shape of the herd, restore, workflows, scale, create, dashboard, lists and fairness runs."""
        for option, help_text in _SCENARIO_SIZES:
            default = getattr(defaults, option.removeprefix("--").replace("-", "_"))
            parser.add_argument(option, type=positive(int), default=default, help=help_text)
        self._add_curve_arguments(parser, defaults)

    def _add_curve_arguments(self, parser: CommandParser, defaults: BenchConfig) -> None:
        """The scale scenario: the cost curve's sizes, its window, its requests and its plot."""
        parser.add_argument(
            "--scale-size",
            type=positive(int),
            action="append",
            default=None,
            help="scale: repeatable, a number of tasks on the curve (default "
            + ", ".join(f"{size:,}" for size in defaults.scale_sizes)
            + ")",
        )
        parser.add_argument(
            "--scale-every-minute",
            type=positive(int),
            default=defaults.scale_every_minute,
            help="scale: the every-minute tasks among them (all of a smaller size)",
        )
        parser.add_argument(
            "--scale-minutes",
            type=positive(int),
            default=defaults.scale_minutes,
            help="scale: whole minutes of every-minute runs measured at each size",
        )
        parser.add_argument(
            "--scale-requests",
            type=positive(int),
            default=defaults.scale_requests,
            help="scale: requests timed per path (the API's and the back office's task lists) at each size",
        )
        parser.add_argument(
            "--scale-plot",
            type=Path,
            default=defaults.scale_plot,
            help="scale: where the curve's PNG goes (matplotlib; docs/bench-scale.png for the documentation)",
        )
        parser.add_argument(
            "--scale-with",
            type=Path,
            action="append",
            default=None,
            help="scale: repeatable, an earlier run's --json file whose sizes go into this run's table, goal and "
            "plot (a curve run a size at a time)",
        )

    def _add_run_switches(self, parser: CommandParser) -> None:
        """What a run keeps, adds or sets up: the herd's due time, the history, a run with limits, the database."""
        parser.add_argument(
            "--herd-soon",
            action="store_true",
            help="herd due as soon as it is materialised, on every-minute interval tasks, instead of on the next "
            "minute boundary (a smoke run: up to a minute less waiting)",
        )
        parser.add_argument(
            "--keep-history",
            action="store_true",
            help="lists, pages: keep the filled history afterwards, and time the one already there instead of filling",
        )
        parser.add_argument(
            "--with-limit",
            action="store_true",
            help="run the burst again with a named limit on every task (what enforcing limits costs)",
        )
        parser.add_argument(
            "--prepare",
            action="store_true",
            help="create the configured PostgreSQL database when it does not exist and apply the migrations first "
            "(make bench: a fresh machine needs no set-up)",
        )

    def _add_through_arguments(self, parser: CommandParser, defaults: BenchConfig) -> None:
        """The runs again through PgBouncer or on the HA topology."""
        parser.add_argument(
            "--through",
            action="append",
            choices=THROUGH,
            default=None,
            help="also run the steady load (sustained) and the herd with the platform's processes going through "
            "something, and print their ratios to the direct runs (throughput, lateness p50/p99, CPU per run): "
            "pgbouncer, a private PgBouncer in transaction pooling mode in front of the same PostgreSQL; ha, a "
            "private Patroni pair (synchronous replication) and three-node RabbitMQ cluster (quorum queues), "
            "beside the same scenarios run the same way on the configured single servers, with the servers' CPU",
        )
        parser.add_argument(
            "--pgbouncer-pool",
            type=positive(int),
            default=None,
            help=f"with --through pgbouncer: its server connections per database (default {defaults.pgbouncer_pool})",
        )

    def _add_recording_arguments(self, parser: CommandParser) -> None:
        """Where the figures go: a JSON file, the comparison with a recorded run, a new record."""
        parser.add_argument("--json", type=Path, default=None, help="write the figures to this file")
        parser.add_argument(
            "--compare",
            type=Path,
            default=None,
            help="print each headline figure beside the one recorded in this JSON file, marking those worse "
            "by more than the noise measured (make bench: docs/bench-baseline.json)",
        )
        parser.add_argument(
            "--record",
            action="store_true",
            help="with --compare: write this run's figures into that file as the new record (when a change "
            "and its figures are accepted)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        _stop_on_sigterm()
        chosen = options["scenario"] or ["all"]
        scenarios = tuple(s for s in SCENARIOS if s in chosen or ("all" in chosen and s in DEFAULT_SCENARIOS))
        through = tuple(dict.fromkeys(options["through"] or ()))
        self._check_options(options, scenarios, through)
        recorded, about = self._load_recorded(options["compare"])
        if options["prepare"]:
            prepare_database()
            call_command("migrate", interactive=False, verbosity=0)
        load_before = load_average()
        config = self._config(options, scenarios, through)
        try:
            results = run_bench(config, options["json"])
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc
        info = machine()
        self._print_results(config, results, info)
        load_after = load_average()
        self.stdout.write(f"\nload average (1, 5, 15 min): {load_before} before, {load_after} after\n")
        if options["compare"] is None:
            return
        rows = [{**asdict(f), "ratio": f.ratio} for f in results]
        self._print_comparison(options["compare"], rows, info, recorded, about)
        if options["record"]:
            record(options["compare"], rows, when=db_now().isoformat(), machine=info, load=[load_before, load_after])
            self.stdout.write(f"Recorded this run's figures in {options['compare']}.\n")

    def _check_options(self, options: dict[str, Any], scenarios: tuple[str, ...], through: tuple[str, ...]) -> None:
        """Refuse (CommandError) options that contradict each other or need one not given."""
        if options["scale_tasks"] > options["scale_executions"]:
            raise CommandError("--scale-tasks must not exceed --scale-executions")
        if options["sustained_share"] and not {"burst", "sustained"} <= set(scenarios):
            raise CommandError("--sustained-share needs the burst and sustained scenarios")
        if options["sustained_rate"] and "sustained" not in scenarios:
            raise CommandError("--sustained-rate needs the sustained scenario")
        if options["record"] and options["compare"] is None:
            raise CommandError("--record needs --compare FILE (the file to record into)")
        if through and not set(THROUGH_SCENARIOS) & set(scenarios):
            raise CommandError(f"--through needs a scenario it runs again: {' or '.join(THROUGH_SCENARIOS)}")
        if options["pgbouncer_pool"] is not None and "pgbouncer" not in through:
            raise CommandError("--pgbouncer-pool needs --through pgbouncer")

    def _load_recorded(self, path: Path | None) -> tuple[dict[str, Figure], dict[str, Any]]:
        """The figures recorded in the ``--compare`` file and what they were run on; none when it is missing."""
        if path is None or not path.exists():
            return {}, {}
        try:
            return load_recorded(path)
        except (ValueError, TypeError, KeyError) as exc:
            raise CommandError(f"{path} is not a recorded run: {exc}") from exc

    def _config(self, options: dict[str, Any], scenarios: tuple[str, ...], through: tuple[str, ...]) -> BenchConfig:
        """The run's BenchConfig, from the options."""
        return BenchConfig(
            scenarios=scenarios,
            tasks=options["tasks"],
            rate=options["rate"],
            sustained_shares=tuple(options["sustained_share"] or ()),
            sustained_rates=tuple(options["sustained_rate"] or ()),
            celery_eta=not options["no_celery_eta"],
            duration=options["duration"],
            workers=options["workers"],
            concurrency=options["concurrency"],
            herd_tasks=options["herd_tasks"],
            restore_tasks=options["restore_tasks"],
            workflow_runs=options["workflow_runs"],
            workflow_steps=options["workflow_steps"],
            workflow_map_runs=options["workflow_map_runs"],
            workflow_map_items=options["workflow_map_items"],
            herd_concurrency=options["herd_concurrency"],
            monitors=options["monitors"],
            herd_soon=options["herd_soon"],
            scale_executions=options["scale_executions"],
            scale_tasks=options["scale_tasks"],
            scale_sizes=tuple(options["scale_size"] or BenchConfig.scale_sizes),
            scale_every_minute=options["scale_every_minute"],
            scale_minutes=options["scale_minutes"],
            scale_requests=options["scale_requests"],
            scale_plot=options["scale_plot"],
            scale_with=tuple(options["scale_with"] or ()),
            create_requests=options["create_requests"],
            bulk_tasks=options["bulk_tasks"],
            dashboard_renders=options["dashboard_renders"],
            list_requests=options["list_requests"],
            fair_herd=options["fair_herd"],
            fair_few=options["fair_few"],
            keep_history=options["keep_history"],
            with_limit=options["with_limit"],
            through=through,
            pgbouncer_pool=options["pgbouncer_pool"] or BenchConfig.pgbouncer_pool,
            settings_module=os.environ.get("DJANGO_SETTINGS_MODULE", ""),
            progress=lambda line: self.stdout.write(f"  {line}"),
        )

    def _print_results(self, config: BenchConfig, results: list[Figures], info: dict[str, Any]) -> None:
        """Print the machine, the figures' table and, after runs through something, their ratios."""
        self.stdout.write(
            f"\nmachine: {info['cpu']}, {info['cores']} cores (single-core speed {info['speed']}), "
            f"{info['memory_gib']} GiB; PostgreSQL "
            f"{info['postgresql']}; {info['rabbitmq'].splitlines()[0] if info['rabbitmq'] else ''}; "
            f"{config.workers} worker(s) x {config.concurrency} processes\n"
        )
        self.stdout.write("\n".join(table(results)))
        pooled = through_table(results)
        if pooled:
            self.stdout.write(
                "\n\nThrough a pooler or on the HA topology, beside the direct run of the same scenario (ratios "
                "other / direct; the figures of one run on a shared machine are noisy: compare several):\n"
                + "\n".join(pooled)
            )

    def _print_comparison(
        self,
        path: Path,
        rows: list[dict[str, Any]],
        info: dict[str, Any],
        recorded: dict[str, Figure],
        about: dict[str, Any],
    ) -> None:
        """Print the headline figures beside the recorded ones, and how many are worse than their noise."""
        same, why = same_machine(info, about.get("machine"))
        lines, worse = compare(headline(rows), recorded, same_machine=same)
        if recorded:
            self.stdout.write(
                f"\nAgainst the run recorded in {path} ({about.get('when', '?')}, commit "
                f"{about.get('commit', '?')}, load {about.get('load_average', '?')}):\n"
            )
            judged = "every figure" if same else "only the ratios to bare Celery of each run; the rest for reference"
            self.stdout.write(f"Machine: {why}: judging {judged}.\n")
        else:
            self.stdout.write(f"\nNothing recorded in {path} yet:\n")
        self.stdout.write("\n".join(lines) + "\n")
        if worse:
            self.stdout.write(f"\n{len(worse)} figure(s) worse than recorded by more than their noise.\n")
