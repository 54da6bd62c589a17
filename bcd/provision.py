"""What a site's provisioner does for the control plane: speak Redfish to a machine's BMC.

Each `bmc.*` command names the machine's BMC and carries its credentials sealed to this
provisioner's key for that machine; they are opened here, used for the one command and never
written anywhere. Results say what the BMC answered: the system's identity, its power state,
or why it could not be reached or refused us (with its HTTP status).
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from bcd.contract.bmc import CREDENTIALS_USE, BadBmcAddress, parse_bmc
from bcd.contract.crypto import BadJwe, jwe_open
from bcd.deploys import Deploys

logger = logging.getLogger("bcd.provision")
Result = tuple[str, dict[str, Any]]
POWER_SETTLE_SECONDS = 60.0  # how long a power action may take to show in the BMC
FINISH_OFF_SECONDS = 120.0  # how long a ramdisk that wrote its image has to power off


class Refused(Exception):
    """A command this provisioner will not run (a bad address or sealed credentials)."""


@dataclass
class Site:
    """What the provisioner passes on to a deploy: where the ramdisks' instructions wait,
    and how a deployed OS's agent reaches the control plane (server and pins)."""

    deploys: Deploys
    join: dict[str, str]


def run_bmc(kind: str, payload: dict[str, Any], key: ec.EllipticCurvePrivateKey,
            site: Site | None = None) -> Result:
    """Run one `bmc.*` command; never raises for what the BMC does."""
    actions: dict[str, Callable[[Any, dict[str, Any]], dict[str, Any]]] = {
        "bmc.verify": _verify, "bmc.status": _verify, "bmc.inspect": _inspect,
        "bmc.power": _power, "bmc.boot": _boot, "bmc.undeploy": _undeploy}
    if kind not in (*actions, "bmc.deploy"):
        return "failed", {"error": f"unknown command {kind}"}
    if kind == "bmc.undeploy" and site is not None:
        site.deploys.withdraw(str(payload.get("target", "")))
    try:
        from sushy import exceptions as redfish
    except ImportError:
        return "failed", {"error": "this provisioner has no Redfish client (pip install sushy)"}
    try:
        address = parse_bmc(str(payload.get("address", "")))
        username, password = _credentials(payload, key)
        if kind == "bmc.deploy":
            _opened(payload, key, "joinToken", "joinToken")  # refused before touching the BMC
    except (Refused, BadBmcAddress) as refusal:
        return "failed", {"error": f"refused: {refusal}"}
    try:
        actions["bmc.deploy"] = partial(_deploy, key=key, site=site, finish=partial(
            _finish_deploy, payload, username, password))  # finished once its image is written
        with _system(payload, username, password) as system:
            return "succeeded", actions[kind](system, payload)
    except redfish.ConnectionError as error:
        return "failed", {"error": f"the BMC at {address} did not answer: {_first_line(error)}",
                          "unreachable": True}
    except redfish.HTTPError as error:
        status = int(getattr(error, "status_code", 0) or 0)
        what = ("refused the credentials" if status in (401, 403)
                else f"answered HTTP {status}")
        return "failed", {"error": f"the BMC at {address} {what}: {_first_line(error)}",
                          "httpStatus": status}
    except (redfish.SushyError, ValueError) as error:
        return "failed", {"error": f"the BMC at {address}: {_first_line(error)}"}


def _credentials(payload: dict[str, Any], key: ec.EllipticCurvePrivateKey) -> tuple[str, str]:
    secret = json.loads(_opened(payload, key, "credentials", CREDENTIALS_USE))
    return str(secret["username"]), str(secret["password"])


def _opened(payload: dict[str, Any], key: ec.EllipticCurvePrivateKey, name: str,
            use: str) -> bytes:
    """A secret of the payload sealed to this provisioner for this command's machine."""
    try:
        header, plaintext = jwe_open(str(payload.get(name, "")), key)
    except BadJwe as error:
        raise Refused(f"the {name} is not sealed to this provisioner: {error}") from None
    if header.get("use") != use or header.get("node") != payload.get("target"):
        raise Refused(f"the {name} was sealed for another machine")
    return plaintext


