"""Declared environment variables: typed reads, and errors that name the variable without
showing a secret's value."""

from __future__ import annotations

import pytest

from bcd.contract.variables import Declared, Variable, VariableError

ENVIRON: dict[str, str] = {}
DECLARED = Declared(Variable("X_SECONDS", "float", 2.0, "how often"),
                    Variable("X_PIN", "int", None, "a pin", secret=True),
                    Variable("X_ON", "bool", False, "on or off"), environ=ENVIRON)


@pytest.fixture(autouse=True)
def _empty_environment():
    ENVIRON.clear()


def test_values_are_typed_with_their_defaults():
    assert DECLARED.number("X_SECONDS") == 2.0
    assert DECLARED.flag("X_ON") is False
    ENVIRON.update(X_SECONDS="0.5", X_ON="yes")
    assert DECLARED.number("X_SECONDS") == 0.5
    assert DECLARED.flag("X_ON") is True


def test_a_bad_value_names_its_variable_and_hides_a_secret():
    ENVIRON["X_ON"] = "maybe"
    with pytest.raises(VariableError, match=r"X_ON='maybe' is not a boolean"):
        DECLARED.flag("X_ON")
    ENVIRON["X_PIN"] = "hunter2"
    with pytest.raises(VariableError) as refused:
        DECLARED.whole("X_PIN")
    assert "hunter2" not in str(refused.value)
    assert "X_PIN=(a secret, not shown)" in str(refused.value)
