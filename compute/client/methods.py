"""The typed client's methods, one per API method. Written by
`python -m compute.http.clientgen` from the OpenAPI document; do not edit."""

from __future__ import annotations

import builtins
from typing import Any

from compute.client.base import Group


class Audit(Group):
    """audit.* methods."""

    def checkpoint(self, *, tenant_id: str | None = None) -> Any:
        """Sign a checkpoint over the tenant's new audit events now (also done hourly)."""
        return self._call("audit.checkpoint", {"tenantId": tenant_id}, retry=False)

    def checkpoints(self, *, limit: int | None = None, tenant_id: str | None = None) -> Any:
        """The tenant's signed checkpoints, newest first: how many events each covers and the
        Merkle root it signs.
        """
        return self._call("audit.checkpoints", {"limit": limit, "tenantId": tenant_id}, retry=True)

    def list(self, *, limit: int | None = None, after: str | None = None, action: str | None = None,
            allowed: bool | None = None, target: str | None = None, since: int | None = None,
            before: int | None = None, tenant_id: str | None = None) -> Any:
        """The tenant's audit rows, oldest first: who did (or was refused) what, and why."""
        return self._call("audit.list", {"limit": limit, "after": after, "action": action,
            "allowed": allowed, "target": target, "since": since, "before": before,
            "tenantId": tenant_id}, retry=True)

    def prove(self, *, event_id: str, tenant_id: str | None = None) -> Any:
        """An inclusion proof of one audit event against the latest checkpoint."""
        return self._call("audit.prove", {"eventId": event_id, "tenantId": tenant_id}, retry=True)

    def verify(self, *, from_position: int | None = None, to_position: int | None = None,
            tenant_id: str | None = None) -> Any:
        """Recompute the tenant's audit log and checkpoints; name the first bad position."""
        return self._call("audit.verify", {"fromPosition": from_position, "toPosition": to_position,
            "tenantId": tenant_id}, retry=True)


class Capacity(Group):
    """capacity.* methods."""

    def earliest(self, *, pool_id: str, devices: builtins.list[dict[str, Any]], duration: int,
            product: str | None = None, selector: str | None = None, model: str | None = None,
            kubernetes: bool | None = None, slurm: str | None = None, after: str | None = None,
            after_in: int | None = None, before: str | None = None, before_in: int | None = None,
            nodes: int | None = None, tenant_id: str | None = None) -> Any:
        """The earliest window in which this request fits on one node (after a time, ending
        before another), on which node and devices; or why none. Books nothing.
        """
        return self._call("capacity.earliest", {"poolId": pool_id, "devices": devices,
            "duration": duration, "product": product, "selector": selector, "model": model,
            "kubernetes": kubernetes, "slurm": slurm, "after": after, "afterIn": after_in,
            "before": before, "beforeIn": before_in, "nodes": nodes,
            "tenantId": tenant_id}, retry=True)

    def get(self, *, pool_id: str, tenant_id: str | None = None) -> Any:
        """A pool's capacity per resource: total, allocatable, allocated, reserved, available."""
        return self._call("capacity.get", {"poolId": pool_id, "tenantId": tenant_id}, retry=True)

    def preview(self, *, pool_id: str, devices: builtins.list[dict[str, Any]], duration: int,
            product: str | None = None, selector: str | None = None, model: str | None = None,
            kubernetes: bool | None = None, slurm: str | None = None, start: str | None = None,
            start_in: int | None = None, nodes: int | None = None,
            tenant_id: str | None = None) -> Any:
        """Would this request fit (now, or from a start), where, with which host share? If not,
        why. Books nothing.
        """
        return self._call("capacity.preview", {"poolId": pool_id, "devices": devices,
            "duration": duration, "product": product, "selector": selector, "model": model,
            "kubernetes": kubernetes, "slurm": slurm, "start": start, "startIn": start_in,
            "nodes": nodes, "tenantId": tenant_id}, retry=True)

    def shares(self, *, pool_id: str, tenant_id: str | None = None) -> Any:
        """Each tenant's share of the pool, its decayed usage and its fair-share factor: every
        tenant for the pool's owner, the caller's own row for a tenant it is offered to.
        """
        return self._call("capacity.shares", {"poolId": pool_id, "tenantId": tenant_id}, retry=True)

    def timeline(self, *, pool_id: str, from_: str | None = None, to: str | None = None,
            resolution: int | None = None, tenant_id: str | None = None) -> Any:
        """The pool's ledger over a window, as its calendar draws it: a row per device, each
        booking as a bar (another tenant's only as `busy`, unless the pool is yours), what
        waits at its planned or earliest start, and per step the GPU-hours there are,
        bookable and booked, with the utilisation the agents measured on booked GPUs.
        """
        return self._call("capacity.timeline", {"poolId": pool_id, "from": from_, "to": to,
            "resolution": resolution, "tenantId": tenant_id}, retry=True)