@contextmanager
def _system(payload: dict[str, Any], username: str, password: str) -> Iterator[Any]:
    """The BMC's system the payload names, over a session with these credentials."""
    import sushy

    address = parse_bmc(str(payload.get("address", "")))
    with _verify_setting(payload.get("verify") or {}) as verify:
        # A busy BMC answers 5xx for a moment: three tries, 2 s apart (sushy's default of ten
        # 3 s apart holds a power action half a minute on a BMC that is gone).
        client = sushy.Sushy(address.service_root, username=username, password=password,
                             verify=verify, server_side_retries=3, server_side_retries_delay=2,
                             connect_timeout=10)
        yield client.get_system(address.system_path)


@contextmanager
def _verify_setting(verify: dict[str, Any]) -> Iterator[bool | str]:
    """requests' `verify`: the system's CAs, none (insecure), or a CA bundle file."""
    if verify.get("insecure"):
        yield False
    elif verify.get("caPem"):
        with tempfile.NamedTemporaryFile("w", suffix=".pem") as bundle:
            bundle.write(str(verify["caPem"]))
            bundle.flush()
            yield bundle.name
    else:
        yield True


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def _state(value: Any) -> str:
    """A sushy enum's Redfish value ('On'), or '' when the BMC did not say."""
    return str(getattr(value, "value", value) or "")


def _verify(system: Any, payload: dict[str, Any]) -> dict[str, Any]:
    return {"powerState": _state(system.power_state), "manufacturer": system.manufacturer or "",
            "model": system.model or "", "systemId": system.identity}


