"""The OpenAPI 3 document, generated from the registry's own input schemas."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from rest_framework import fields, serializers

from compute.api.inputs import Input, PublicIdField
from compute.api.registry import REGISTRY
from compute.errors import all_error_classes

_SCALARS: list[tuple[type, dict[str, Any]]] = [
    (fields.BooleanField, {"type": "boolean"}),
    (fields.IntegerField, {"type": "integer"}),
    (fields.FloatField, {"type": "number"}),
    (fields.DateTimeField, {"type": "string", "format": "date-time"}),
    (fields.JSONField, {}),
    (fields.DictField, {"type": "object"}),
]


def field_schema(field: fields.Field) -> dict[str, Any]:
    if isinstance(field, serializers.ListSerializer):
        return {"type": "array", "items": field_schema(field.child)}
    if isinstance(field, Input):
        return input_schema(type(field))
    if isinstance(field, fields.ChoiceField):
        schema: dict[str, Any] = {"type": "string", "enum": [str(c) for c in field.choices]}
    elif isinstance(field, fields.ListField):
        schema = {"type": "array", "items": field_schema(field.child)}
    elif isinstance(field, PublicIdField):
        schema = {"type": "string", "pattern": f"^{field.prefix}_[0-9a-hjkmnp-tv-z]{{26}}$"}
    else:
        schema = next((dict(s) for cls, s in _SCALARS if isinstance(field, cls)),
                      {"type": "string"})
    for attr, key in (("min_value", "minimum"), ("max_value", "maximum"),
                      ("max_length", "maxLength"), ("min_length", "minLength")):
        value = getattr(field, attr, None)
        if value is not None:
            schema[key] = value
    if field.help_text:
        schema["description"] = str(field.help_text)
    default = getattr(field, "default", fields.empty)
    if default is not fields.empty and not callable(default):
        schema["default"] = default
    return schema


def input_schema(input_class: type[Input], *, with_tenant: bool = False) -> dict[str, Any]:
    instance = input_class()
    properties = {input_class.wire_name(name): field_schema(field)
                  for name, field in instance.fields.items() if not field.read_only}
    required = [input_class.wire_name(name) for name, field in instance.fields.items()
                if field.required and not field.read_only]
    if with_tenant:
        properties["tenantId"] = {
            "type": "string", "description": "Tenant id or slug; the caller's own by default."}
    schema: dict[str, Any] = {"type": "object", "properties": properties,
                              "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def _envelope_schemas() -> dict[str, Any]:
    codes = sorted({cls.code for cls in all_error_classes()})
    return {
        "Ok": {"type": "object", "required": ["ok", "result", "requestId"], "properties": {
            "ok": {"type": "boolean", "enum": [True]}, "result": {},
            "requestId": {"type": "string"}}},
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
            "description": "ok", "content": {"application/json": {"schema": {
                "$ref": "#/components/schemas/Ok"}}}}}
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


def openapi_view(request: HttpRequest) -> JsonResponse:
    return JsonResponse(build_document())
