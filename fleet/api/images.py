"""API methods images.*: a pool's sandbox images."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from bcd.contract.vms import SHA256, URL
from compute.core.api.inputs import Input, ListInput, PublicIdField
from compute.core.api.registry import CallContext, Subject, endpoint
from compute.core.api.shapes import page_of
from compute.platform.paging import page
from fleet import presenters as wire
from fleet.events import FleetEvent
from fleet.presenters import present_image
from fleet.selectors import access_image_by_id, access_pool_by_id, image_list
from fleet.services.images import image_create, image_delete

IMAGE = Subject("image", access_image_by_id, "image_id")
OWNED_IMAGE = Subject("image", access_image_by_id, "image_id", options={"owned": True})


class ImagePartIn(Input):
    url = serializers.RegexField(URL.pattern, max_length=2000,
                                 help_text="http(s):// or file:// (a path on the node).")
    sha256 = serializers.RegexField(SHA256.pattern, help_text="64 lowercase hex digits.")


class ImageCreateIn(Input):
    pool_id = PublicIdField("pool")
    name = serializers.RegexField(r"^[a-z0-9][a-z0-9._-]{0,62}$", max_length=63)
    kernel = ImagePartIn()
    initrd = ImagePartIn()
    disk = ImagePartIn(required=False, help_text="A raw disk image; each sandbox gets a "
                                                 "copy-on-write overlay over it.")
    ready_line = serializers.CharField(
        required=False, default="better-compute guest ready", min_length=1, max_length=200,
        help_text="What the guest prints on its serial console once booted.")
    snapshot = serializers.BooleanField(
        required=False, default=False,
        help_text="Start sandboxes from a snapshot of a booted guest (made once per node and "
                  "size, then restored in about a second); the image must run QEMU's guest "
                  "agent.")


@endpoint("images", "create", returns=wire.IMAGE, input=ImageCreateIn, mutating=True,
          subject=Subject("pool", access_pool_by_id, "pool_id", options={"owned": True}),
          emits=(FleetEvent.IMAGE_CREATED,))
def images_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Add a bootable image (kernel, initrd, optional disk; each by URL and sha256) to a
    pool's catalogue."""
    return present_image(image_create(tenant=ctx.tenant, actor=ctx.principal, **data))


class ImageIdIn(Input):
    image_id = PublicIdField("img")


@endpoint("images", "get", returns=wire.IMAGE, input=ImageIdIn, mutating=False, subject=IMAGE)
def images_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """One image."""
    return present_image(ctx.subject)


class ImageListIn(ListInput):
    pool_id = PublicIdField("pool")


@endpoint("images", "list", returns=page_of(wire.IMAGE), input=ImageListIn, mutating=False,
          subject=Subject("pool", access_pool_by_id, "pool_id"))
def images_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """A pool's images."""
    data.pop("pool_id")
    return page(image_list(tenant=ctx.tenant, pool_id=ctx.subject.id), present=present_image,
                **data)


@endpoint("images", "delete", returns=wire.IMAGE,
          input=ImageIdIn, mutating=True, subject=OWNED_IMAGE,
          emits=(FleetEvent.IMAGE_DELETED,))
def images_delete(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Remove an image that no live sandbox uses."""
    return present_image(image_delete(tenant=ctx.tenant, actor=ctx.principal,
                                      image_id=ctx.subject.id))
