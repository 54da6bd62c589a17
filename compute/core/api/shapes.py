"""What a method answers, as OpenAPI 3.0 schemas: declared beside each presenter and named by
each endpoint (`returns=`), so the document describes every result, and the tests check every
answer they see against it."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

STRING: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
NUMBER: Schema = {"type": "number"}
BOOLEAN: Schema = {"type": "boolean"}
TIME: Schema = {"type": "string", "format": "date-time"}
DATE: Schema = {"type": "string", "format": "date"}
OBJECT: Schema = {"type": "object"}  # free-form: a policy, labels, an event's payload
ANY: Schema = {}


def nullable(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


def array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def obj(**properties: Schema) -> Schema:
    """An object with exactly these keys, each always present (null where the schema says)."""
    return {"type": "object", "required": sorted(properties), "properties": properties,
            "additionalProperties": False}


def extended(base: Schema, **properties: Schema) -> Schema:
    """`base` with more keys."""
    return obj(**base["properties"], **properties)


def one_of(*schemas: Schema) -> Schema:
    return {"oneOf": list(schemas)}


def page_of(item: Schema) -> Schema:
    """What `compute.platform.paging.page` answers."""
    return obj(items=array(item), nextAfter=nullable(STRING))


def items_of(item: Schema, **more: Schema) -> Schema:
    return obj(items=array(item), **more)
