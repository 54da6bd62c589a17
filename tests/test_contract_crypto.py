"""The join's shared cryptography (no database)."""

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from bcd.contract.crypto import (
    BadJwe,
    BadSignature,
    jwe_open,
    jwe_seal,
    open_document,
    sign_document,
    spki_pin,
)


def test_jwe_round_trip_and_header():
    key = ec.generate_private_key(ec.SECP256R1())
    token = jwe_seal(b"bcjt_x.secret", key.public_key(), {"csr_sha256": "ab" * 32})
    header, plaintext = jwe_open(token, key)
    assert plaintext == b"bcjt_x.secret"
    assert header["csr_sha256"] == "ab" * 32
    assert token.count(".") == 4


def test_jwe_refuses_another_key_and_tampering():
    key = ec.generate_private_key(ec.SECP256R1())
    token = jwe_seal(b"secret", key.public_key(), {})
    with pytest.raises(BadJwe):
        jwe_open(token, ec.generate_private_key(ec.SECP256R1()))
    parts = token.split(".")
    parts[3] = parts[3][:-2] + ("AA" if not parts[3].endswith("AA") else "BB")
    with pytest.raises(BadJwe):
        jwe_open(".".join(parts), key)


def test_signed_document_checks_pin_and_signature():
    key = ec.generate_private_key(ec.SECP256R1())
    envelope = sign_document(key, {"nodeId": "node_x"})
    assert open_document(envelope, pin=spki_pin(key.public_key())) == {"nodeId": "node_x"}
    other = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(BadSignature):
        open_document(envelope, pin=spki_pin(other.public_key()))
    forged = sign_document(other, {"nodeId": "node_x"})
    forged["key"] = envelope["key"]
    with pytest.raises(BadSignature):
        open_document(forged, pin=spki_pin(key.public_key()))
