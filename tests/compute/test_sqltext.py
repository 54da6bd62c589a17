"""Raw SQL follows the models: table names come from them, fragments are composed by
psycopg's sql module, and no statement of the product names a table by hand."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from compute.core.sqltext import fill, passed_on, table, tables
from fleet.models import Device, Node

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("compute", "fleet", "reservations", "audit", "gateway")
SQL_WORDS = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|FROM|JOIN|ALTER|GRANT)\b")


def test_tables_are_written_from_the_models():
    text = tables("SELECT {Node}.id FROM {Node} JOIN {Device} d ON d.node_id = {Node}.id "
                  "WHERE {schedulable}", Node=Node, Device=Device)
    assert text == ('SELECT "fleet_node".id FROM "fleet_node" JOIN "fleet_device" d '
                    'ON d.node_id = "fleet_node".id WHERE {schedulable}')
    assert table(Node) == f'"{Node._meta.db_table}"'


def test_a_model_placeholder_without_its_model_is_an_error():
    with pytest.raises(KeyError, match=r"no model given for \{Booking\}"):
        tables("SELECT 1 FROM {Booking}", Node=Node)


def test_fragments_are_composed_and_none_is_forgotten():
    template = "SELECT 1 WHERE {a} AND x = %(x)s {b}"
    assert fill(template, a="y > 0", b="") == "SELECT 1 WHERE y > 0 AND x = %(x)s "
    assert fill(template, a="y > 0", **passed_on("b")) == "SELECT 1 WHERE y > 0 AND x = %(x)s {b}"
    with pytest.raises(KeyError):
        fill(template, a="y > 0")


def test_the_product_names_no_table_in_its_sql():
    names = {model._meta.db_table for model in _models()}
    pattern = re.compile(r"\b(" + "|".join(sorted(names, key=len, reverse=True)) + r")\b")
    found = []
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:  # history, written once
                continue
            tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
            for token in tokens:
                if (token.type == tokenize.STRING and SQL_WORDS.search(token.string)
                        and pattern.search(token.string)):
                    found.append(f"{path.relative_to(ROOT)}:{token.start[0]}: "
                                 f"{pattern.search(token.string).group(0)}")
    assert found == []


def _models() -> list:
    from django.apps import apps

    return list(apps.get_models())

