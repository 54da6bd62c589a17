"""Shared cryptography of the join: SPKI pins, signed JSON documents, and the JWE that
seals a join token to the control plane's join-encryption key (ECDH-ES + A256GCM,
RFC 7516/7518, compact form). Django-free: the agent and the control plane both use it."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from typing import Any

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

PublicKey = Any


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return bytes(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def spki_der(public_key: PublicKey) -> bytes:
    der: bytes = public_key.public_bytes(serialization.Encoding.DER,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)
    return der


def public_pem(public_key: PublicKey) -> str:
    pem: bytes = public_key.public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)
    return pem.decode()


def sign_bytes(key: ec.EllipticCurvePrivateKey, data: bytes) -> str:
    return b64url(key.sign(data, ec.ECDSA(hashes.SHA256())))


def verify_bytes(public_key_pem: str, data: bytes, signature: str) -> bool:
    """Does `signature` over `data` verify with this PEM public key?"""
    try:
        key = serialization.load_pem_public_key(public_key_pem.encode())
        if not isinstance(key, ec.EllipticCurvePublicKey):
            return False
        key.verify(unb64url(signature), data, ec.ECDSA(hashes.SHA256()))
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def spki_pin(public_key: PublicKey) -> str:
    """`sha256/<base64>` of the key's SubjectPublicKeyInfo (as in HPKP)."""
    return "sha256/" + base64.b64encode(hashlib.sha256(spki_der(public_key)).digest()).decode()


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def sign_document(key: ec.EllipticCurvePrivateKey, payload: dict[str, Any]) -> dict[str, str]:
    """A detached-signature envelope: the payload's canonical bytes, its ECDSA signature and
    the signer's public key (for the verifier to check against its pin)."""
    body = canonical(payload)
    return {"payload": b64url(body),
            "signature": b64url(key.sign(body, ec.ECDSA(hashes.SHA256()))),
            "key": b64url(spki_der(key.public_key()))}


class BadSignature(ValueError):
    pass


def open_document(envelope: dict[str, str], *, pin: str) -> dict[str, Any]:
    """Verify `envelope` was signed by the key whose SPKI pin is `pin`; return the payload."""
    try:
        key = serialization.load_der_public_key(unb64url(envelope["key"]))
        if not isinstance(key, ec.EllipticCurvePublicKey) or spki_pin(key) != pin:
            raise BadSignature("the response is signed by a key that does not match the pin")
        body = unb64url(envelope["payload"])
        key.verify(unb64url(envelope["signature"]), body, ec.ECDSA(hashes.SHA256()))
    except (KeyError, ValueError, InvalidSignature) as error:
        if isinstance(error, BadSignature):
            raise
        raise BadSignature(f"the response signature does not verify: {error}") from error
    payload = json.loads(body)
    if not isinstance(payload, dict):
        raise BadSignature("the signed payload is not an object")
    return payload


def public_jwk(key: ec.EllipticCurvePublicKey) -> dict[str, str]:
    numbers = key.public_numbers()
    return {"kty": "EC", "crv": "P-256", "x": b64url(numbers.x.to_bytes(32, "big")),
            "y": b64url(numbers.y.to_bytes(32, "big"))}


def jwk_public_key(jwk: dict[str, str]) -> ec.EllipticCurvePublicKey:
    if jwk.get("kty") != "EC" or jwk.get("crv") != "P-256":
        raise ValueError("only EC P-256 keys are supported")
    return ec.EllipticCurvePublicNumbers(int.from_bytes(unb64url(jwk["x"]), "big"),
                                         int.from_bytes(unb64url(jwk["y"]), "big"),
                                         ec.SECP256R1()).public_key()


def _concat_kdf(shared: bytes, enc: str) -> bytes:
    """RFC 7518 4.6.2 Concat KDF for 256-bit keys, empty apu/apv."""
    def field(data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + data

    other = field(enc.encode()) + field(b"") + field(b"") + (256).to_bytes(4, "big")
    return hashlib.sha256((1).to_bytes(4, "big") + shared + other).digest()


def jwe_seal(plaintext: bytes, recipient: ec.EllipticCurvePublicKey,
             extra_header: dict[str, str]) -> str:
    ephemeral = ec.generate_private_key(ec.SECP256R1())
    header = {"alg": "ECDH-ES", "enc": "A256GCM", "epk": public_jwk(ephemeral.public_key()),
              **extra_header}
    protected = b64url(canonical(header))
    key = _concat_kdf(ephemeral.exchange(ec.ECDH(), recipient), "A256GCM")
    iv = os.urandom(12)
    sealed = AESGCM(key).encrypt(iv, plaintext, protected.encode())
    return ".".join([protected, "", b64url(iv), b64url(sealed[:-16]), b64url(sealed[-16:])])


class BadJwe(ValueError):
    pass


def jwe_open(token: str, key: ec.EllipticCurvePrivateKey) -> tuple[dict[str, Any], bytes]:
    """Decrypt a compact JWE; returns (protected header, plaintext)."""
    try:
        protected, encrypted_key, iv, ciphertext, tag = token.split(".")
        header = json.loads(unb64url(protected))
        if header.get("alg") != "ECDH-ES" or header.get("enc") != "A256GCM" or encrypted_key:
            raise BadJwe("unsupported JWE algorithm")
        shared = key.exchange(ec.ECDH(), jwk_public_key(header["epk"]))
        plaintext = AESGCM(_concat_kdf(shared, "A256GCM")).decrypt(
            unb64url(iv), unb64url(ciphertext) + unb64url(tag), protected.encode())
    except (ValueError, KeyError, TypeError, InvalidTag) as error:
        raise BadJwe(str(error) or type(error).__name__) from error
    return header, plaintext
