"""API methods sandboxes.*."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import IdempotencyKeyField, Input, ListInput, PublicIdField
from compute.core.api.registry import CallContext, Subject, endpoint
from compute.core.api.shapes import BOOLEAN, INTEGER, STRING, array, nullable, obj, page_of
from compute.core.errors import InvalidState, PreconditionFailed
from compute.platform.paging import page
from fleet.api.pools import pool_subject
from fleet.services.ask import command_wait, node_ask
from reservations import presenters as wire
from reservations import selectors
from reservations.events import ReservationEvent
from reservations.models.sandboxes import LIVE
from reservations.presenters import present_sandbox
from reservations.services.sandbox_use import file_limit, sandbox_exec, sandbox_pause, sandbox_put
from reservations.services.sandboxes import sandbox_create, sandbox_release

SANDBOX = Subject("sandbox", selectors.access_sandbox_by_id, "sandbox_id")


class ForwardIn(Input):
    host_port = serializers.IntegerField(min_value=1024, max_value=65535)
    guest_port = serializers.IntegerField(min_value=1, max_value=65535)


class SandboxCreateIn(Input):
    pool_id = PublicIdField("pool")
    vcpus = serializers.IntegerField(min_value=1, max_value=256)
    memory_gi_b = serializers.IntegerField(min_value=1, max_value=4096)
    image = serializers.CharField(required=False, max_length=63, min_length=1,
                                  help_text="An image id or name of the pool (default: its "
                                            "image named default, or its only image).")
    forwards = ForwardIn(many=True, required=False, max_length=16,  # type: ignore[call-arg]
                         help_text="TCP ports of the node forwarded to the guest (on loopback "
                                   "unless the pool's policy says publicForwards).")
    name = serializers.CharField(required=False, default="", max_length=200, allow_blank=True)
    network = serializers.ChoiceField(
        choices=["none", "outbound"], required=False,
        help_text="none (only the guest agent's channel; the default without forwards) or "
                  "outbound (user-mode networking), where the pool's policy allows it.")
    timeout_seconds = serializers.IntegerField(
        required=False, min_value=10, max_value=366 * 86_400,
        help_text="Release the sandbox this many seconds after it is created (the pool's "
                  "maxLifetime bounds it).")
    idempotency_key = IdempotencyKeyField()


CONSOLE = obj(sandboxId=STRING, nodeId=nullable(STRING), lines=array(STRING))


@endpoint("sandboxes", "create", returns=wire.SANDBOX, input=SandboxCreateIn, mutating=True,
          subject=pool_subject("sandbox"),
          emits=(ReservationEvent.SANDBOX_CREATED,))
def sandboxes_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Claim vCPUs and memory on one node of a pool and start a sandbox VM there."""
    data["memory_gib"] = data.pop("memory_gi_b")
    data["forwards"] = [ForwardIn.wire_form(f) for f in data.get("forwards", [])]
    return present_sandbox(sandbox_create(tenant=ctx.tenant, actor=ctx.principal, **data))


class SandboxIdIn(Input):
    sandbox_id = PublicIdField("sbx")


@endpoint("sandboxes", "get", returns=wire.SANDBOX,
          input=SandboxIdIn, mutating=False, subject=SANDBOX)
def sandboxes_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """One sandbox."""
    return present_sandbox(ctx.subject)


@endpoint("sandboxes", "list", returns=page_of(wire.SANDBOX), input=ListInput, mutating=False)
def sandboxes_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Sandboxes of the tenant."""
    return page(selectors.sandbox_list(tenant=ctx.tenant), present=present_sandbox, **data)


@endpoint("sandboxes", "release", returns=wire.SANDBOX,
          input=SandboxIdIn, mutating=True, subject=SANDBOX,
          emits=(ReservationEvent.SANDBOX_RELEASED,))
def sandboxes_release(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Stop a sandbox's VM; its vCPUs and memory come back once the node stopped it."""
    return present_sandbox(sandbox_release(tenant=ctx.tenant, actor=ctx.principal,
                                           sandbox_id=ctx.subject.id))