def _inspect(system: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """The system's identity and size, from whichever parts its BMC has."""
    from sushy import exceptions as redfish

    def part(read: Callable[[], Any], default: Any) -> Any:
        try:
            return read()
        except redfish.SushyError:  # a BMC without this resource
            return default

    memory = part(lambda: system.memory_summary, None)
    return {
        **_verify(system, payload),
        "serial": system.serial_number or "", "productUuid": (system.uuid or "").lower(),
        "hostname": system.hostname or "", "name": system.name or "",
        "cpus": part(lambda: system.processors.summary.count, None) or 0,
        "memoryGib": int(getattr(memory, "size_gib", 0) or 0),
        "macs": sorted({(nic.mac_address or "").lower() for nic in part(
            lambda: system.ethernet_interfaces.get_members(), []) if nic.mac_address}),
    }


def _power(system: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Power on, off (forced) or cycle, then wait until the BMC shows the result."""
    import sushy

    state = str(payload.get("state", ""))
    allowed = system.get_allowed_reset_system_values()
    if state == "on":
        reset, want = sushy.RESET_ON, sushy.POWER_STATE_ON
    elif state == "off":
        reset, want = sushy.RESET_FORCE_OFF, sushy.POWER_STATE_OFF
    elif state == "cycle":
        reset = (sushy.ResetType.POWER_CYCLE if sushy.ResetType.POWER_CYCLE in allowed
                 else sushy.RESET_FORCE_RESTART)
        want = sushy.POWER_STATE_ON
    else:
        raise ValueError(f"unknown power state {state!r}")
    if state != "cycle" and system.power_state == want:
        return {"powerState": _state(want), "changed": False}
    system.reset_system(reset)
    deadline = time.monotonic() + float(payload.get("settleSeconds", POWER_SETTLE_SECONDS))
    while True:
        system.refresh()
        if system.power_state == want:
            return {"powerState": _state(want), "changed": True, "reset": _state(reset)}
        if time.monotonic() > deadline:
            raise ValueError(f"the system is still {_state(system.power_state)} after "
                             f"{_state(reset)}")
        time.sleep(1.0)


def _cd_drives(system: Any) -> list[Any]:
    """The BMC's virtual CD/DVD drives: the system's own (newer Redfish) or its managers'."""
    from sushy import VIRTUAL_MEDIA_CD, VIRTUAL_MEDIA_DVD
    from sushy import exceptions as redfish

    try:
        drives = list(system.virtual_media.get_members())
    except (redfish.MissingAttributeError, redfish.SushyError):
        drives = [drive for manager in system.managers
                  for drive in manager.virtual_media.get_members()]
    return [drive for drive in drives
            if {VIRTUAL_MEDIA_CD, VIRTUAL_MEDIA_DVD} & set(drive.media_types or [])]


def _deploy(system: Any, payload: dict[str, Any], key: ec.EllipticCurvePrivateKey,
            site: Site | None, *, finish: Callable[[], None]) -> dict[str, Any]:
    """Boot the machine into the deploy ramdisk: its instructions left for it first, then
    the ISO in the virtual CD (or PXE), the next boot set to it once, and power on (a
    machine already on is reset)."""
    if site is None:
        raise ValueError("this provisioner serves no deploy instructions: start it with "
                         "--deploy-listen HOST:PORT on the management network")
    token = _opened(payload, key, "joinToken", "joinToken").decode()
    target = str(payload["target"])
    site.deploys.offer(target, {
        "target": target, "serial": str(payload.get("serial", "")),
        "productUuid": str(payload.get("productUuid", "")), "image": payload["image"],
        "join": {**site.join, "token": token}},
        expires_at=time.time() + float(payload.get("timeoutSeconds", 1800)), finish=finish)
    media: dict[str, Any] = {}
    if payload.get("boot") == "cd":
        drives = _cd_drives(system)
        if not drives:
            raise ValueError("the BMC offers no virtual CD to insert the deploy ramdisk")
        drive = drives[0]
        if drive.inserted:
            drive.eject_media()
        drive.insert_media(str(payload["media"]["url"]), inserted=True, write_protected=True)
        drive.refresh()
        media = {"mediaImage": drive.image or "", "mediaInserted": bool(drive.inserted)}
    booted = _boot(system, {"device": payload.get("boot", "cd")})
    powered = _power(system, {"state": "cycle" if system.power_state == _on() else "on"})
    return {**media, **booted, "powerState": powered["powerState"]}


def _finish_deploy(payload: dict[str, Any], username: str, password: str) -> None:
    """The ramdisk wrote the image and is powering the machine off: once it is off, boot
    from the disk next, eject the media and power on (a machine that does not go off in
    time is forced off). What goes wrong is logged; the deploy's deadline catches it."""
    from sushy import exceptions as redfish

    target = payload.get("target")
    try:
        with _system(payload, username, password) as system:
            deadline = time.monotonic() + FINISH_OFF_SECONDS
            while system.power_state != _off() and time.monotonic() < deadline:
                time.sleep(1.0)
                system.refresh()
            _undeploy(system, payload)  # off (forced if need be), media out, disk next
            _power(system, {"state": "on"})
        logger.info("%s: booting its written disk", target)
    except (redfish.SushyError, ValueError) as error:
        logger.error("%s: could not finish the deploy: %s", target, _first_line(error))


def _undeploy(system: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Eject the deploy media, boot from disk next and power the machine off."""
    for drive in _cd_drives(system):
        if drive.inserted:
            drive.eject_media()
    return {**_boot(system, {"device": "hdd"}), **_power(system, {"state": "off"})}


def _on() -> Any:
    import sushy
    return sushy.POWER_STATE_ON


def _off() -> Any:
    import sushy
    return sushy.POWER_STATE_OFF


def _boot(system: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Set the next boot (once) to a device: cd (virtual media), pxe or hdd."""
    import sushy

    targets = {"cd": sushy.BOOT_SOURCE_TARGET_CD, "pxe": sushy.BOOT_SOURCE_TARGET_PXE,
               "hdd": sushy.BOOT_SOURCE_TARGET_HDD}
    device = str(payload.get("device", ""))
    if device not in targets:
        raise ValueError(f"unknown boot device {device!r}")
    system.set_system_boot_options(targets[device], enabled=sushy.BOOT_SOURCE_ENABLED_ONCE)
    system.refresh()
    return {"bootTarget": _state(system.boot.target), "bootEnabled": _state(system.boot.enabled)}
