"""Check the fleet's invariants (reservations.invariants) and print what each found wrong.

    python manage.py bc_invariants < nodes.json

Standard input: {"held": {node id: {allocation id: {"reservation": id, "gpus": [...]}}},
"joined": [node id, ...]}, what the nodes themselves hold and which machines joined. The
answer is one JSON object: {"I1": [problem, ...], "I3": [...], "I4": [...], "I5": [...]}.
"""

from __future__ import annotations

import json
import sys

from django.core.management.base import BaseCommand

from reservations.invariants import check


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args: object, **options: object) -> None:
        given = json.load(sys.stdin)
        self.stdout.write(json.dumps(check(given.get("held", {}), given.get("joined", []))))
