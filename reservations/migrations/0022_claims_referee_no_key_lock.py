"""The nodes' claims referee locks a node's row FOR NO KEY UPDATE, as every other claimer
does: writers of a node still take turns, but a foreign-key check of a row that names the
node (taken at commit) never waits for them, so it cannot close a deadlock."""

from importlib import import_module

from django.db import migrations

_CLAIMS: str = import_module("reservations.migrations.0015_host_claims_referee").CLAIMS
_START = _CLAIMS.index("CREATE FUNCTION bc_node_claims_refereed()")
FOR_UPDATE = _CLAIMS[_START:_CLAIMS.index("END $$;", _START) + len("END $$;")].replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
NO_KEY = FOR_UPDATE.replace("FOR UPDATE;", "FOR NO KEY UPDATE;")


class Migration(migrations.Migration):

    dependencies = [
        ("reservations", "0021_reservation_models"),
    ]

    operations = [migrations.RunSQL(NO_KEY, FOR_UPDATE)]
