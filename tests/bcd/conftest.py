"""The agent's private root, as `bcd join` leaves it: a key, a config, the public key."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bcd.config import Config, Paths, write_private
from bcd.contract.crypto import public_pem


@pytest.fixture
def root(tmp_path: Path) -> Path:
    paths = Paths(tmp_path)
    key = ec.generate_private_key(ec.SECP256R1())
    write_private(paths.key_file, key.private_bytes(serialization.Encoding.PEM,
                                                    serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))
    Config(server="http://127.0.0.1:1/api/compute", gateway="127.0.0.1:1", node_id="node_x",
           site_id="site_x", trust_domain="t", serving_ca_pin="p", join_signing_pin="p",
           join_encryption_pin="p", root=str(tmp_path), sim=True).write(paths.config_file)
    (tmp_path / "public.pem").write_text(public_pem(key.public_key()))
    return tmp_path
