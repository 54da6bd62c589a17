"""Check the fleet's invariants (reservations.invariants) and print what each found wrong.

    python manage.py bc_invariants < nodes.json

Standard input: {"machines": {node id: machine root, ...}, "joined": [node id, ...],
"settleSeconds": 10}: where the machines keep their hold files (read once the ledger's
snapshot is taken), which machines joined, and how long a binding or a release may be on
its way. The answer is one JSON object: {"I1": [problem, ...], "I3": [...], "I4": [...],
"I5": [...]}.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

from django.core.management.base import BaseCommand

from reservations.invariants import check, held_on


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args: object, **options: object) -> None:
        given = json.load(sys.stdin)
        machines = {node: Path(root) for node, root in given.get("machines", {}).items()}
        self.stdout.write(json.dumps(check(partial(held_on, machines), given.get("joined", []),
                                           float(given.get("settleSeconds", 10)))))
