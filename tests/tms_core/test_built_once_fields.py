"""Serializer fields built once per class and copied per instance (BuiltOnceFieldsMixin, issue 33):
each instance still has fields of its own, bound to it."""

from __future__ import annotations

from rest_framework import serializers

from tms_core.api.base import BuiltOnceFieldsMixin


class Entry(serializers.Serializer):
    word = serializers.CharField(max_length=5)

    def validate_word(self, value: str) -> str:
        return f"{value}:{self.context['who']}"


class Sample(BuiltOnceFieldsMixin, serializers.Serializer):
    name = serializers.CharField(max_length=10)
    tags = serializers.ListField(child=serializers.CharField(max_length=3), required=False)
    entries = serializers.ListField(child=Entry(), required=False)
    label = serializers.SerializerMethodField()

    def get_label(self, obj: dict) -> str:
        return f"{obj['name']}!"


def test_each_instance_gets_its_own_fields_bound_to_it():
    first, second = Sample(context={"who": "a"}), Sample(context={"who": "b"})
    for name in ("name", "tags", "entries", "label"):
        assert first.fields[name] is not second.fields[name], name
        assert first.fields[name].parent is first and second.fields[name].parent is second
    assert first.fields["tags"].child is not second.fields["tags"].child
    assert first.fields["tags"].child.parent is first.fields["tags"]
    assert first.fields["entries"].child.parent is first.fields["entries"]
    first.fields["name"].required = False
    assert Sample().fields["name"].required, "a change to one instance's field stays there"


def test_copies_validate_and_render_as_built_fields_do():
    one = Sample(data={"name": "x", "tags": ["ab"], "entries": [{"word": "hi"}]}, context={"who": "a"})
    assert one.is_valid(), one.errors
    assert one.validated_data["entries"] == [{"word": "hi:a"}], "a nested child reads its own root's context"
    other = Sample(data={"name": "y", "entries": [{"word": "yo"}]}, context={"who": "b"})
    assert other.is_valid(), other.errors
    assert other.validated_data["entries"] == [{"word": "yo:b"}]
    refused = Sample(data={"name": "z" * 11, "tags": ["long"]})
    assert not refused.is_valid()
    assert refused.errors["name"] == ["Ensure this field has no more than 10 characters."]
    assert refused.errors["tags"] == {0: ["Ensure this field has no more than 3 characters."]}
    assert Sample({"name": "n"}).data["label"] == "n!"
