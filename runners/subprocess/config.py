"""What the ``subprocess`` runner accepts: a task's config, and the operator's OPTIONS checked at start-up.

A task's config is an argv list (``command`` + ``args``) or ``"artifact": true``, with extra
environment variables, a working folder inside its own work folder and lower (or, up to
``max_limits``, higher) resource limits: :class:`SubprocessConfigSerializer`. The operator's
allow-list of executables, with optional argument patterns, is :class:`ExecutableAllowList`;
limits and their ceilings are :func:`parse_limits`. Nothing here touches a run folder or a process.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from rest_framework import serializers

from runners import supervisor
from runners.base import MAX_OUTPUT_BYTES_LIMIT, RunSpec, arguments_field, environment_field

#: Environment variables the runner sets itself (a task may not override them).
_RESERVED_ENV_PREFIX = "TMS_"
#: Variables that make the dynamic loader inject code into any allowed executable.
_LOADER_ENV_PREFIXES = ("LD_", "DYLD_")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Variables that make an interpreter, a shell or a library the program uses load or run other
#: code than its arguments say (``PYTHONWARNINGS`` + ``BROWSER`` ran a shell from a pinned python3
#: script): refused for every program unless the operator's ``allowed_env`` names one for it.
#: Compared in upper case; a name starting with one of :data:`INJECTING_ENV_PREFIXES` counts too.
INJECTING_ENV_NAMES = frozenset(
    {
        "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "IFS", "CDPATH",
        "PERLLIB", "PERLIO", "RUBYOPT", "RUBYLIB", "CLASSPATH", "PHPRC", "TCLLIBPATH",
        "BROWSER", "EDITOR", "VISUAL", "PAGER", "MANPAGER", "SSH_ASKPASS", "SUDO_ASKPASS",
        "GCONV_PATH", "GLIBC_TUNABLES", "OPENSSL_CONF", "OPENSSL_ENGINES", "OPENSSL_MODULES",
        "HOSTALIASES", "NLSPATH", "LOCPATH",
    }
)  # fmt: skip
INJECTING_ENV_PREFIXES = (
    "PYTHON", "PERL5", "PERL_", "RUBY", "GEM_", "BUNDLE_", "NODE_", "NPM_CONFIG_", "JAVA_", "_JAVA_", "JDK_",
    "BASH_FUNC_", "GIT_", "LUA_", "PHP_", "DOTNET_", "CORECLR_", "COMPLUS_", "ERL_", "ELIXIR_", "R_",
)  # fmt: skip
#: The key of ``allowed_env`` naming variables every program (and an artifact) may be given.
ANY_PROGRAM = "*"


def injects_code(name: str) -> bool:
    """Whether a variable named ``name`` can make the program run code its arguments do not name
    (:data:`INJECTING_ENV_NAMES`, :data:`INJECTING_ENV_PREFIXES`; the loader's are refused apart)."""
    upper = name.upper()
    return upper in INJECTING_ENV_NAMES or upper.startswith(INJECTING_ENV_PREFIXES)


DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

#: Limits a run gets: resource limits (setrlimit in the command's process), the disk its work
#: folder may hold (measured by the supervisor) and the size of its private /tmp and /dev/shm
#: (bwrap mode). Their defaults, which are also what a task may ask for at most unless the
#: operator's ``max_limits`` says more, and the ceilings of what an operator may set.
LIMIT_NAMES = (*supervisor.RLIMITS, "disk_bytes", "tmp_bytes")
#: (default, ceiling) of each limit.
_LIMITS: dict[str, tuple[int, int]] = {
    "cpu_seconds": (3600, 86400),
    "memory_bytes": (2 * 1024**3, 16 * 1024**3),
    "file_bytes": (64 * 1024**2, 4 * 1024**3),
    "processes": (64, 1024),
    "open_files": (1024, 65536),
    "disk_bytes": (256 * 1024**2, 64 * 1024**3),
    "tmp_bytes": (64 * 1024**2, 4 * 1024**3),
}
DEFAULT_LIMITS = {name: default for name, (default, _) in _LIMITS.items()}
LIMIT_CEILINGS = {name: ceiling for name, (_, ceiling) in _LIMITS.items()}


class SubprocessConfigSerializer(serializers.Serializer):
    command = serializers.ListField(
        child=serializers.CharField(trim_whitespace=False),
        min_length=1,
        required=False,
        help_text='argv list, e.g. ["/usr/bin/python3", "job.py"]; no shell. The executable must be allow-listed.',
    )
    artifact = serializers.BooleanField(
        default=False, help_text="Run the task's uploaded artifact (binary or script) instead of a command."
    )
    args = arguments_field(default=list, help_text="Arguments appended to the command (or passed to the artifact).")
    env = environment_field(help_text="Extra environment variables, on top of a scrubbed base environment.")
    cwd = serializers.CharField(
        required=False,
        help_text="Working directory, relative to the attempt's own work folder (created if missing).",
    )
    max_output_bytes = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_OUTPUT_BYTES_LIMIT,
        help_text="How much of the end of stdout (and stderr, for errors) is kept.",
    )
    limits = serializers.DictField(
        child=serializers.IntegerField(min_value=1),
        default=dict,
        help_text=(
            "Limits of the run, within the operator's maxima (by default the runner's own limits: a task may "
            "lower them, not raise them): cpu_seconds, memory_bytes (address space), file_bytes (largest file "
            "written, stdout and stderr included), processes, open_files, disk_bytes (what the work folder may "
            "hold), tmp_bytes (size of the private /tmp and /dev/shm, each; bwrap mode)."
        ),
    )

    def validate_limits(self, value: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(value) - set(LIMIT_NAMES))
        if unknown:
            raise serializers.ValidationError(
                f"Unknown limits: {', '.join(unknown)} (known: {', '.join(LIMIT_NAMES)})."
            )
        return value

    def validate_command(self, value: list[str]) -> list[str]:
        if any("\0" in part for part in value):
            raise serializers.ValidationError("Arguments may not contain NUL characters.")
        return value

    def validate_args(self, value: list[str]) -> list[str]:
        return self.validate_command(value)

    def validate_env(self, value: dict[str, str]) -> dict[str, str]:
        errors = []
        for name, text in value.items():
            if not _ENV_NAME.match(name):
                errors.append(f"{name!r} is not a valid variable name.")
            elif name.upper().startswith(_RESERVED_ENV_PREFIX):
                errors.append(f"{name!r}: names starting with {_RESERVED_ENV_PREFIX} are set by TMS.")
            elif name.upper().startswith(_LOADER_ENV_PREFIXES):
                errors.append(f"{name!r}: dynamic loader variables are not allowed.")
            elif "\0" in text:
                errors.append(f"{name!r}: values may not contain NUL characters.")
        if errors:
            raise serializers.ValidationError(errors)
        return value

    def validate_cwd(self, value: str) -> str:
        path = PurePosixPath(value)
        if "\0" in value or path.is_absolute() or ".." in path.parts:
            raise serializers.ValidationError("Must be a relative path inside the work folder, without '..'.")
        return str(path)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("artifact") and attrs.get("command"):
            raise serializers.ValidationError({"command": ["Give a command or set artifact, not both."]})
        if not attrs.get("artifact") and not attrs.get("command"):
            raise serializers.ValidationError(
                {"command": ["This field is required, unless artifact is true (run the task's upload)."]}
            )
        return attrs


