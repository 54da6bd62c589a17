"""Input schemas: DRF serializers that speak camelCase on the wire and refuse unknown fields."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from rest_framework import serializers
from rest_framework.exceptions import ValidationError

from bcd.contract import ids
from compute.core.errors import InvalidArgument

_CAMEL_BOUNDARY = re.compile(r"(?<!^)(?=[A-Z])")


def to_snake(name: str) -> str:
    return _CAMEL_BOUNDARY.sub("_", name).lower()


_WIRE_ALIASES: dict[str, str] = {}


def to_camel(name: str) -> str:
    if name in _WIRE_ALIASES:
        return _WIRE_ALIASES[name]
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


class Input(serializers.Serializer):
    """Base of every method's input. Wire names are camelCase; Python names are snake_case.

    `aliases` maps a wire name that cannot be a Python name (such as `class`) to its field.
    `rules` states in the OpenAPI document what is checked across fields (JSON Schema
    keywords such as `oneOf`, over wire names), so that the document is the validator.
    """

    aliases: ClassVar[dict[str, str]] = {}
    rules: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _WIRE_ALIASES.update({internal: wire for wire, internal in cls.aliases.items()})

    @classmethod
    def wire_name(cls, field_name: str) -> str:
        for wire, internal in cls.aliases.items():
            if internal == field_name:
                return wire
        return to_camel(field_name)

    @classmethod
    def wire_form(cls, validated: Mapping[str, Any]) -> dict[str, Any]:
        """Validated (snake_case) data back in its camelCase wire form, nested inputs too."""
        fields = cls().fields
        out: dict[str, Any] = {}
        for name, value in validated.items():
            field = fields[name]
            if isinstance(field, serializers.ListSerializer) and isinstance(field.child, Input):
                value = [type(field.child).wire_form(item) for item in value]
            elif isinstance(field, Input):
                value = type(field).wire_form(value)
            out[cls.wire_name(name)] = value
        return out

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise ValidationError({"non_field_errors": ["expected a JSON object"]})
        converted: dict[str, Any] = {}
        for key, value in data.items():
            name = self.aliases.get(key, to_snake(str(key)))
            field = self.fields.get(name)
            if field is None or field.read_only or self.wire_name(name) != key:
                known = ", ".join(sorted(self.wire_name(n) for n in self.fields))
                raise InvalidArgument(f"unknown field {str(key)[:60]!r} (known: {known})",
                                      field=str(key)[:60])
            converted[name] = value
        wrong = {name: [message] for name, value in converted.items()
                 if (message := _type_error(self.fields[name], value) or _nul_error(value))}
        if wrong:
            raise ValidationError(wrong)
        return super().to_internal_value(converted)


def _nul_error(value: Any) -> str | None:
    """Postgres stores no NUL character in text; say so instead of failing at the insert."""
    if isinstance(value, str):
        return "must not contain a NUL character" if "\x00" in value else None
    if isinstance(value, list):
        return next((m for item in value if (m := _nul_error(item))), None)
    if isinstance(value, Mapping):
        return next((m for item in [*value, *value.values()] if (m := _nul_error(item))), None)
    return None


def _type_error(field: serializers.Field, value: Any) -> str | None:
    """DRF coerces 7 into "7" and "1" into True; the API takes JSON types as they are."""
    if value is None:
        return None
    if isinstance(field, serializers.BooleanField):
        return None if isinstance(value, bool) else "must be a boolean"
    if isinstance(field, (serializers.IntegerField, serializers.FloatField)):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else "must be a number"
    if isinstance(field, (serializers.CharField, serializers.ChoiceField)):
        return None if isinstance(value, str) else "must be a string"
    return None


class PublicIdField(serializers.CharField):
    """A typed id such as `pool_…`: a `node_…` where a pool belongs is invalid_argument."""

    def __init__(self, prefix: str, **kwargs: Any) -> None:
        self.prefix = prefix
        kwargs.setdefault("max_length", 32)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        try:
            return ids.parse(value, expect=self.prefix)
        except ids.InvalidId as error:
            raise ValidationError(str(error)) from error


class IdempotencyKeyField(serializers.CharField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("max_length", 200)
        kwargs.setdefault("min_length", 1)
        super().__init__(**kwargs)


class ListInput(Input):
    """Paging shared by every list method."""

    limit = serializers.IntegerField(required=False, min_value=1, max_value=1000, default=100)
    after = serializers.CharField(required=False, max_length=32,
                                 help_text="Return objects whose id sorts after this one.")


def first_error(detail: Any, path: str = "") -> tuple[str, str]:
    """Flatten DRF's nested error detail into (wire path of the first bad field, message)."""
    if isinstance(detail, Mapping):
        for key, value in detail.items():
            if isinstance(key, int):
                return first_error(value, f"{path}[{key}]")
            name = "" if key == "non_field_errors" else to_camel(str(key))
            return first_error(value, f"{path}.{name}".strip(".") if name else path)
    if isinstance(detail, list) and detail:
        if all(isinstance(item, str) for item in detail):
            return path, str(detail[0])
        for index, item in enumerate(detail):
            if item:
                return first_error(item, f"{path}[{index}]")
    return path, str(detail)

