"""A counting IAM backend: the embedded one, with every decision recorded."""

from __future__ import annotations

from typing import Any, ClassVar

from compute.core.api.registry import Resource
from compute.platform.iam import Decision
from compute.platform.iam.embedded import EmbeddedIAM


class CountingIAM(EmbeddedIAM):
    decisions: ClassVar[list[tuple[str, str, bool]]] = []

    def decide(self, principal: Any, action: str, resource: Resource,
               context: dict[str, Any]) -> Decision:
        decision = super().decide(principal, action, resource, context)
        CountingIAM.decisions.append((context.get("requestId", ""), action, decision.allowed))
        return decision
