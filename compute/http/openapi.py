"""The OpenAPI 3 document, generated from the registry's own input schemas."""

from __future__ import annotations

from typing import Any

from django.core.validators import RegexValidator
from django.http import HttpRequest, JsonResponse
from rest_framework import fields, serializers

from compute.core.api.inputs import Input, PublicIdField
from compute.core.api.registry import REGISTRY
from compute.core.errors import all_error_classes

_SCALARS: list[tuple[type, dict[str, Any]]] = [
    (fields.BooleanField, {"type": "boolean"}),
    (fields.IntegerField, {"type": "integer"}),
    (fields.FloatField, {"type": "number"}),
    (fields.DateTimeField, {"type": "string", "format": "date-time"}),
    (fields.DateField, {"type": "string", "format": "date"}),
    (fields.JSONField, {}),
    (fields.DictField, {"type": "object"}),
]


# Text is stored in Postgres, which takes no NUL character: the document says so.
NO_NUL = r"^[^\u0000]*$"
NON_BLANK = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"


def field_schema(field: fields.Field) -> dict[str, Any]:
    if isinstance(field, serializers.ListSerializer):
        schema = {"type": "array", "items": field_schema(field.child)}
        return _bounded(field, schema, ("min_length", "minItems"), ("max_length", "maxItems"))
    if isinstance(field, Input):
        return input_schema(type(field))
    if isinstance(field, fields.ChoiceField):
        schema: dict[str, Any] = {"type": "string", "enum": [str(c) for c in field.choices]}
    elif isinstance(field, fields.ListField):
        schema = {"type": "array", "items": field_schema(field.child)}
    elif isinstance(field, fields.DictField):
        schema = {"type": "object", "additionalProperties": field_schema(field.child)}
        if not field.allow_empty:
            schema["minProperties"] = 1
    elif isinstance(field, PublicIdField):
        schema = {"type": "string", "pattern": f"^{field.prefix}_[0-9a-hjkmnp-tv-z]{{26}}$"}
    else:
        schema = next((dict(s) for cls, s in _SCALARS if isinstance(field, cls)),
                      {"type": "string"})
        if (pattern := _pattern(field)) is not None:  # what its validator checks, stated
            blank = isinstance(field, fields.CharField) and field.allow_blank
            schema["pattern"] = f"^$|{pattern}" if blank else pattern
            _bounded(field, schema, ("min_length", "minLength"), ("max_length", "maxLength"))
    if schema.get("type") == "array":
        _bounded(field, schema, ("min_length", "minItems"), ("max_length", "maxItems"))
    elif schema.get("type") == "string" and "pattern" not in schema:
        _bounded(field, schema, ("min_length", "minLength"), ("max_length", "maxLength"))
        if isinstance(field, fields.CharField) and not field.allow_blank:
            schema.setdefault("minLength", 1)
            schema["pattern"] = NON_BLANK  # only spaces is blank (DRF trims)
        elif isinstance(field, fields.CharField):
            schema["pattern"] = NO_NUL
    _bounded(field, schema, ("min_value", "minimum"), ("max_value", "maximum"))
    if field.allow_null:
        schema["nullable"] = True
    if field.help_text:
        schema["description"] = str(field.help_text)
    default = getattr(field, "default", fields.empty)
    if default is not fields.empty and not callable(default):
        schema["default"] = default
    return schema


def _pattern(field: fields.Field) -> str | None:
    """The pattern of the field's regular-expression validator (RegexField, SlugField), as
    the document states it."""
    for validator in field.validators:
        if isinstance(validator, RegexValidator) and not validator.inverse_match:
            regex = validator.regex
            return regex if isinstance(regex, str) else regex.pattern
    return None


def _bounded(field: fields.Field, schema: dict[str, Any], *pairs: tuple[str, str]
             ) -> dict[str, Any]:
    """Copy the field's bounds that apply to this schema's type (DRF reuses `min_length` for
    strings and lists)."""
    for attr, key in pairs:
        value = getattr(field, attr, None)
        if value is not None:
            schema[key] = value
    return schema


