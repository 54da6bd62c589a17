"""API method pki.show."""

from __future__ import annotations

from typing import Any

from compute.core.api.inputs import Input
from compute.core.api.registry import CallContext, endpoint
from compute.core.api.shapes import STRING, obj
from fleet.pki import pki


class PkiShowIn(Input):
    pass


PINS = obj(trustDomain=STRING, servingCaSpkiPin=STRING, joinSigningKeyPin=STRING,
           joinEncryptionKeyPin=STRING)


@endpoint("pki", "show", returns=PINS, input=PkiShowIn, mutating=False)
def pki_show(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """The SPKI pins of the serving CA, the join-signing and the join-encryption keys."""
    authority = pki()
    return {"trustDomain": authority.trust_domain, **authority.pins()}