class ExecutableAllowList:
    """The operator's ``allowed_executables``: which programs tasks may run, and with which arguments.

    Entries are absolute paths or names looked up on ``path``. A list allows any arguments; a dict
    pins them too: ``{program: [regex, ...]}``, where every argument must match one of the
    patterns in full (an empty list: no arguments; ``None``: any arguments). A malformed option
    is :class:`ImproperlyConfigured` at start-up.
    """

    def __init__(self, alias: str, allowed: Any, *, path: str, allowed_env: Any = None) -> None:
        self.path = path
        if isinstance(allowed, Mapping):
            entries = dict(allowed)
        elif isinstance(allowed, list | tuple):
            entries = dict.fromkeys(allowed)
        else:
            entries = None
        if entries is None or not all(isinstance(item, str) and item for item in entries):
            raise ImproperlyConfigured(
                f"TMS_RUNNERS[{alias!r}]: allowed_executables must be a list of strings, or a dict of program -> "
                "argument patterns."
            )
        #: entry -> compiled argument patterns (None: any arguments).
        self.arg_patterns: dict[str, tuple[re.Pattern[str], ...] | None] = {}
        for entry, patterns in entries.items():
            if "/" in entry and not os.path.isabs(entry):
                raise ImproperlyConfigured(
                    f"TMS_RUNNERS[{alias!r}]: allowed_executables entry {entry!r} must be an absolute path or a name."
                )
            key = os.path.normpath(entry) if "/" in entry else entry
            if patterns is None:
                self.arg_patterns[key] = None
                continue
            if not isinstance(patterns, list | tuple) or not all(isinstance(item, str) for item in patterns):
                raise ImproperlyConfigured(
                    f"TMS_RUNNERS[{alias!r}]: allowed_executables[{entry!r}] must be a list of regular expressions."
                )
            try:
                self.arg_patterns[key] = tuple(re.compile(item) for item in patterns)
            except re.error as exc:
                raise ImproperlyConfigured(
                    f"TMS_RUNNERS[{alias!r}]: allowed_executables[{entry!r}]: bad pattern: {exc}"
                ) from exc
        self.allowed: tuple[str, ...] = tuple(self.arg_patterns)
        self.env_allowed = self._parse_allowed_env(alias, allowed_env)

    def _parse_allowed_env(self, alias: str, allowed_env: Any) -> dict[str, frozenset[str]]:
        """``allowed_env``: ``{program: [NAME, ...]}`` (a program as written in
        ``allowed_executables``, or ``"*"``: every program and artifact) -> the names it may be
        given beyond the rule of :meth:`refused_env`."""
        if allowed_env is None:
            return {}
        if not isinstance(allowed_env, Mapping):
            raise ImproperlyConfigured(
                f"TMS_RUNNERS[{alias!r}]: allowed_env must be a dict of program -> variable names."
            )
        parsed: dict[str, frozenset[str]] = {}
        for entry, names in allowed_env.items():
            key = os.path.normpath(entry) if isinstance(entry, str) and "/" in entry else entry
            if key != ANY_PROGRAM and key not in self.arg_patterns:
                raise ImproperlyConfigured(
                    f"TMS_RUNNERS[{alias!r}]: allowed_env names {entry!r}, which is not in allowed_executables "
                    f'(use "{ANY_PROGRAM}" for every program).'
                )
            if not isinstance(names, list | tuple) or not all(
                isinstance(name, str) and _ENV_NAME.match(name) for name in names
            ):
                raise ImproperlyConfigured(
                    f"TMS_RUNNERS[{alias!r}]: allowed_env[{entry!r}] must be a list of variable names."
                )
            parsed[key] = frozenset(names)
        return parsed

    def pinned(self, program: str) -> bool:
        """Whether ``program`` is allowed with argument patterns only (a dict entry that is not None)."""
        entry = self._entry(program)
        return entry is not None and self.arg_patterns.get(entry) is not None

    def refused_env(self, program: str | None, names: list[str]) -> list[str]:
        """Why the variables ``names`` may not be given to ``program`` (None: the task's artifact),
        one message per refused name; empty when all may.

        A program pinned to its arguments gets only the variables ``allowed_env`` names for it
        (or for ``"*"``): its arguments say what it runs, and its environment must not say more.
        Any other program (and an artifact) gets any variable but those that inject code
        (:func:`injects_code`), unless ``allowed_env`` names one for it."""
        entry = self._entry(program) if program is not None else None
        allowed = self.env_allowed.get(ANY_PROGRAM, frozenset()) | self.env_allowed.get(entry or "", frozenset())
        pinned = entry is not None and self.arg_patterns.get(entry) is not None
        refused = []
        for name in names:
            if name in allowed:
                continue
            if pinned:
                refused.append(
                    f"{name!r}: {program!r} is pinned to its arguments, and gets only the variables allowed_env "
                    "names for it."
                )
            elif injects_code(name):
                refused.append(f"{name!r} can make the program run other code (an interpreter or shell variable).")
        return refused

    def refused_argument(self, program: str, arguments: list[str]) -> str | None:
        """The first argument that the operator's patterns for ``program`` do not allow, if any."""
        entry = self._entry(program)
        patterns = self.arg_patterns.get(entry) if entry is not None else None
        if patterns is None:
            return None
        for argument in arguments:
            if not any(pattern.fullmatch(argument) for pattern in patterns):
                return argument
        return None

    def allows(self, program: str) -> bool:
        """Whether ``program`` (an absolute path or a name looked up on PATH) is allow-listed.

        Paths are compared as written, never through symlinks: allowing ``/bin/ls`` on a busybox
        system must not allow every other applet that links to the same binary.
        """
        return self._entry(program) is not None

    def _entry(self, program: str) -> str | None:
        """The allow-list entry that admits ``program``, or None."""
        if "\0" in program or ("/" in program and not os.path.isabs(program)):
            return None
        if "/" not in program and program in self.allowed:
            return program
        resolved = self.which(program)
        if resolved is None:
            return None
        for entry in self.allowed:
            if entry == resolved or ("/" not in entry and self.which(entry) == resolved):
                return entry
        return None

    def which(self, program: str) -> str | None:
        """``program``'s normalised absolute path (looked up on ``path`` if it is a name), or None."""
        if os.path.isabs(program):
            return os.path.normpath(program)
        found = shutil.which(program, path=self.path)
        return os.path.normpath(os.path.abspath(found)) if found else None