class Events(Group):
    """events.* methods."""

    def list(self, *, types: str | None = None, since: int | None = None,
            subject: str | None = None, limit: int | None = None,
            tenant_id: str | None = None) -> Any:
        """Events of the tenant after `since`, oldest first."""
        return self._call("events.list", {"types": types, "since": since, "subject": subject,
            "limit": limit, "tenantId": tenant_id}, retry=True)


class Images(Group):
    """images.* methods."""

    def create(self, *, pool_id: str, name: str, kernel: dict[str, Any], initrd: dict[str, Any],
            disk: dict[str, Any] | None = None, ready_line: str | None = None,
            snapshot: bool | None = None, tenant_id: str | None = None) -> Any:
        """Add a bootable image (kernel, initrd, optional disk; each by URL and sha256) to a
        pool's catalogue.
        """
        return self._call("images.create", {"poolId": pool_id, "name": name, "kernel": kernel,
            "initrd": initrd, "disk": disk, "readyLine": ready_line, "snapshot": snapshot,
            "tenantId": tenant_id}, retry=False)

    def delete(self, *, image_id: str, tenant_id: str | None = None) -> Any:
        """Remove an image that no live sandbox uses."""
        return self._call("images.delete", {"imageId": image_id,
            "tenantId": tenant_id}, retry=False)

    def get(self, *, image_id: str, tenant_id: str | None = None) -> Any:
        """One image."""
        return self._call("images.get", {"imageId": image_id, "tenantId": tenant_id}, retry=True)

    def list(self, *, pool_id: str, limit: int | None = None, after: str | None = None,
            tenant_id: str | None = None) -> Any:
        """A pool's images."""
        return self._call("images.list", {"poolId": pool_id, "limit": limit, "after": after,
            "tenantId": tenant_id}, retry=True)


class JoinTokens(Group):
    """joinTokens.* methods."""

    def create(self, *, pool_id: str, ttl: int, max_uses: int | None = None,
            expect_serial: str | None = None, expect_product_uuid: str | None = None,
            expect_mac: str | None = None, role: str | None = None,
            idempotency_key: str | None = None, tenant_id: str | None = None) -> Any:
        """Mint a join token `bcjt_<id>.<secret>`, shown once (bind it with expect*)."""
        return self._call("joinTokens.create", {"poolId": pool_id, "ttl": ttl, "maxUses": max_uses,
            "expectSerial": expect_serial, "expectProductUuid": expect_product_uuid,
            "expectMac": expect_mac, "role": role, "idempotencyKey": idempotency_key,
            "tenantId": tenant_id}, retry=idempotency_key is not None)

    def list(self, *, limit: int | None = None, after: str | None = None,
            tenant_id: str | None = None) -> Any:
        """Join tokens of the tenant's pools (never their secrets)."""
        return self._call("joinTokens.list", {"limit": limit, "after": after,
            "tenantId": tenant_id}, retry=True)

    def revoke(self, *, join_token_id: str, tenant_id: str | None = None) -> Any:
        """Revoke a join token: no machine can join with it from now on."""
        return self._call("joinTokens.revoke", {"joinTokenId": join_token_id,
            "tenantId": tenant_id}, retry=False)


