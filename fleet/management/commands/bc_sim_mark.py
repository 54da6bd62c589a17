"""Queue `sim.mark` commands for simulated machines, one per line read from standard input.

    python manage.py bc_sim_mark

Each input line is {"node": id, "mark": text, "pauseBefore": s, "pauseAfter": s}; for each
one a signed command is queued as the control plane queues any (the gateway delivers it,
the agent runs it at most once), and {"command": id} is printed. A `sim.mark` appends its
mark to the machine's marks file, pausing before and after so that a kill -9 can land
between journaling and acting, or between acting and reporting. Only a simulated agent
runs it. The fleet simulator keeps one of these running for its whole run.
"""

from __future__ import annotations

import json
import sys

from django.core.management.base import BaseCommand
from django.db import DatabaseError, connection, transaction

from fleet.models import Node
from fleet.services.specs import command_create, desired_state_changed


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args: object, **options: object) -> None:
        for line in sys.stdin:
            try:
                self.stdout.write(json.dumps(self._queue(json.loads(line))))
            except DatabaseError as error:  # the database restarted: a new connection next
                connection.close()
                self.stdout.write(json.dumps({"error": str(error).strip()[:200]}))
            self.stdout.flush()

    def _queue(self, asked: dict[str, object]) -> dict[str, str]:
        node = Node.objects.filter(pk=asked["node"]).exclude(simulated_root="").first()
        if node is None:
            return {"error": f"no simulated node {asked['node']}"}
        with transaction.atomic():
            command = command_create(node_id=node.id, kind="sim.mark", payload={
                key: asked[key] for key in ("mark", "pauseBefore", "pauseAfter")
                if key in asked})
            desired_state_changed()
        return {"command": command.id}
