"""API method pki.show."""

from __future__ import annotations

from typing import Any

from compute.api.inputs import Input
from compute.api.registry import CallContext, endpoint
from fleet.pki import pki


class PkiShowIn(Input):
    pass


@endpoint("pki", "show", input=PkiShowIn, mutating=False)
def pki_show(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """The SPKI pins of the serving CA, the join-signing and the join-encryption keys."""
    authority = pki()
    return {"trustDomain": authority.trust_domain, **authority.pins()}