class Maintenance(Group):
    """maintenance.* methods."""

    def cancel(self, *, window_id: str, reason: str | None = None,
            tenant_id: str | None = None) -> Any:
        """End a window now (or drop it before it starts)."""
        return self._call("maintenance.cancel", {"windowId": window_id, "reason": reason,
            "tenantId": tenant_id}, retry=False)

    def create(self, *, node_id: str, duration: int, reason: str, start: str | None = None,
            start_in: int | None = None, move: bool | None = None,
            tenant_id: str | None = None) -> Any:
        """Take a node out of service for a window: refused naming the bookings it overlaps,
        unless `move` places those that have not started elsewhere.
        """
        return self._call("maintenance.create", {"nodeId": node_id, "duration": duration,
            "reason": reason, "start": start, "startIn": start_in, "move": move,
            "tenantId": tenant_id}, retry=False)

    def list(self, *, limit: int | None = None, after: str | None = None,
            node_id: str | None = None, tenant_id: str | None = None) -> Any:
        """Maintenance windows of your nodes (cancelled ones too)."""
        return self._call("maintenance.list", {"limit": limit, "after": after, "nodeId": node_id,
            "tenantId": tenant_id}, retry=True)


class Nodes(Group):
    """nodes.* methods."""

    def abort(self, *, node_id: str, reason: str, tenant_id: str | None = None) -> Any:
        """Stop a machine's provision step, or clear its failure: back to where it was."""
        return self._call("nodes.abort", {"nodeId": node_id, "reason": reason,
            "tenantId": tenant_id}, retry=False)

    def adopt(self, *, node_id: str, reason: str, tenant_id: str | None = None) -> Any:
        """Start a new acceptance attempt for a node whose acceptance failed."""
        return self._call("nodes.adopt", {"nodeId": node_id, "reason": reason,
            "tenantId": tenant_id}, retry=False)

    def cordon(self, *, node_id: str, reason: str | None = None,
            tenant_id: str | None = None) -> Any:
        """Stop placing on a node; what it holds stays."""
        return self._call("nodes.cordon", {"nodeId": node_id, "reason": reason,
            "tenantId": tenant_id}, retry=False)

    def deploy(self, *, node_id: str, image: str, ramdisk: str | None = None,
            timeout: int | None = None, tenant_id: str | None = None) -> Any:
        """Write an image to a machine through the deploy ramdisk; it is adopted when the OS's
        agent joins and passes acceptance.
        """
        return self._call("nodes.deploy", {"nodeId": node_id, "image": image, "ramdisk": ramdisk,
            "timeout": timeout, "tenantId": tenant_id}, retry=False)

    def enroll(self, *, pool_id: str, bmc: str, credentials: dict[str, Any],
            verify_ca: str | None = None, insecure: bool | None = None, hostname: str | None = None,
            tenant_id: str | None = None) -> Any:
        """Enroll a machine by its BMC; the site's provisioner verifies, then inspects it."""
        return self._call("nodes.enroll", {"poolId": pool_id, "bmc": bmc,
            "credentials": credentials, "verifyCa": verify_ca, "insecure": insecure,
            "hostname": hostname, "tenantId": tenant_id}, retry=False)

    def events(self, *, node_id: str, since: int | None = None, limit: int | None = None,
            tenant_id: str | None = None) -> Any:
        """Events about one node, oldest first."""
        return self._call("nodes.events", {"nodeId": node_id, "since": since, "limit": limit,
            "tenantId": tenant_id}, retry=True)

    def get(self, *, node_id: str, tenant_id: str | None = None) -> Any:
        """One node with its conditions and devices."""
        return self._call("nodes.get", {"nodeId": node_id, "tenantId": tenant_id}, retry=True)

    def inspect(self, *, node_id: str, tenant_id: str | None = None) -> Any:
        """Read a machine's identity and size from its BMC again."""
        return self._call("nodes.inspect", {"nodeId": node_id, "tenantId": tenant_id}, retry=False)

    def list(self, *, limit: int | None = None, after: str | None = None,
            pool_id: str | None = None, tenant_id: str | None = None) -> Any:
        """Nodes of the tenant's pools."""
        return self._call("nodes.list", {"limit": limit, "after": after, "poolId": pool_id,
            "tenantId": tenant_id}, retry=True)

    def power(self, *, node_id: str, state: str, reason: str | None = None,
            tenant_id: str | None = None) -> Any:
        """Power a machine on, off or cycle it through its BMC (answered once queued)."""
        return self._call("nodes.power", {"nodeId": node_id, "state": state, "reason": reason,
            "tenantId": tenant_id}, retry=False)

    def retire(self, *, node_id: str, reason: str, tenant_id: str | None = None) -> Any:
        """Take a node out of the fleet for good (refused while anything holds it)."""
        return self._call("nodes.retire", {"nodeId": node_id, "reason": reason,
            "tenantId": tenant_id}, retry=False)

    def uncordon(self, *, node_id: str, reason: str | None = None,
            tenant_id: str | None = None) -> Any:
        """Let the placer use a node again."""
        return self._call("nodes.uncordon", {"nodeId": node_id, "reason": reason,
            "tenantId": tenant_id}, retry=False)

    def undeploy(self, *, node_id: str, reason: str, tenant_id: str | None = None) -> Any:
        """Eject the media and power a deployed machine off: available again (refused while it
        holds reservations or sandboxes).
        """
        return self._call("nodes.undeploy", {"nodeId": node_id, "reason": reason,
            "tenantId": tenant_id}, retry=False)

    def verify(self, *, node_id: str, tenant_id: str | None = None) -> Any:
        """Check again that an enrolled machine's BMC answers (after verify-failed)."""
        return self._call("nodes.verify", {"nodeId": node_id, "tenantId": tenant_id}, retry=False)


