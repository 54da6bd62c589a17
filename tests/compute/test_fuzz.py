"""Every envelope method fuzzed from the OpenAPI document with schemathesis (a bounded number
of examples each): no answer is a 5xx, every answer matches the schema the document declares,
and requests the document forbids are refused."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES = 6  # per method and mode; raise locally for a longer campaign

CONFIG = SchemathesisConfig.from_dict({"generation": {
    "mode": "all", "max-examples": EXAMPLES, "database": "none", "deterministic": True}})


@pytest.fixture
def api_schema(transactional_db):
    from compute.http.openapi import build_document

    document = build_document()
    del document["paths"]["/api/compute/events/watch"]  # a stream does not end by itself
    return schemathesis.openapi.from_dict(document, config=CONFIG)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_answers_what_its_document_says(case, live_server, root_token):
    response = case.call(base_url=live_server.url,
                         headers={"Authorization": f"Bearer {root_token}"})
    case.validate_response(response, checks=[
        not_a_server_error, status_code_conformance, response_schema_conformance,
        negative_data_rejection])
