"""Every envelope method fuzzed from the OpenAPI document with schemathesis' generators (a
bounded number of examples each, valid and invalid): no answer is a 5xx, every answer
matches the schema the document declares, requests the document forbids are refused, and
requests it allows are never refused as malformed (400)."""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from compute.core.api.registry import REGISTRY

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "4"))  # per method and mode; raise it locally
# for a longer campaign
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance,
          negative_data_rejection, positive_data_acceptance]


@pytest.fixture(scope="module")
def schema():
    """The document, read by schemathesis once for every method (reading it takes longer
    than fuzzing one)."""
    from compute.http.openapi import build_document

    return schemathesis.openapi.from_dict(build_document())


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                         ids=["valid", "invalid"])
@pytest.mark.parametrize("method", sorted(f"{g}/{m}" for g, m in REGISTRY))
def test_the_api_answers_what_its_document_says(method, mode, schema, live_server, root_token):
    operation = schema.find_operation_by_label(f"POST /api/compute/{method}")
    assert operation is not None, method
    headers = {"Authorization": f"Bearer {root_token}"}

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    def answers_as_documented(case) -> None:
        response = case.call(base_url=live_server.url, headers=headers)
        case.validate_response(response, checks=CHECKS)

    answers_as_documented()