def input_schema(input_class: type[Input], *, with_tenant: bool = False) -> dict[str, Any]:
    instance = input_class()
    properties = {input_class.wire_name(name): field_schema(field)
                  for name, field in instance.fields.items() if not field.read_only}
    required = [input_class.wire_name(name) for name, field in instance.fields.items()
                if field.required and not field.read_only]
    if with_tenant:
        properties["tenantId"] = {
            "type": "string", "nullable": True, "maxLength": 63,
            "pattern": "^[A-Za-z0-9_-]{0,63}$",
            "description": "Tenant id or slug; the caller's own when absent, null or empty."}
    schema: dict[str, Any] = {"type": "object", "properties": properties,
                              "additionalProperties": False, **input_class.rules}
    if required:
        schema["required"] = required
    return schema


def ok_schema(result: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["ok", "result", "requestId"],
            "additionalProperties": False, "properties": {
                "ok": {"type": "boolean", "enum": [True]}, "result": result,
                "requestId": {"type": "string"}}}


def _envelope_schemas() -> dict[str, Any]:
    codes = sorted({cls.code for cls in all_error_classes()})
    return {
        "Error": {"type": "object", "required": ["ok", "error", "requestId"], "properties": {
            "ok": {"type": "boolean", "enum": [False]},
            "requestId": {"type": "string"},
            "error": {"type": "object", "required": ["code", "message", "details"],
                      "properties": {"code": {"type": "string", "enum": codes},
                                     "message": {"type": "string"},
                                     "details": {"type": "object"}}}}},
    }


def build_document() -> dict[str, Any]:
    error_ref = {"content": {"application/json": {"schema": {
        "$ref": "#/components/schemas/Error"}}}}
    statuses = sorted({cls.http_status for cls in all_error_classes()})
    paths: dict[str, Any] = {}
    for (group, method), ep in sorted(REGISTRY.items()):
        responses: dict[str, Any] = {"200": {
            "description": "ok", "content": {"application/json": {
                "schema": ok_schema(ep.returns)}}}}
        responses.update({str(s): {"description": "error", **error_ref} for s in statuses})
        paths[f"/api/compute/{group}/{method}"] = {"post": {
            "operationId": f"{group}.{method}",
            "summary": ep.summary,
            "tags": [group],
            "x-iam-action": ep.action,
            "x-mutating": ep.mutating,
            "x-handler": ep.source,
            "x-emits": list(ep.emits),
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": input_schema(ep.input, with_tenant=True)}}},
            "responses": responses,
        }}
    paths["/api/compute/events/watch"] = {"get": _watch_operation(error_ref, statuses)}
    return {
        "openapi": "3.0.3",
        "info": {"title": "better-compute API", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": _envelope_schemas(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "biam_<id>.<secret>"}},
        },
        "security": [{"bearer": []}],
    }


def _watch_operation(error_ref: dict[str, Any], statuses: list[int]) -> dict[str, Any]:
    from compute.platform.events.presenters import EVENT  # a model module: imported once apps load

    return {
        "operationId": "events.watch",
        "summary": "A live stream of the tenant's events, one JSON object per line, after "
                   "`since`; a blank line every 15 s keeps it open. It ends when the token "
                   "is revoked or expires; resume with the last `seq` seen.",
        "tags": ["events"],
        "x-iam-action": "events.watch",
        "x-handler": "compute/http/watch.py:events_watch",
        "parameters": [
            {"name": "since", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 0},
             "description": "The last event sequence number seen (0 replays the history); "
                            "without it, the stream starts at the newest event."},
            {"name": "types", "in": "query", "required": False, "schema": {"type": "string"},
             "description": "Comma-separated type globs, such as `node.*,reservation.*`."},
            {"name": "tenantId", "in": "query", "required": False,
             "schema": {"type": "string"}, "description": "Tenant id or slug."}],
        "responses": {
            "200": {"description": "the stream", "content": {"application/x-ndjson": {
                "schema": EVENT}}},
            **{str(s): {"description": "error", **error_ref} for s in statuses}},
    }


def envelope_operations() -> list[dict[str, Any]]:
    """The `POST /api/compute/<group>/<method>` operations (not the watch stream's GET)."""
    return [item["post"] for item in build_document()["paths"].values() if "post" in item]


def openapi_view(request: HttpRequest) -> JsonResponse:
    return JsonResponse(build_document())