class Offerings(Group):
    """offerings.* methods."""

    def list(self, *, limit: int | None = None, after: str | None = None,
            tenant_id: str | None = None) -> Any:
        """Offerings the tenant made or received, with quota use."""
        return self._call("offerings.list", {"limit": limit, "after": after,
            "tenantId": tenant_id}, retry=True)


class Pki(Group):
    """pki.* methods."""

    def show(self, *, tenant_id: str | None = None) -> Any:
        """The SPKI pins of the serving CA, the join-signing and the join-encryption keys."""
        return self._call("pki.show", {"tenantId": tenant_id}, retry=True)


class Pools(Group):
    """pools.* methods."""

    def create(self, *, site_id: str, class_: str, gpu_model: str | None = None,
            policy: dict[str, Any] | None = None, name: str | None = None,
            idempotency_key: str | None = None, tenant_id: str | None = None) -> Any:
        """Create a pool of one GPU model (or CPU only) with an acceptance policy."""
        return self._call("pools.create", {"siteId": site_id, "class": class_,
            "gpuModel": gpu_model, "policy": policy, "name": name,
            "idempotencyKey": idempotency_key,
            "tenantId": tenant_id}, retry=idempotency_key is not None)

    def get(self, *, pool_id: str, tenant_id: str | None = None) -> Any:
        """One pool (owned or offered to the tenant)."""
        return self._call("pools.get", {"poolId": pool_id, "tenantId": tenant_id}, retry=True)

    def list(self, *, limit: int | None = None, after: str | None = None,
            tenant_id: str | None = None) -> Any:
        """Pools the tenant owns or was offered."""
        return self._call("pools.list", {"limit": limit, "after": after,
            "tenantId": tenant_id}, retry=True)

    def offer(self, *, pool_id: str, to: str, quota: dict[str, Any],
            limits: dict[str, Any] | None = None, share: int | None = None,
            priority_classes: builtins.list[str] | None = None,
            tenant_id: str | None = None) -> Any:
        """Offer a pool to a tenant with quotas (gpu for GPU pools; vcpu, memory for CPU
        pools).
        """
        return self._call("pools.offer", {"poolId": pool_id, "to": to, "quota": quota,
            "limits": limits, "share": share, "priorityClasses": priority_classes,
            "tenantId": tenant_id}, retry=False)

    def update(self, *, pool_id: str, policy: dict[str, Any], tenant_id: str | None = None) -> Any:
        """Replace a pool's policy; its nodes converge to the new profile of units."""
        return self._call("pools.update", {"poolId": pool_id, "policy": policy,
            "tenantId": tenant_id}, retry=False)


