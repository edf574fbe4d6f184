"""Placeholder replaced by the full HTTP runner."""

from runners.base import BaseRunner


class HttpRunner(BaseRunner):
    option_defaults = {"allowed_networks": []}
