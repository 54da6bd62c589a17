"""An envelope client over Django's test client."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass
class Answer:
    status: int
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return bool(self.body.get("ok"))

    @property
    def result(self) -> Any:
        assert self.ok, self.body
        return self.body["result"]

    @property
    def code(self) -> str | None:
        return (self.body.get("error") or {}).get("code")

    @property
    def message(self) -> str:
        return (self.body.get("error") or {}).get("message", "")


class ApiClient:
    def __init__(self, client: Any, token: str | None = None, tenant_slug: str | None = None):
        self.client = client
        self.token = token
        self.tenant_slug = tenant_slug

    def as_token(self, token: str, tenant_slug: str | None = None) -> ApiClient:
        return ApiClient(self.client, token, tenant_slug)

    def raw(self, path: str, body: bytes | str, content_type: str = "application/json",
            **headers: str) -> Answer:
        if self.token:
            headers.setdefault("Authorization", f"Bearer {self.token}")
        response = self.client.post(path, data=body, content_type=content_type,
                                    headers=headers)
        return Answer(response.status_code, json.loads(response.content))

    def call(self, method: str, body: dict[str, Any] | None = None, **fields: Any) -> Answer:
        group, name = method.split(".", 1)
        payload = {**(body or {}), **fields}
        return self.raw(f"/api/compute/{group}/{name}", json.dumps(payload))

    def __call__(self, method: str, body: dict[str, Any] | None = None, **fields: Any) -> Any:
        """Call and return the result, failing the test on an error envelope."""
        return self.call(method, body, **fields).result

    def new_tenant(self, slug: str, role: str = "admin") -> ApiClient:
        tenant = self("tenants.create", slug=slug)
        minted = self("tokens.create", tenantId=tenant["id"], name=f"{slug}-{role}", role=role)
        client = ApiClient(self.client, minted["token"], slug)
        client.tenant_id = tenant["id"]  # type: ignore[attr-defined]
        return client