class Reservations(Group):
    """reservations.* methods."""

    def create(self, *, pool_id: str, devices: builtins.list[dict[str, Any]], duration: int,
            product: str | None = None, selector: str | None = None, model: str | None = None,
            kubernetes: bool | None = None, slurm: str | None = None, start: str | None = None,
            start_in: int | None = None, at_earliest: bool | None = None, before: str | None = None,
            before_in: int | None = None, nodes: int | None = None, binding: str | None = None,
            priority_class: str | None = None, idempotency_key: str | None = None,
            tenant_id: str | None = None) -> Any:
        """Reserve GPUs of one pool for a window: placed now, or pending until capacity frees."""
        return self._call("reservations.create", {"poolId": pool_id, "devices": devices,
            "duration": duration, "product": product, "selector": selector, "model": model,
            "kubernetes": kubernetes, "slurm": slurm, "start": start, "startIn": start_in,
            "atEarliest": at_earliest, "before": before, "beforeIn": before_in, "nodes": nodes,
            "binding": binding, "priorityClass": priority_class, "idempotencyKey": idempotency_key,
            "tenantId": tenant_id}, retry=idempotency_key is not None)

    def extend(self, *, reservation_id: str, by: int, tenant_id: str | None = None) -> Any:
        """Move a reservation's end; refused with the blocking window if the GPUs are booked."""
        return self._call("reservations.extend", {"reservationId": reservation_id, "by": by,
            "tenantId": tenant_id}, retry=False)

    def get(self, *, reservation_id: str, tenant_id: str | None = None) -> Any:
        """One reservation, with its window, node and (once active) binding."""
        return self._call("reservations.get", {"reservationId": reservation_id,
            "tenantId": tenant_id}, retry=True)

    def list(self, *, limit: int | None = None, after: str | None = None,
            pool_id: str | None = None, state: str | None = None,
            tenant_id: str | None = None) -> Any:
        """Reservations of the tenant, oldest first."""
        return self._call("reservations.list", {"limit": limit, "after": after, "poolId": pool_id,
            "state": state, "tenantId": tenant_id}, retry=True)

    def queue(self, *, pool_id: str | None = None, tenant_id: str | None = None) -> Any:
        """Waiting requests in the order they are offered capacity: planned starts first (their
        GPUs are booked from then), then pending ones (priority, fair share, age), each with
        its position and why it waits: all of an owned pool's, else the tenant's own.
        """
        return self._call("reservations.queue", {"poolId": pool_id,
            "tenantId": tenant_id}, retry=True)

    def release(self, *, reservation_id: str, cancel: bool | None = None,
            tenant_id: str | None = None) -> Any:
        """End a reservation now (or withdraw one that has not started); quota is refunded."""
        return self._call("reservations.release", {"reservationId": reservation_id,
            "cancel": cancel, "tenantId": tenant_id}, retry=False)


