"""`nodes enroll`, `verify`, `inspect`, `power`, `deploy`, `undeploy`, `abort`: machines
driven by their BMC."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from compute.cli.common import client, fail, output_options, read_json_file, show
from compute.cli.durations import Duration
from compute.cli.ledger import nodes

NODE_COLUMNS = ["id", "hostname", "provisionState", "provisionError", "bmc.reachable",
                "bmc.powerState"]
STEPS_RUNNING = ("enrolled", "verifying", "manageable", "inspecting", "deploying", "deployed",
                 "undeploying")
WAIT_SECONDS = 600


def _credentials(path: str) -> dict[str, str]:
    """The BMC credentials file: a JSON object with username and password (never an
    argument, so the password stays out of shell history and the process list)."""
    data = read_json_file(path)
    if not isinstance(data, dict) or not all(
            isinstance(data.get(k), str) and data.get(k) for k in ("username", "password")):
        raise click.BadParameter(f"{path} must be a JSON object with username and password",
                                 param_hint="--bmc-credentials-file")
    return {"username": data["username"], "password": data["password"]}


def _wait(node: dict[str, Any], tenant: str | None, seconds: float = WAIT_SECONDS
          ) -> dict[str, Any]:
    """Follow the provision steps until the machine rests; each state change on stderr."""
    seen, deadline = node["provisionState"], time.monotonic() + seconds
    click.echo(f"{node['id']}: {seen}", err=True)
    while node["provisionState"] in STEPS_RUNNING and time.monotonic() < deadline:
        time.sleep(1.0)
        node = client().call("nodes.get", {"nodeId": node["id"]}, tenant=tenant)
        if node["provisionState"] != seen:
            seen = node["provisionState"]
            click.echo(f"{node['id']}: {seen}", err=True)
        if node["provisionState"] == "enrolled" and node.get("provisionError"):
            break  # waiting for a provisioner that is not there
    return node


def _finish(node: dict[str, Any], *, wait: bool, tenant: str | None, output: str | None,
            query: str | None, seconds: float = WAIT_SECONDS) -> None:
    if wait:
        node = _wait(node, tenant, seconds)
    show(node, output=output, query=query, columns=NODE_COLUMNS)
    if wait and (node["provisionState"].endswith("-failed") or
                 node["provisionState"] in STEPS_RUNNING):
        fail(f"{node['id']} is {node['provisionState']}: {node.get('provisionError') or ''}")


@nodes.command("enroll")
@click.option("--pool", "pool_id", required=True)
@click.option("--bmc", required=True, metavar="URL",
              help="redfish+https://HOST[:PORT]/redfish/v1/Systems/ID")
@click.option("--bmc-credentials-file", "credentials_file", required=True,
              type=click.Path(exists=True, dir_okay=False),
              help='A JSON file: {"username": …, "password": …}.')
@click.option("--verify-ca", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A PEM bundle the BMC's certificate must chain to.")
@click.option("--insecure", is_flag=True, help="Do not check the BMC's certificate.")
@click.option("--hostname", default=None)
@click.option("--wait", is_flag=True, help="Follow verification and inspection to the end.")
@output_options
def nodes_enroll(pool_id: str, bmc: str, credentials_file: str, verify_ca: str | None,
                 insecure: bool, hostname: str | None, wait: bool, output: str | None,
                 query: str | None, tenant: str | None) -> None:
    """Enroll a machine by its BMC; the site's provisioner verifies and inspects it."""
    body: dict[str, Any] = {"poolId": pool_id, "bmc": bmc,
                            "credentials": _credentials(credentials_file),
                            "insecure": insecure, "hostname": hostname}
    if verify_ca:
        body["verifyCa"] = Path(verify_ca).read_text()
    node = client().call("nodes.enroll", body, tenant=tenant)
    _finish(node, wait=wait, tenant=tenant, output=output, query=query)


def _step_command(name: str, method: str, doc: str) -> None:
    @nodes.command(name, help=doc)
    @click.argument("node_id")
    @click.option("--wait", is_flag=True, help="Follow the step to the end.")
    @output_options
    def command(node_id: str, wait: bool, output: str | None, query: str | None,
                tenant: str | None) -> None:
        node = client().call(method, {"nodeId": node_id}, tenant=tenant)
        _finish(node, wait=wait, tenant=tenant, output=output, query=query)