def parse_limits(alias: str, options: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """The runner's limits and the maxima a task may ask for, checked against the ceilings.

    ``max_limits`` defaults to ``limits``: a task raises a limit only where the operator
    allowed it. A default limit above an operator's lower maximum comes down to it.
    """
    given: dict[str, Mapping[str, Any]] = {}
    for name in ("limits", "max_limits"):
        value = options[name]
        if not isinstance(value, Mapping) or set(value) - set(LIMIT_NAMES):
            raise ImproperlyConfigured(
                f"TMS_RUNNERS[{alias!r}]: {name} must be a dict with keys among {', '.join(LIMIT_NAMES)}."
            )
        for key, number in value.items():
            if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= LIMIT_CEILINGS[key]:
                raise ImproperlyConfigured(
                    f"TMS_RUNNERS[{alias!r}]: {name}[{key!r}] must be a whole number from 1 to {LIMIT_CEILINGS[key]}."
                )
        given[name] = value
    limits: dict[str, int] = {}
    maxima: dict[str, int] = {}
    for key in LIMIT_NAMES:
        if key in given["limits"]:
            limits[key] = int(given["limits"][key])
        else:
            limits[key] = min(DEFAULT_LIMITS[key], int(given["max_limits"].get(key, DEFAULT_LIMITS[key])))
        maxima[key] = int(given["max_limits"].get(key, limits[key]))
        if limits[key] > maxima[key]:
            raise ImproperlyConfigured(
                f"TMS_RUNNERS[{alias!r}]: limits[{key!r}] {limits[key]} is above max_limits[{key!r}] {maxima[key]}."
            )
    return limits, maxima


def run_limits(limits: Mapping[str, int], spec: RunSpec) -> dict[str, int]:
    """The limits of one run: the runner's ``limits``, with the ones its config sets instead."""
    return {**limits, **(spec.config.get("limits") or {})}


def number_option(alias: str, options: Mapping[str, Any], name: str, *, upper: float, integer: bool = False) -> Any:
    """The OPTION ``name``, a number from 0 to ``upper`` (a whole one if ``integer``)."""
    value = options[name]
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not 0 <= value <= upper:
        raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: {name} must be a number from 0 to {upper}.")
    return value


def output_limit(spec: RunSpec, default: int) -> int:
    """How much of a run's output is kept: its config's ``max_output_bytes``, else the runner's."""
    value = spec.config.get("max_output_bytes")
    return default if value is None else int(value)