class Sandboxes(Group):
    """sandboxes.* methods."""

    def create(self, *, pool_id: str, vcpus: int, memory_gi_b: int, image: str | None = None,
            forwards: builtins.list[dict[str, Any]] | None = None, name: str | None = None,
            network: str | None = None, timeout_seconds: int | None = None,
            idempotency_key: str | None = None, tenant_id: str | None = None) -> Any:
        """Claim vCPUs and memory on one node of a pool and start a sandbox VM there."""
        return self._call("sandboxes.create", {"poolId": pool_id, "vcpus": vcpus,
            "memoryGiB": memory_gi_b, "image": image, "forwards": forwards, "name": name,
            "network": network, "timeoutSeconds": timeout_seconds,
            "idempotencyKey": idempotency_key,
            "tenantId": tenant_id}, retry=idempotency_key is not None)

    def exec(self, *, sandbox_id: str, argv: builtins.list[str],
            timeout_seconds: float | None = None, detach: bool | None = None,
            tenant_id: str | None = None) -> Any:
        """Run a command in a running sandbox's guest: its exit code, stdout and stderr (each
        up to 1 MiB), or with detach its pid at once.
        """
        return self._call("sandboxes.exec", {"sandboxId": sandbox_id, "argv": argv,
            "timeoutSeconds": timeout_seconds, "detach": detach,
            "tenantId": tenant_id}, retry=False)

    def fetch(self, *, sandbox_id: str, path: str, tenant_id: str | None = None) -> Any:
        """Read a file of a running sandbox's guest (base64; at most the pool's maxFileBytes)."""
        return self._call("sandboxes.fetch", {"sandboxId": sandbox_id, "path": path,
            "tenantId": tenant_id}, retry=True)

    def get(self, *, sandbox_id: str, tenant_id: str | None = None) -> Any:
        """One sandbox."""
        return self._call("sandboxes.get", {"sandboxId": sandbox_id,
            "tenantId": tenant_id}, retry=True)

    def list(self, *, limit: int | None = None, after: str | None = None,
            tenant_id: str | None = None) -> Any:
        """Sandboxes of the tenant."""
        return self._call("sandboxes.list", {"limit": limit, "after": after,
            "tenantId": tenant_id}, retry=True)

    def logs(self, *, sandbox_id: str, lines: int | None = None,
            tenant_id: str | None = None) -> Any:
        """The last lines of a sandbox VM's serial console, read from its node."""
        return self._call("sandboxes.logs", {"sandboxId": sandbox_id, "lines": lines,
            "tenantId": tenant_id}, retry=True)

    def output(self, *, sandbox_id: str, pid: int, stdout_offset: int | None = None,
            stderr_offset: int | None = None, tenant_id: str | None = None) -> Any:
        """A detached command's output from the offsets given (base64), and whether it ended."""
        return self._call("sandboxes.output", {"sandboxId": sandbox_id, "pid": pid,
            "stdoutOffset": stdout_offset, "stderrOffset": stderr_offset,
            "tenantId": tenant_id}, retry=True)

    def pause(self, *, sandbox_id: str, tenant_id: str | None = None) -> Any:
        """Stop a running sandbox's vCPUs (its memory stays claimed, metered at the pool's
        pausedRate); it is paused once its node says so.
        """
        return self._call("sandboxes.pause", {"sandboxId": sandbox_id,
            "tenantId": tenant_id}, retry=False)

    def put(self, *, sandbox_id: str, path: str, content: str, tenant_id: str | None = None) -> Any:
        """Write a file in a running sandbox's guest (at most the pool's maxFileBytes)."""
        return self._call("sandboxes.put", {"sandboxId": sandbox_id, "path": path,
            "content": content, "tenantId": tenant_id}, retry=False)

    def release(self, *, sandbox_id: str, tenant_id: str | None = None) -> Any:
        """Stop a sandbox's VM; its vCPUs and memory come back once the node stopped it."""
        return self._call("sandboxes.release", {"sandboxId": sandbox_id,
            "tenantId": tenant_id}, retry=False)

    def resume(self, *, sandbox_id: str, tenant_id: str | None = None) -> Any:
        """Run a paused sandbox's vCPUs again; it is running once its node says so."""
        return self._call("sandboxes.resume", {"sandboxId": sandbox_id,
            "tenantId": tenant_id}, retry=False)


