"""The embedded IAM, with every decision appended to a file and labelled with the process
that asked for it (`BETTER_COMPUTE_PROCESS`: api, gateway, worker-1 …).

Set `BETTER_COMPUTE_IAM_BACKEND=compute.platform.iam.logged.LoggedIAM` and
`BETTER_COMPUTE_IAM_DECISION_LOG=<file>` to count IAM decisions by origin across every
process of a deployment; the fleet simulator checks that the fleet path (gateway, workers)
makes none.
"""

from __future__ import annotations

import json
from typing import Any

from compute.core import config
from compute.core.api.registry import Resource
from compute.platform.iam import Decision
from compute.platform.iam.embedded import EmbeddedIAM


class LoggedIAM(EmbeddedIAM):
    def decide(self, principal: Any, action: str, resource: Resource,
               context: dict[str, Any]) -> Decision:
        decision = super().decide(principal, action, resource, context)
        if path := config.text("BETTER_COMPUTE_IAM_DECISION_LOG"):
            line = json.dumps({"origin": config.text("BETTER_COMPUTE_PROCESS"),
                               "action": action, "allowed": decision.allowed})
            with open(path, "a", encoding="utf-8") as log:  # one short line: one write
                log.write(line + "\n")
        return decision
