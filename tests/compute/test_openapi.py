from openapi_spec_validator import validate

from compute.core.api.registry import REGISTRY


def test_openapi_document_lists_every_method_and_validates(client, db):
    response = client.get("/api/compute/openapi.json")
    assert response.status_code == 200
    document = response.json()
    validate(document)
    listed = {op["operationId"] for item in document["paths"].values() for op in item.values()}
    assert listed == {f"{g}.{m}" for g, m in REGISTRY} | {"events.watch"}


def test_openapi_schema_is_the_validating_schema(client, db):
    document = client.get("/api/compute/openapi.json").json()
    body = document["paths"]["/api/compute/pools/create"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert {"siteId", "class", "gpuModel", "policy", "idempotencyKey", "tenantId"} <= set(
        schema["properties"])
    assert schema["additionalProperties"] is False
    acceptance = schema["properties"]["policy"]["properties"]["acceptance"]
    assert "diag.nvml" in acceptance["items"]["properties"]["kind"]["enum"]


def test_each_method_names_the_file_and_function_that_handles_it(client, db):
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent.parent
    paths = client.get("/api/compute/openapi.json").json()["paths"]
    for url, item in paths.items():
        if "post" not in item:
            continue  # the watch stream
        path, _, function = item["post"]["x-handler"].partition(":")
        tree = ast.parse((root / path).read_text())
        names = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert function in names, (url, item["post"]["x-handler"])
        group, method = url.rsplit("/", 2)[-2:]
        expected = f"{group}_{method}".replace("joinTokens", "join_tokens")
        assert function == expected, (url, function)


def test_a_result_unlike_its_schema_is_caught(db):
    from tests.support.shapes import mismatch

    site = {"id": "site_1", "tenantId": "tnt_1", "kind": "shared", "region": "eu-1",
            "name": "a", "createdAt": "2026-11-30T00:00:00Z"}
    assert mismatch("sites.get", site) is None
    assert "region" in mismatch("sites.get", {**site, "region": None})
    assert "extra" in mismatch("sites.get", {**site, "extra": 1})
    assert "nextAfter" in mismatch("sites.list", {"items": [site]})


def test_every_method_declares_its_result(client, db):
    paths = client.get("/api/compute/openapi.json").json()["paths"]
    for path, item in paths.items():
        if "post" not in item:
            continue
        result = (item["post"]["responses"]["200"]["content"]["application/json"]["schema"]
                  ["properties"]["result"])
        assert result.get("properties") or result.get("oneOf") or result.get("items"), path
