"""`better-compute images`: a pool's sandbox images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from compute.cli.client import CliError
from compute.cli.common import api_command, output_options, show
from compute.cli.common import client as make_client
from compute.cli.guestimage import sha256_of

IMAGE_COLUMNS = ["id", "name", "poolId", "createdAt"]


@click.group()
def images() -> None:
    """Sandbox images: kernel, initrd and optional disk, each by URL and sha256."""


def image_part(source: str | None, digest: str | None, what: str) -> dict[str, str] | None:
    """A part by URL (with --WHAT-sha256) or a local file (hashed here, given as file://:
    for nodes that see the same path, such as simulated ones)."""
    if source is None:
        return None
    if "://" in source:
        if not digest:
            raise click.BadParameter(f"a URL needs --{what}-sha256", param_hint=f"--{what}")
        return {"url": source, "sha256": digest}
    path = Path(source).resolve()
    if not path.is_file():
        raise click.BadParameter(f"{source} is not a file", param_hint=f"--{what}")
    found = sha256_of(path)
    if digest and digest != found:
        raise click.BadParameter(f"{source} has sha256 {found}, not {digest}",
                                 param_hint=f"--{what}-sha256")
    return {"url": path.as_uri(), "sha256": found}


@images.command("create")
@click.option("--pool", "pool_id", required=True)
@click.option("--name", required=True, help="Unique in the pool; `default` is used when a "
              "sandbox names no image.")
@click.option("--kernel", required=True, help="A URL or a local file.")
@click.option("--kernel-sha256", default=None)
@click.option("--initrd", required=True, help="A URL or a local file.")
@click.option("--initrd-sha256", default=None)
@click.option("--disk", default=None, help="A raw disk image: URL or local file.")
@click.option("--disk-sha256", default=None)
@click.option("--ready-line", default=None,
              help="What the guest prints on its serial console once booted.")
@click.option("--snapshot", is_flag=True,
              help="Start sandboxes from a snapshot of a booted guest (needs qemu-ga).")
@output_options
def images_create(pool_id: str, name: str, kernel: str, kernel_sha256: str | None,
                  initrd: str, initrd_sha256: str | None, disk: str | None,
                  disk_sha256: str | None, ready_line: str | None, snapshot: bool,
                  output: str | None,
                  query: str | None, tenant: str | None) -> None:
    """Add an image to a pool's catalogue."""
    body = {"poolId": pool_id, "name": name,
            "kernel": image_part(kernel, kernel_sha256, "kernel"),
            "initrd": image_part(initrd, initrd_sha256, "initrd"),
            "disk": image_part(disk, disk_sha256, "disk"), "readyLine": ready_line,
            "snapshot": snapshot}
    show(make_client().call("images.create", body, tenant=tenant), output=output, query=query)


@api_command(images, "list", "images.list", columns=IMAGE_COLUMNS)
@click.option("--pool", "pool_id", required=True)
def images_list(pool_id: str) -> dict[str, Any]:
    """A pool's images."""
    return {"poolId": pool_id}


@api_command(images, "get", "images.get")
@click.argument("image_id")
def images_get(image_id: str) -> dict[str, Any]:
    """One image."""
    return {"imageId": image_id}


@api_command(images, "delete", "images.delete")
@click.argument("image_id")
def images_delete(image_id: str) -> dict[str, Any]:
    """Remove an image no live sandbox uses."""
    return {"imageId": image_id}


@images.command("deploy-ramdisk")
@click.option("--deploy-url", required=True, metavar="URL",
              help="Where the provisioner serves deploy instructions, as the machines reach "
                   "it: http://HOST:PORT/v1/deploy (bcd node --provisioner --deploy-listen).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              required=True)
def images_deploy_ramdisk(deploy_url: str, out_dir: Path) -> None:
    """Build the deploy ramdisk from this machine's Debian packages: deploy.iso (virtual
    media) and vmlinuz with initrd.gz (PXE). Serve them where the BMCs reach them, then
    `images create … --disk URL/deploy.iso` and name it in `nodes deploy --ramdisk`."""
    from compute.cli.deployimage import build_deploy_ramdisk

    try:
        built = build_deploy_ramdisk(out_dir, deploy_url)
    except FileNotFoundError as missing:
        raise CliError(str(missing)) from None
    for path in built.values():
        click.echo(f"{path.name}  {sha256_of(path)}  {path}")
