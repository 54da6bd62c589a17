"""`pools offer --budget`: the text an operator types, as the budget the API takes."""

from __future__ import annotations

import click
import pytest

from compute.cli.resources import parse_budget


def test_a_budget_reads_as_hours_period_and_class():
    assert parse_budget("gpu-hours=1000/month") == {"gpuHours": 1000.0, "period": "month"}
    assert parse_budget("gpu-hours=12.5/day:high") == {"gpuHours": 12.5, "period": "day",
                                                       "priorityClass": "high"}


@pytest.mark.parametrize("text", ["gpu=10/day", "gpu-hours=ten/day", "gpu-hours=10/year",
                                  "gpu-hours=-1/week", "gpu-hours=10"])
def test_a_malformed_budget_names_what_is_expected(text):
    with pytest.raises(click.BadParameter, match="gpu-hours=N/day"):
        parse_budget(text)