class SandboxLogsIn(SandboxIdIn):
    lines = serializers.IntegerField(required=False, default=50, min_value=1, max_value=2000)


@endpoint("sandboxes", "logs", returns=CONSOLE,
          input=SandboxLogsIn, mutating=False, subject=SANDBOX)
def sandboxes_logs(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """The last lines of a sandbox VM's serial console, read from its node."""
    sandbox = ctx.subject
    if sandbox.state not in LIVE:
        raise InvalidState(f"sandbox {sandbox.id} is {sandbox.state}: its console is gone",
                           state=sandbox.state)
    said = node_ask(node_id=sandbox.node_id, kind="vm.console",
                    payload={"sandboxId": sandbox.id, "lines": data["lines"]})
    lines = said.get("lines")
    return {"sandboxId": sandbox.id, "nodeId": sandbox.node_id,
            "lines": [str(line) for line in lines] if isinstance(lines, list) else []}


EXEC = obj(sandboxId=STRING, commandId=STRING, pid=INTEGER, detached=BOOLEAN,
           exitCode=nullable(INTEGER), signal=nullable(INTEGER), timedOut=BOOLEAN,
           stdout=STRING, stderr=STRING, stdoutTruncated=BOOLEAN, stderrTruncated=BOOLEAN)
OUTPUT = obj(sandboxId=STRING, pid=INTEGER, exited=BOOLEAN, exitCode=nullable(INTEGER),
             signal=nullable(INTEGER), stdout=STRING, stderr=STRING, stdoutOffset=INTEGER,
             stderrOffset=INTEGER)
FILE = obj(sandboxId=STRING, path=STRING, bytes=INTEGER, content=STRING)
SYNC_SECONDS = 600  # a call waits at most this long; longer commands run detached
GUEST_PATH = r"^/[^\x00]{0,1023}$"
BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


class SandboxExecIn(SandboxIdIn):
    argv = serializers.ListField(child=serializers.CharField(max_length=65_536,
                                                             trim_whitespace=False),
                                 min_length=1, max_length=1024,
                                 help_text="The program and its arguments (no shell: name "
                                           "sh -c for one).")
    timeout_seconds = serializers.FloatField(
        required=False, default=60, min_value=0.1, max_value=3600,
        help_text="The command (and all it started) is killed after this long.")
    detach = serializers.BooleanField(
        required=False, default=False,
        help_text="Answer once the command started, with its pid; read its output with "
                  "sandboxes.output (as --follow does).")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs.get("detach") and attrs.get("timeout_seconds", 60) > SYNC_SECONDS:
            raise serializers.ValidationError({"timeoutSeconds": [
                f"above {SYNC_SECONDS} s a command must run detached (detach: true)"]})
        if any("\0" in arg for arg in attrs["argv"]):
            raise serializers.ValidationError({"argv": ["an argument holds a NUL byte"]})
        return attrs


@endpoint("sandboxes", "exec", returns=EXEC, input=SandboxExecIn, mutating=True,
          subject=SANDBOX, emits=(ReservationEvent.SANDBOX_EXEC,))
def sandboxes_exec(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Run a command in a running sandbox's guest: its exit code, stdout and stderr (each
    up to 1 MiB), or with detach its pid at once."""
    command = sandbox_exec(tenant=ctx.tenant, actor=ctx.principal, sandbox_id=ctx.subject.id,
                           argv=data["argv"], timeout_seconds=data["timeout_seconds"],
                           detach=data["detach"])
    said = command_wait(command, timeout=(15 if data["detach"] else
                                          data["timeout_seconds"] + 30),
                        refused=PreconditionFailed)
    return {"sandboxId": ctx.subject.id, "commandId": command.id, "detached": data["detach"],
            "timedOut": False, "stdout": "", "stderr": "", "stdoutTruncated": False,
            "stderrTruncated": False, "exitCode": None, "signal": None, **said}


class SandboxOutputIn(SandboxIdIn):
    pid = serializers.IntegerField(min_value=1)
    stdout_offset = serializers.IntegerField(required=False, default=0, min_value=0)
    stderr_offset = serializers.IntegerField(required=False, default=0, min_value=0)


@endpoint("sandboxes", "output", returns=OUTPUT, input=SandboxOutputIn, mutating=False,
          subject=SANDBOX)
def sandboxes_output(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """A detached command's output from the offsets given (base64), and whether it ended."""
    said = node_ask(node_id=ctx.subject.node_id, kind="vm.exec-read", payload={
        "sandboxId": ctx.subject.id, "pid": data["pid"],
        "stdoutOffset": data["stdout_offset"], "stderrOffset": data["stderr_offset"]},
        refused=PreconditionFailed)
    return {"sandboxId": ctx.subject.id, "exitCode": None, "signal": None, **said}


class SandboxPutIn(SandboxIdIn):
    path = serializers.RegexField(GUEST_PATH, max_length=1024,
                                  help_text="An absolute path in the guest.")
    content = serializers.RegexField(BASE64, max_length=3 << 20, allow_blank=True,
                                     help_text="The file's bytes, base64.")

    def validate_content(self, value: str) -> bytes:
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise serializers.ValidationError("not base64") from None


@endpoint("sandboxes", "put", returns=FILE, input=SandboxPutIn, mutating=True,
          subject=SANDBOX, emits=(ReservationEvent.SANDBOX_FILE_PUT,))
def sandboxes_put(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Write a file in a running sandbox's guest (at most the pool's maxFileBytes)."""
    command = sandbox_put(tenant=ctx.tenant, actor=ctx.principal, sandbox_id=ctx.subject.id,
                          path=data["path"], data=data["content"])
    said = command_wait(command, timeout=60, refused=PreconditionFailed)
    return {"sandboxId": ctx.subject.id, "path": data["path"], "bytes": said.get("bytes", 0),
            "content": ""}


class SandboxFetchIn(SandboxIdIn):
    path = serializers.RegexField(GUEST_PATH, max_length=1024,
                                  help_text="An absolute path in the guest.")


@endpoint("sandboxes", "fetch", returns=FILE, input=SandboxFetchIn, mutating=False,
          subject=SANDBOX)
def sandboxes_fetch(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Read a file of a running sandbox's guest (base64; at most the pool's maxFileBytes)."""
    sandbox = ctx.subject
    if sandbox.state != "running":
        raise InvalidState(f"sandbox {sandbox.id} is {sandbox.state}, not running",
                           state=sandbox.state)
    said = node_ask(node_id=sandbox.node_id, kind="vm.get", timeout=60, payload={
        "sandboxId": sandbox.id, "path": data["path"], "limit": file_limit(sandbox)},
        refused=PreconditionFailed)
    return {"sandboxId": sandbox.id, "path": data["path"], "bytes": said.get("bytes", 0),
            "content": said.get("data", "")}


@endpoint("sandboxes", "pause", returns=wire.SANDBOX, input=SandboxIdIn, mutating=True,
          subject=SANDBOX, emits=(ReservationEvent.SANDBOX_PAUSE_ASKED,))
def sandboxes_pause(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Stop a running sandbox's vCPUs (its memory stays claimed, metered at the pool's
    pausedRate); it is paused once its node says so."""
    return present_sandbox(sandbox_pause(tenant=ctx.tenant, actor=ctx.principal,
                                         sandbox_id=ctx.subject.id))


@endpoint("sandboxes", "resume", returns=wire.SANDBOX, input=SandboxIdIn, mutating=True,
          subject=SANDBOX, emits=(ReservationEvent.SANDBOX_PAUSE_ASKED,))
def sandboxes_resume(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Run a paused sandbox's vCPUs again; it is running once its node says so."""
    return present_sandbox(sandbox_pause(tenant=ctx.tenant, actor=ctx.principal,
                                         sandbox_id=ctx.subject.id, pause=False))
