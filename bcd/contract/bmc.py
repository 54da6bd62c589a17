"""A bare-metal machine's BMC address, as operators write it and as the provisioner uses it.

`redfish+https://HOST[:PORT]/redfish/v1/Systems/ID` names one system of one Redfish service.
Both the control plane (enrolment) and the provisioner (the Redfish client) read it here.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

SCHEMES = {"redfish+https": "https", "redfish+http": "http"}
SYSTEMS = "/redfish/v1/Systems/"
CREDENTIALS_USE = "bmc-credentials"  # the JWE header naming what a sealed secret is for


class BadBmcAddress(ValueError):
    pass


@dataclass(frozen=True)
class BmcAddress:
    scheme: str  # https or http
    host: str
    port: int | None
    system_path: str  # /redfish/v1/Systems/ID

    @property
    def service_root(self) -> str:
        """The Redfish service root the client connects to."""
        netloc = f"[{self.host}]" if ":" in self.host else self.host
        if self.port is not None:
            netloc = f"{netloc}:{self.port}"
        return f"{self.scheme}://{netloc}/redfish/v1"

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def __str__(self) -> str:
        return f"redfish+{self.service_root.removesuffix('/redfish/v1')}{self.system_path}"


def parse_bmc(text: str) -> BmcAddress:
    """The address in `text`, or BadBmcAddress saying what is wrong with it."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError as error:
        raise BadBmcAddress(f"not a URL: {error}") from None
    if parts.scheme not in SCHEMES:
        raise BadBmcAddress(f"the scheme must be redfish+https (or redfish+http on loopback), "
                            f"not {parts.scheme or 'none'}")
    if not parts.hostname:
        raise BadBmcAddress("no host")
    if parts.username or parts.password:
        raise BadBmcAddress("credentials do not belong in the address: use a credentials file")
    if parts.query or parts.fragment:
        raise BadBmcAddress("no query or fragment is allowed")
    system = parts.path.rstrip("/")
    identity = system.removeprefix(SYSTEMS)
    if not system.startswith(SYSTEMS) or not identity or "/" in identity:
        raise BadBmcAddress(f"the path must be {SYSTEMS}<system id>, not {parts.path or '/'}")
    return BmcAddress(SCHEMES[parts.scheme], parts.hostname, port, system)


def same_uuid(a: str, b: str) -> bool:
    """Product UUIDs as DMI and Redfish spell them (case and dashes aside)."""
    return bool(a) and a.replace("-", "").lower() == b.replace("-", "").lower()
