from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from runners import sandbox
from tms_core.conf import tms_settings


class Command(BaseCommand):
    help = (
        "Prepare this host for sandboxed subprocess runs (as root): create the run users "
        "TMS_SUBPROCESS_RUN_USER_PREFIX0..N-1 (system users, no login, no home) and their claim folder, "
        "then print the sandbox mode runs get here and whether slirp4netns and nft (egress) are installed. "
        "--check only reports what is missing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--check", action="store_true", help="Change nothing; exit 1 if anything is missing.")

    def handle(self, *args: Any, **options: Any) -> None:
        missing = sandbox.missing_run_users()
        if missing and not options["check"]:
            if os.geteuid() != 0:
                raise CommandError(
                    f"{len(missing)} run users are missing ({missing[0]}, ...) and only root can create them: "
                    "run this command as root (sudo)."
                )
            useradd = shutil.which("useradd", path="/usr/sbin:/sbin:/usr/bin:/bin")
            if useradd is None:
                raise CommandError("useradd is not installed (Debian: apt-get install -y passwd).")
            for name in missing:
                # One group per user: a run's files are shared with nobody.
                subprocess.run(
                    [useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                     "--shell", "/usr/sbin/nologin", "--comment", "TMS run user", name],
                    check=True,
                )  # fmt: skip
            self.stdout.write(f"created {len(missing)} run users")
            missing = sandbox.missing_run_users()
        if os.geteuid() == 0 and not options["check"]:
            os.makedirs(tms_settings().SUBPROCESS_RUN_USER_LOCKS, mode=0o700, exist_ok=True)
        names = sandbox.run_user_names()
        present = [name for name in names if name not in missing]
        if present:
            uids = [pwd.getpwnam(name).pw_uid for name in present]
            self.stdout.write(f"run users: {len(present)} of {len(names)} (uids {min(uids)}..{max(uids)})")
        self.stdout.write(f"bubblewrap: {sandbox.bwrap_path() or 'not installed (apt-get install -y bubblewrap)'}")
        # Needed only by runners whose egress option is open; their starts fail without them.
        self.stdout.write(
            f"slirp4netns: {sandbox.slirp4netns_path() or 'not installed (apt-get install -y slirp4netns)'}"
        )
        self.stdout.write(f"nftables: {sandbox.nft_path() or 'not installed (apt-get install -y nftables)'}")
        try:
            mode = sandbox.resolve_mode()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(self.style.SUCCESS(f"sandbox mode of subprocess runs on this host: {mode}"))
