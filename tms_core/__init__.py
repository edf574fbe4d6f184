"""Shared basics every layer may use: the database clock, durations, typed settings, domain errors.

This package sits below ``runners``, ``tasks_app`` and ``executions`` and imports none of them.
"""