class Series(Group):
    """series.* methods."""

    def create(self, *, pool_id: str, devices: builtins.list[dict[str, Any]], every: str,
            until: str, product: str | None = None, selector: str | None = None,
            timezone: str | None = None, from_: str | None = None, horizon_days: int | None = None,
            tenant_id: str | None = None) -> Any:
        """Reserve GPUs on every window of a rule until a day: one reservation per occurrence,
        booked a horizon ahead and extended as time passes.
        """
        return self._call("series.create", {"poolId": pool_id, "devices": devices, "every": every,
            "until": until, "product": product, "selector": selector, "timezone": timezone,
            "from": from_, "horizonDays": horizon_days, "tenantId": tenant_id}, retry=False)

    def get(self, *, series_id: str, tenant_id: str | None = None) -> Any:
        """One series, with its occurrences counted by state and what was refused."""
        return self._call("series.get", {"seriesId": series_id, "tenantId": tenant_id}, retry=True)

    def list(self, *, limit: int | None = None, after: str | None = None,
            tenant_id: str | None = None) -> Any:
        """The tenant's series, oldest first."""
        return self._call("series.list", {"limit": limit, "after": after,
            "tenantId": tenant_id}, retry=True)

    def release(self, *, series_id: str, tenant_id: str | None = None) -> Any:
        """End a series: its occurrences that have not begun are cancelled."""
        return self._call("series.release", {"seriesId": series_id,
            "tenantId": tenant_id}, retry=False)


class Sites(Group):
    """sites.* methods."""

    def create(self, *, kind: str, region: str, name: str | None = None,
            idempotency_key: str | None = None, tenant_id: str | None = None) -> Any:
        """Create a platform site (root tenant only)."""
        return self._call("sites.create", {"kind": kind, "region": region, "name": name,
            "idempotencyKey": idempotency_key,
            "tenantId": tenant_id}, retry=idempotency_key is not None)

    def get(self, *, site_id: str, tenant_id: str | None = None) -> Any:
        """One site."""
        return self._call("sites.get", {"siteId": site_id, "tenantId": tenant_id}, retry=True)

    def list(self, *, limit: int | None = None, after: str | None = None,
            tenant_id: str | None = None) -> Any:
        """Sites of the tenant."""
        return self._call("sites.list", {"limit": limit, "after": after,
            "tenantId": tenant_id}, retry=True)


class System(Group):
    """system.* methods."""

    def whoami(self, *, tenant_id: str | None = None) -> Any:
        """Who the caller is, its tenant and its roles."""
        return self._call("system.whoami", {"tenantId": tenant_id}, retry=True)


class Tenants(Group):
    """tenants.* methods."""

    def create(self, *, slug: str, name: str | None = None, idempotency_key: str | None = None,
            tenant_id: str | None = None) -> Any:
        """Create a customer tenant (root administrators only)."""
        return self._call("tenants.create", {"slug": slug, "name": name,
            "idempotencyKey": idempotency_key,
            "tenantId": tenant_id}, retry=idempotency_key is not None)

    def get(self, *, tenant_id: str | None = None) -> Any:
        """The tenant the call acts in (`tenantId`, by default the caller's own)."""
        return self._call("tenants.get", {"tenantId": tenant_id}, retry=True)

    def list(self, *, limit: int | None = None, after: str | None = None,
            tenant_id: str | None = None) -> Any:
        """Tenants visible from the acting tenant (root sees all)."""
        return self._call("tenants.list", {"limit": limit, "after": after,
            "tenantId": tenant_id}, retry=True)


class Tokens(Group):
    """tokens.* methods."""

    def create(self, *, name: str, role: str | None = None, ttl: int | None = None,
            principal_id: str | None = None, tenant_id: str | None = None) -> Any:
        """Mint an API token. The `token` field is shown once and never again."""
        return self._call("tokens.create", {"name": name, "role": role, "ttl": ttl,
            "principalId": principal_id, "tenantId": tenant_id}, retry=False)

    def list(self, *, limit: int | None = None, after: str | None = None,
            tenant_id: str | None = None) -> Any:
        """API tokens of the tenant's principals (never their secrets)."""
        return self._call("tokens.list", {"limit": limit, "after": after,
            "tenantId": tenant_id}, retry=True)

    def revoke(self, *, token_id: str, tenant_id: str | None = None) -> Any:
        """Revoke an API token."""
        return self._call("tokens.revoke", {"tokenId": token_id,
            "tenantId": tenant_id}, retry=False)


