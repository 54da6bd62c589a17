"""The events watch stream, in process: it keeps delivering after a quiet keep-alive, and a
refusal is answered at the same edge as the envelope (with its denied audit row)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from django.db import connection

from audit.models import AuditEvent
from compute.http import watch
from tests.support.waiting import eventually

pytestmark = pytest.mark.django_db(transaction=True)


class Watcher:
    """Runs the ASGI app against an in-memory client."""

    def __init__(self, token: str, query: str) -> None:
        self.scope = {"type": "http", "query_string": query.encode(),
                      "headers": [(b"authorization", f"Bearer {token}".encode())]}
        self.sent: list[dict] = []
        self.inbox: asyncio.Queue[dict] = asyncio.Queue()

    async def receive(self) -> dict:
        return await self.inbox.get()

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.body().splitlines() if line.strip()]



def site_maker(root):
    """Create a site from a worker thread (its own connection, closed after)."""

    def create_site(region: str) -> None:
        try:
            root("sites.create", kind="shared", region=region)
        finally:
            connection.close()

    return create_site


def before_and_after(watcher: Watcher, create_site, between) -> bool:
    """Watch; a site is made, `between()` runs (in a thread), another site is made: whether
    the second event arrived on the same stream."""

    async def scenario() -> bool:
        app = asyncio.create_task(watch.events_watch(watcher.scope, watcher.receive,
                                                     watcher.send))
        await asyncio.to_thread(create_site, "before")
        assert await eventually(lambda: len(watcher.events()) == 1, 30)
        await asyncio.to_thread(between)
        await asyncio.to_thread(create_site, "after")
        arrived = await eventually(lambda: len(watcher.events()) == 2, 30)
        watcher.inbox.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(app, 30)
        return arrived

    return asyncio.run(scenario())


def test_events_arrive_after_a_quiet_spell_longer_than_the_keepalive(root, root_token):
    watcher = Watcher(root_token, "types=site.*&since=0")

    def quiet() -> None:  # nothing happens for longer than the keep-alive period
        time.sleep(watch.KEEPALIVE_SECONDS + 1.5)
        assert b"\n\n" in watcher.body()  # a blank keep-alive line went out

    arrived = before_and_after(watcher, site_maker(root), quiet)
    assert arrived, "the stream stopped delivering after its first keep-alive"
    assert [e["payload"]["region"] for e in watcher.events()] == ["before", "after"]


@pytest.mark.parametrize(("query", "seen"), [("types=site.*", ["new"]),
                                             ("types=site.*&since=0", ["old", "new"])])
def test_a_watch_starts_now_unless_told_where_to_resume(root, root_token, query, seen):
    create_site = site_maker(root)
    create_site("old")
    watcher = Watcher(root_token, query)

    async def scenario() -> None:
        app = asyncio.create_task(watch.events_watch(watcher.scope, watcher.receive,
                                                     watcher.send))
        assert await eventually(lambda: watcher.sent, 30)  # the stream is open
        await asyncio.to_thread(create_site, "new")
        assert await eventually(lambda: len(watcher.events()) == len(seen), 30)
        await asyncio.sleep(0.5)  # nothing more comes
        watcher.inbox.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(app, 30)

    asyncio.run(scenario())
    assert [e["payload"]["region"] for e in watcher.events()] == seen


def test_watching_another_tenant_is_answered_as_a_missing_one_and_audited_at_home(root, acme):
    viewer = acme("tokens.create", name="viewer", role="viewer")["token"]
    probes = {ref: Watcher(viewer, f"tenantId={ref}") for ref in ("root", "nobody")}

    async def scenario() -> None:
        for probe in probes.values():
            await watch.events_watch(probe.scope, probe.receive, probe.send)

    asyncio.run(scenario())
    answers = {ref: (p.sent[0]["status"], json.loads(p.body())) for ref, p in probes.items()}
    for ref, (status, body) in answers.items():
        assert (status, body["ok"], body["error"]["code"]) == (404, False, "not_found")
        assert body["error"]["message"] == f"tenant {ref!r} not found"
    rows = AuditEvent.objects.filter(action="events.watch")  # both, in the caller's own log
    assert {(r.allowed, r.tenant_id, r.request_id) for r in rows} == {
        (False, acme.tenant_id, answer["requestId"]) for _, answer in answers.values()}


def test_an_unknown_event_type_is_a_clear_400(root_token):
    bad = Watcher(root_token, "types=nodes.*")
    asyncio.run(watch.events_watch(bad.scope, bad.receive, bad.send))
    assert bad.sent[0]["status"] == 400
    assert "an event type, or a group" in json.loads(bad.body())["error"]["message"]


def test_streams_share_one_connection_and_a_caller_past_its_limit_gets_429(root, acme):
    from django.conf import settings

    viewer = acme("tokens.create", name="viewer", role="viewer")["token"]

    def backends() -> int:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity "
                               "WHERE datname = current_database()")
                return cursor.fetchone()[0]
        finally:
            connection.close()

    async def scenario() -> tuple[list[int], int, int]:
        before = await asyncio.to_thread(backends)
        watchers = [Watcher(viewer, "") for _ in range(settings.BC_STREAMS_PER_CALLER + 5)]
        apps = [asyncio.create_task(watch.events_watch(w.scope, w.receive, w.send))
                for w in watchers]
        assert await eventually(lambda: all(w.sent for w in watchers), 30)
        await asyncio.sleep(1)  # every stream has paged and now waits
        during = await asyncio.to_thread(backends)
        # Another tenant is still served while this caller holds all it may.
        other = Watcher(root.token, "types=site.*&since=0")
        app = asyncio.create_task(watch.events_watch(other.scope, other.receive, other.send))
        assert await eventually(lambda: bool(other.sent), 30)
        for w in [*watchers, other]:
            w.inbox.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(asyncio.gather(*apps, app), 30)
        return [w.sent[0]["status"] for w in watchers], during - before, other.sent[0]["status"]

    statuses, extra_connections, other_status = asyncio.run(scenario())
    assert statuses.count(200) == settings.BC_STREAMS_PER_CALLER
    assert statuses.count(429) == 5
    assert other_status == 200
    # The hub's one LISTEN connection (and this test's own), not one per stream.
    assert extra_connections <= 2, extra_connections


def test_a_stream_ends_when_its_token_is_revoked(root, monkeypatch):
    monkeypatch.setattr(watch, "KEEPALIVE_SECONDS", 0.5)
    minted = root("tokens.create", name="watcher", role="viewer")
    watcher = Watcher(minted["token"], "")

    async def scenario() -> bool:
        app = asyncio.create_task(watch.events_watch(watcher.scope, watcher.receive,
                                                     watcher.send))
        assert await eventually(lambda: bool(watcher.sent), 30)
        await asyncio.to_thread(revoke, minted["id"])
        ended = await eventually(lambda: any(
            m.get("more_body") is False for m in watcher.sent), 10)
        watcher.inbox.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(app, 30)
        return ended

    def revoke(token_id: str) -> None:
        try:
            root("tokens.revoke", tokenId=token_id)
        finally:
            connection.close()

    assert asyncio.run(scenario()), "the stream kept going after its token was revoked"


def test_a_stream_loses_nothing_when_the_hubs_connection_is_cut(root, root_token):
    """The one LISTEN connection dies (a failover, a killed backend): the hub reconnects and
    wakes every watcher, which re-reads from its cursor."""
    watcher = Watcher(root_token, "types=site.*&since=0")

    def cut_the_listener() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE query ILIKE 'LISTEN bc_events%%' AND pid <> pg_backend_pid()")
                assert cursor.rowcount == 1
        finally:
            connection.close()

    arrived = before_and_after(watcher, site_maker(root), cut_the_listener)
    assert arrived, "an event committed while the hub reconnected was lost"
    assert [e["payload"]["region"] for e in watcher.events()] == ["before", "after"]


def open_streams(watchers: list[Watcher]) -> list[int]:
    """Open every watcher's stream; the statuses they were answered, then hang up."""

    async def scenario() -> list[int]:
        apps = [asyncio.create_task(watch.events_watch(w.scope, w.receive, w.send))
                for w in watchers]
        assert await eventually(lambda: all(w.sent for w in watchers), 30)
        statuses = [w.sent[0]["status"] for w in watchers]
        for w in watchers:
            w.inbox.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(asyncio.gather(*apps), 30)
        return statuses

    return asyncio.run(scenario())


def test_one_tenant_cannot_take_every_stream_and_the_limits_hold_across_processes(
        root, acme, settings):
    from compute.platform.iam.streams import StreamLease, stream_lease_take

    settings.BC_STREAMS_PER_CALLER, settings.BC_STREAMS_PER_TENANT = 3, 5
    viewers = [acme("tokens.create", name=f"viewer-{n}", role="viewer")["token"]
               for n in range(4)]
    crowd = [Watcher(token, "") for token in viewers for _ in range(3)]
    other = Watcher(root.token, "")
    statuses = open_streams([*crowd, other])
    assert statuses[:-1].count(200) == 5  # the tenant's limit, whoever holds them
    assert statuses[-1] == 200  # another tenant is still served
    refused = [w for w in crowd if w.sent[0]["status"] == 429]
    assert all(dict(w.sent[0]["headers"]).get(b"retry-after") for w in refused)
    assert not StreamLease.objects.exists()  # every stream gave its lease back

    me = root("system.whoami")["principalId"]
    for _ in range(3):  # streams of this caller held by another API process
        stream_lease_take(principal_id=me, tenant_id=root("system.whoami")["tenantId"])
    assert open_streams([Watcher(root.token, "")]) == [429]
