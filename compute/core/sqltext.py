"""Raw SQL that follows the models: table names come from the models, fragments are composed
with psycopg's `sql` module.

    BOOKED = tables('''SELECT count(*) FROM {Booking} b JOIN {Device} d ON d.id = b.device_id
                        WHERE {schedulable}''', Booking=Booking, Device=Device)
    query = fill(BOOKED, schedulable=schedulable_sql())

`tables` writes each `{Model}` (a capitalised placeholder) as that model's quoted table name,
once, when the module loads; lower-case placeholders are left for `fill`, which composes them
with `psycopg.sql` (every placeholder must be given: one forgotten is an error, not SQL with
braces in it). Neither touches `%s` parameters.
"""

from __future__ import annotations

import re

from django.db.models import Model
from psycopg import sql

MODEL_PLACEHOLDER = re.compile(r"\{([A-Z]\w*)\}")


def table(model: type[Model]) -> str:
    """The model's table name, quoted for SQL."""
    return sql.Identifier(model._meta.db_table).as_string()


def tables(template: str, /, **models: type[Model]) -> str:
    """`template` with each `{Model}` as the table of the model given under that name."""

    def name(match: re.Match[str]) -> str:
        if match.group(1) not in models:
            raise KeyError(f"no model given for {match.group(0)} in SQL")
        return table(models[match.group(1)])

    return MODEL_PLACEHOLDER.sub(name, template)


def fill(template: str, /, **parts: str) -> str:
    """`template` with each `{name}` as the SQL text given for it."""
    return sql.SQL(template).format(**{k: sql.SQL(v) for k, v in parts.items()}).as_string()


def passed_on(*names: str) -> dict[str, str]:
    """Placeholders a first `fill` keeps for a later one: `fill(t, a=…, **passed_on("b"))`."""
    return {name: "{" + name + "}" for name in names}
