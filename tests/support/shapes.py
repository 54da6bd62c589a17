"""Every answer the tests see is checked against the schema its method declares."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from openapi_schema_validator import OAS30Validator


def mismatch(action: str, result: Any) -> str | None:
    """Why `result` does not match what `action` declares it answers (None when it does)."""
    from compute.core.api.registry import REGISTRY

    group, _, method = action.partition(".")
    schema = REGISTRY[(group, method)].returns
    wire = json.loads(json.dumps(result, cls=DjangoJSONEncoder))
    error = next(iter(OAS30Validator(schema).iter_errors(wire)), None)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(the result)"
    return f"{action}: {where}: {error.message[:300]}"


@contextlib.contextmanager
def checking_results() -> Iterator[list[str]]:
    """While inside, each successful envelope call's result is checked; the mismatches found
    are collected in the yielded list."""
    from compute.http import envelope

    found: list[str] = []
    real_call = envelope.call

    def call(principal: Any, action: str, body: dict[str, Any], request_id: str) -> Any:
        result = real_call(principal, action, body, request_id)
        if (why := mismatch(action, result)) is not None:
            found.append(why)
        return result

    envelope.call = call
    try:
        yield found
    finally:
        envelope.call = real_call