class Usage(Group):
    """usage.* methods."""

    def budgets(self, *, tenant_id: str | None = None) -> Any:
        """The GPU-hour budgets of the offerings the tenant received (or made), each in its
        current period: the budget, what is booked in it (future bookings too) and what was
        used so far.
        """
        return self._call("usage.budgets", {"tenantId": tenant_id}, retry=True)

    def list(self, *, limit: int | None = None, after: str | None = None, meter: str | None = None,
            subject: str | None = None, tenant_id: str | None = None) -> Any:
        """Metered usage of the tenant, such as gpu.H100.hours, per ended window."""
        return self._call("usage.list", {"limit": limit, "after": after, "meter": meter,
            "subject": subject, "tenantId": tenant_id}, retry=True)

    def report(self, *, from_: str, to: str, group_by: str | None = None,
            tenant_id: str | None = None) -> Any:
        """Usage between two moments, summed per group: closed records for the part of their
        window inside it, and what runs since its last close. The root tenant's report
        covers every tenant.
        """
        return self._call("usage.report", {"from": from_, "to": to, "groupBy": group_by,
            "tenantId": tenant_id}, retry=True)


class Webhooks(Group):
    """webhooks.* methods."""

    def create(self, *, url: str, types: str | None = None, description: str | None = None,
            max_attempts: int | None = None, tenant_id: str | None = None) -> Any:
        """Subscribe a URL to the tenant's events from now on. The answer carries the signing
        secret, shown this once (deliveries are signed as Standard Webhooks says).
        """
        return self._call("webhooks.create", {"url": url, "types": types,
            "description": description, "maxAttempts": max_attempts,
            "tenantId": tenant_id}, retry=False)

    def delete(self, *, webhook_id: str, tenant_id: str | None = None) -> Any:
        """Stop delivering; the subscription, its log and its secret are deleted."""
        return self._call("webhooks.delete", {"webhookId": webhook_id,
            "tenantId": tenant_id}, retry=False)

    def deliveries(self, *, webhook_id: str, limit: int | None = None, after: str | None = None,
            state: str | None = None, tenant_id: str | None = None) -> Any:
        """The subscription's delivery log, newest first: each event's state, attempts, and
        what the receiver last answered.
        """
        return self._call("webhooks.deliveries", {"webhookId": webhook_id, "limit": limit,
            "after": after, "state": state, "tenantId": tenant_id}, retry=True)

    def get(self, *, webhook_id: str, tenant_id: str | None = None) -> Any:
        """One subscription."""
        return self._call("webhooks.get", {"webhookId": webhook_id,
            "tenantId": tenant_id}, retry=True)

    def list(self, *, limit: int | None = None, after: str | None = None,
            tenant_id: str | None = None) -> Any:
        """The tenant's subscriptions."""
        return self._call("webhooks.list", {"limit": limit, "after": after,
            "tenantId": tenant_id}, retry=True)

    def replay(self, *, webhook_id: str, delivery_id: str | None = None, since: int | None = None,
            tenant_id: str | None = None) -> Any:
        """Send deliveries again, in order, before anything newer."""
        return self._call("webhooks.replay", {"webhookId": webhook_id, "deliveryId": delivery_id,
            "since": since, "tenantId": tenant_id}, retry=False)


GROUPS: dict[str, type[Group]] = {
    "audit": Audit,
    "capacity": Capacity,
    "events": Events,
    "images": Images,
    "join_tokens": JoinTokens,
    "maintenance": Maintenance,
    "nodes": Nodes,
    "offerings": Offerings,
    "pki": Pki,
    "pools": Pools,
    "reservations": Reservations,
    "sandboxes": Sandboxes,
    "series": Series,
    "sites": Sites,
    "system": System,
    "tenants": Tenants,
    "tokens": Tokens,
    "usage": Usage,
    "webhooks": Webhooks,
}
