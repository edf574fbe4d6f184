"""The TMS settings dict built from TmsSettings: each default is written once, in tms_core.conf."""

from __future__ import annotations

from dataclasses import fields

import environ

from tms_core.conf import TmsSettings, tms_from_environment


def test_every_field_unset_in_the_environment_takes_its_default(monkeypatch):
    for field in fields(TmsSettings):
        monkeypatch.delenv(f"TMS_{field.name}", raising=False)
    values = tms_from_environment(environ.Env(), QUEUE_TYPE="quorum")
    assert values == {field.name: field.default for field in fields(TmsSettings)} | {"QUEUE_TYPE": "quorum"}
    assert TmsSettings(**values).QUEUE_TYPE == "quorum"


def test_a_field_is_read_from_tms_name_with_its_type(monkeypatch):
    monkeypatch.setenv("TMS_MATERIALISE_HORIZON", "12")
    monkeypatch.setenv("TMS_MATERIALISE_BATCH", "7")
    monkeypatch.setenv("TMS_TRUSTED_PROXIES", "10.0.0.0/8,127.0.0.1")
    monkeypatch.setenv("TMS_SUBPROCESS_SANDBOX", "none")
    values = tms_from_environment(environ.Env())
    assert values["MATERIALISE_HORIZON"] == 12.0 and isinstance(values["MATERIALISE_HORIZON"], float)
    assert values["MATERIALISE_BATCH"] == 7
    assert values["TRUSTED_PROXIES"] == ("10.0.0.0/8", "127.0.0.1")
    assert values["SUBPROCESS_SANDBOX"] == "none"
    assert len(values) == len(fields(TmsSettings))
