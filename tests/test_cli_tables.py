"""Terminal tables: fitted to the terminal's width, ids never cut (other columns give way),
nothing cut with `--output wide`."""

from __future__ import annotations

import pytest

from compute.cli.output import table

ROWS = [{"id": f"rsv_01m8xc12zd4ft{n}qv7w9k3ab", "nodeId": f"node_01m8xcbthq4ee{n}m2k7d9zpa",
         "hostname": f"gpu-rack-{n}-very-long-host-name.example.internal",
         "state": "active", "tenant": "acme-research-and-development"} for n in range(3)]


@pytest.mark.parametrize("columns", [90, 100, 120])
def test_ids_are_whole_and_the_others_give_way(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    printed = table(ROWS)
    for row in ROWS:
        assert row["id"] in printed
        assert row["nodeId"] in printed
    lines = printed.splitlines()
    assert max(len(line) for line in lines) <= columns
    assert "…" in printed  # the hostname gave way
    assert lines[0].split()[:2] == ["ID", "NODEID"]


def test_ids_stay_whole_where_the_rest_cannot_fit(monkeypatch):
    monkeypatch.setenv("COLUMNS", "50")
    printed = table(ROWS)
    assert all(row["id"] in printed and row["nodeId"] in printed for row in ROWS)
    assert "acme-…" in printed  # each other column keeps a few characters


def test_a_column_of_ids_is_known_by_its_values(monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    rows = [{"holder": f"alloc_01m8xcbthq4ee{n}m2k7d9zpa", "what": "x" * 80} for n in range(2)]
    printed = table(rows)
    assert all(row["holder"] in printed for row in rows)


def test_a_table_that_fits_is_not_cut_and_wide_never_cuts(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert "…" not in table(ROWS)
    monkeypatch.setenv("COLUMNS", "40")
    assert all(row["hostname"] in table(ROWS, wide=True) for row in ROWS)

