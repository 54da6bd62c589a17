"""Each API thread keeps one instance of each input schema (compute.http.envelope): safe only
while no field hands out a value that one call could change and the next would see."""

from __future__ import annotations

import pytest
from rest_framework import serializers
from rest_framework.fields import empty

from compute.core.api.registry import REGISTRY
from compute.core.errors import InvalidArgument
from compute.http.envelope import validate

MUTABLE = (list, dict, set, bytearray)


def fields_of(serializer):
    for name, field in serializer.fields.items():
        yield f"{type(serializer).__name__}.{name}", field
        child = getattr(field, "child", None)
        if isinstance(field, serializers.Serializer):
            yield from fields_of(field)
        elif isinstance(child, serializers.Serializer):
            yield from fields_of(child)


def test_no_input_field_defaults_to_a_shared_mutable_value():
    shared = [name for endpoint in REGISTRY.values()
              for name, field in fields_of(endpoint.input())
              if field.default is not empty and isinstance(field.default, MUTABLE)]
    assert not shared, f"give these a callable default (list, dict): {shared}"


def test_a_kept_input_forgets_the_last_call():
    endpoint = REGISTRY[("reservations", "create")]
    body = {"poolId": "pool_01jbx0000000000000000000zz", "duration": 3_600_000,
            "devices": [{"class": "gpu", "count": 2}]}
    first = validate(endpoint, dict(body))
    first["devices"].append("changed by a handler")
    with pytest.raises(InvalidArgument):
        validate(endpoint, {**body, "duration": -1})
    again = validate(endpoint, dict(body))
    assert again["devices"] == [{"device_class": "gpu", "count": 2, "topology": "any",
                                 "profile": ""}]
    assert again is not first