_step_command("verify", "nodes.verify",
              "Check again that an enrolled machine's BMC answers (after verify-failed).")
_step_command("inspect", "nodes.inspect",
              "Read a machine's identity and size from its BMC again.")


@nodes.command("power")
@click.argument("node_id")
@click.argument("state", type=click.Choice(["on", "off", "cycle"]))
@click.option("--reason", default=None)
@click.option("--wait", is_flag=True, help="Wait until the BMC shows the new power state.")
@output_options
def nodes_power(node_id: str, state: str, reason: str | None, wait: bool,
                output: str | None, query: str | None, tenant: str | None) -> None:
    """Power a machine on, off or cycle it through its BMC."""
    api = client()
    since = _last_event(api, node_id, tenant)
    node = api.call("nodes.power", {"nodeId": node_id, "state": state, "reason": reason},
                    tenant=tenant)
    deadline = time.monotonic() + WAIT_SECONDS
    while wait and time.monotonic() < deadline:
        events = api.call("nodes.events", {"nodeId": node_id, "since": since}, tenant=tenant)
        power = [e for e in events["items"] if e["type"] == "node.power"]
        if power:
            node = api.call("nodes.get", {"nodeId": node_id}, tenant=tenant)
            if power[-1]["payload"].get("error"):
                fail(f"{node_id}: power {state} failed: {power[-1]['payload']['error']}")
            break
        time.sleep(1.0)
    show(node, output=output, query=query, columns=NODE_COLUMNS)


def _last_event(api: Any, node_id: str, tenant: str | None) -> int:
    since = 0
    while True:
        page = api.call("nodes.events", {"nodeId": node_id, "since": since, "limit": 1000},
                        tenant=tenant)["items"]
        if not page:
            return since
        since = page[-1]["seq"]


@nodes.command("deploy")
@click.argument("node_id")
@click.option("--image", required=True, help="The image (name or id) whose disk is written.")
@click.option("--ramdisk", default=None,
              help="The deploy ramdisk image (default: the pool's bmc.deployRamdisk).")
@click.option("--timeout", type=Duration(minimum="1m", maximum="24h"), default="30m",
              show_default=True, help="How long the OS has to be written and join.")
@click.option("--wait", is_flag=True, help="Follow the deploy until the node is adopted.")
@output_options
def nodes_deploy(node_id: str, image: str, ramdisk: str | None, timeout: int, wait: bool,
                 output: str | None, query: str | None, tenant: str | None) -> None:
    """Deploy an image to an available machine: it boots the deploy ramdisk, which writes
    the image; the OS's agent joins as this node and is adopted after acceptance."""
    node = client().call("nodes.deploy", {"nodeId": node_id, "image": image,
                                          "ramdisk": ramdisk or "", "timeout": timeout},
                         tenant=tenant)
    _finish(node, wait=wait, tenant=tenant, output=output, query=query,
            seconds=timeout / 1000 + 60)


@nodes.command("undeploy")
@click.argument("node_id")
@click.option("--reason", required=True)
@click.option("--wait", is_flag=True, help="Follow until the machine is available again.")
@output_options
def nodes_undeploy(node_id: str, reason: str, wait: bool, output: str | None,
                   query: str | None, tenant: str | None) -> None:
    """Take a deployed machine back: media ejected, powered off, available again."""
    node = client().call("nodes.undeploy", {"nodeId": node_id, "reason": reason},
                         tenant=tenant)
    _finish(node, wait=wait, tenant=tenant, output=output, query=query)


@nodes.command("abort")
@click.argument("node_id")
@click.option("--reason", required=True)
@output_options
def nodes_abort(node_id: str, reason: str, output: str | None, query: str | None,
                tenant: str | None) -> None:
    """Stop a machine's provision step, or clear its failure: back to where it was."""
    node = client().call("nodes.abort", {"nodeId": node_id, "reason": reason}, tenant=tenant)
    show(node, output=output, query=query, columns=NODE_COLUMNS)
