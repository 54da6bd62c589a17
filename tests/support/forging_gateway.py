"""A gateway taken over: `python -m tests.support.forging_gateway` reads a plan (JSON on
stdin: a node, its epoch, the reports to forge) and does all a gateway's database role lets
it do with them: files them in the node's inbox with the gateway's own code, then tries to
write the audit log and the event outbox itself. Prints what Postgres answered (JSON)."""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    plan = json.load(sys.stdin)
    os.environ["DJANGO_SETTINGS_MODULE"] = "compute.project.settings"
    os.environ["BETTER_COMPUTE_WITHOUT_KEK"] = "1"
    import django

    django.setup()
    from django.db import DatabaseError, connection

    from fleet.services.sessions import reports_file

    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        answers: dict[str, str] = {"user": cursor.fetchone()[0]}
    for kind, fields in plan["reports"]:
        reports_file(node_id=plan["nodeId"], epoch=plan["epoch"], reports=[(kind, fields)])
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO fleet_reportinbox (node_id, epoch, kind, fields, "
                       "received_at) VALUES (%s, 999, 'session', %s, now())",
                       [plan["nodeId"], json.dumps({"change": "open", "was": "unreachable"})])
    attempts = {
        "audit": ("INSERT INTO audit_auditevent (id, tenant_id, actor_id, action, target, "
                  "allowed, reason, decision_id, request_id, origin, data, created_at) VALUES "
                  "('aud_forged', %s, %s, 'reservation.release', %s, true, 'forged', '', '', "
                  "'api', '{}', now())", [plan["tenantId"], plan["nodeId"], plan["target"]]),
        "event": ("INSERT INTO compute_event (type, tenant_id, subject, payload, created_at) "
                  "VALUES ('reservation.released', %s, %s, '{}', now())",
                  [plan["tenantId"], plan["target"]]),
        "reservation": ("UPDATE reservations_reservation SET state = 'active' WHERE id = %s",
                        [plan["target"]]),
    }
    for name, (statement, params) in attempts.items():
        try:
            with connection.cursor() as cursor:
                cursor.execute(statement, params)
            answers[name] = "written"
        except DatabaseError as refused:
            answers[name] = type(refused.__cause__ or refused).__name__
    sys.stdout.write(json.dumps(answers) + "\n")


if __name__ == "__main__":
    main()
