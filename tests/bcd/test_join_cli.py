"""`bcd join`'s own refusals, before it reads a token or reaches a server."""

from __future__ import annotations

import pytest

from bcd.__main__ import main

PINS = ["--serving-ca-pin", "sha256/AAAA", "--join-signing-pin", "sha256/AAAA",
        "--join-encryption-pin", "sha256/AAAA"]


@pytest.mark.parametrize("option", [["--provisioner"], ["--deploy-listen", "127.0.0.1:9"]])
def test_agent_options_without_run_are_refused_and_nothing_is_written(tmp_path, capsys,
                                                                      monkeypatch, option):
    monkeypatch.setenv("BCD_JOIN_TOKEN", "bcjt_never-read")
    code = main(["--root", str(tmp_path), "join", "--server", "http://127.0.0.1:9/api",
                 *PINS, "--sim", *option])
    assert code == 2
    assert "add --run" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no key, no config
