"""The console's pages and actions, in process: every page renders from the API call it
mirrors, actions are envelope calls with the session and the CSRF header, and what a page
shows follows the signed-in principal's role and tenant."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from compute.http.console.pages import gpu_hours_chart
from compute.platform.tenancy.services import user_create
from reservations.models import Reservation, UsageRecord
from tests.compute.test_console import signed_in
from tests.conftest import POLICY
from tests.factories import make_node
from tests.reservations.conftest import reserve
from tests.support.writes import recorded

PAGES = ["", "pools", "reservations", "sandboxes", "nodes", "join-tokens", "tenants", "audit",
         "usage", "webhooks"]
ACTIONS = ['data-action="reservations.create"', 'data-action="reservations.release"',
           'data-action="nodes.cordon"', 'data-action="joinTokens.create"']


def envelope(browser: Client, action: str, body: dict, *, csrf: bool = True):
    group, method = action.split(".")
    headers = {"HTTP_X_BETTER_COMPUTE": "1"} if csrf else {}
    return browser.post(f"/api/compute/{group}/{method}", json.dumps(body),
                        content_type="application/json", **headers)


def text(browser: Client, path: str) -> str:
    response = browser.get(path)
    assert response.status_code == 200, (path, response.status_code)
    return response.content.decode()


def test_every_page_renders_for_the_root_administrator(root, root_token, pool):
    node = make_node(pool["id"])
    rsv = reserve(root, pool, 2).result
    browser = signed_in(root_token)
    for name in PAGES:
        text(browser, f"/console/{name}")
    assert f'id="{rsv["id"]}"' in text(browser, "/console/reservations")
    assert "reservation.placed" in text(browser, f"/console/reservations/{rsv['id']}")
    node_page = text(browser, f"/console/nodes/{node.id}")
    assert "session epoch" in node_page
    assert 'data-held="2"' in node_page
    assert 'data-action="nodes.cordon"' in node_page
    pools_page = text(browser, "/console/pools")
    assert ">8</td>" in pools_page  # 8 GPUs in the capacity rollup
    assert "reservations.create" in text(browser, "/console/audit")


def test_a_tile_shows_each_gpu_and_the_reservation_holding_it(root, root_token, pool):
    node = make_node(pool["id"])
    rsv = reserve(root, pool, 3).result
    tiles = text(signed_in(root_token), "/console/board")
    assert f'id="{node.id}"' in tiles
    assert "GPUs 3/8" in tiles
    assert tiles.count(f'/console/reservations/{rsv["id"]}"') == 3
    assert tiles.count(">free<") == 5


def test_a_session_acts_through_the_envelope_only_with_the_csrf_header(root, root_token, pool):
    node = make_node(pool["id"])
    browser = signed_in(root_token)
    refused = envelope(browser, "nodes.cordon", {"nodeId": node.id, "reason": "x"}, csrf=False)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "csrf_header_missing"
    with recorded() as written:
        done = envelope(browser, "nodes.cordon", {"nodeId": node.id, "reason": "disk"})
    assert done.status_code == 200
    assert done.json()["result"]["cordoned"] is True
    assert written.audit == ["node.cordon"]
    assert written.events == ["node.cordoned"]


def test_an_error_names_the_field_for_the_form(root, root_token, pool):
    answer = envelope(signed_in(root_token), "reservations.create", {
        "poolId": pool["id"], "devices": [{"class": "gpu", "count": 0}], "duration": 3_600_000})
    assert answer.status_code == 400
    assert answer.json()["error"]["details"]["field"] == "devices[0].count"


def test_a_viewer_sees_no_actions_and_a_forged_call_is_refused_and_audited(root, pool):
    node = make_node(pool["id"])
    reserve(root, pool, 1)
    viewer = signed_in(root("tokens.create", name="watcher", role="viewer")["token"])
    for name in ["reservations", "join-tokens", f"nodes/{node.id}"]:
        page = text(viewer, f"/console/{name}")
        assert not [a for a in ACTIONS if a in page], name
    with recorded() as written:
        forged = envelope(viewer, "nodes.cordon", {"nodeId": node.id, "reason": "forged"})
    assert forged.status_code == 403
    assert written.audit == ["!nodes.cordon"]
    assert written.events == []
    assert viewer.get("/console/tenants").status_code == 403


def test_a_tenant_member_sees_only_its_own_reservations_and_offered_pools(root, root_token, pool,
                                                                          acme):
    make_node(pool["id"])
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 4})
    theirs = reserve(root, pool, 1).result
    root_sandbox = root("sandboxes.create", poolId=pool["id"], vcpus=2, memoryGiB=4)
    member_token = acme("tokens.create", name="dev", role="member")["token"]
    mine = envelope(signed_in(member_token), "reservations.create", {
        "poolId": pool["id"], "devices": [{"class": "gpu", "count": 1}],
        "duration": 3_600_000}).json()["result"]
    member = signed_in(member_token)
    page = text(member, "/console/reservations")
    assert mine["id"] in page
    assert theirs["id"] not in page
    assert pool["id"] in text(member, "/console/pools")
    assert root_sandbox["id"] not in text(member, "/console/sandboxes")
    assert member.get(f"/console/reservations/{theirs['id']}").status_code == 404
    assert theirs["id"] not in text(member, "/console/")  # the board's GPU table
    root_page = text(signed_in(root_token), "/console/reservations?tenant=acme")
    assert mine["id"] in root_page


def test_a_django_user_signs_in_with_a_password_and_acts_as_its_principal(root, pool):
    node = make_node(pool["id"])
    principal = user_create(tenant_slug="root", username="ops", password="a long passphrase",
                            role="operator")
    browser = Client()
    wrong = browser.post("/console/sign-in", {"username": "ops", "password": "guess"})
    assert wrong.status_code == 401
    assert browser.post("/console/sign-in", {"username": "ops", "password": "a long passphrase"}
                        )["Location"] == "/console/"
    assert "ops · root" in text(browser, "/console/")
    with recorded() as written:
        answer = envelope(browser, "nodes.cordon", {"nodeId": node.id, "reason": "r"})
    assert answer.status_code == 200
    assert written.audit == ["node.cordon"]
    assert AuditEvent.objects.filter(action="node.cordon").get().actor_id == principal.id
    browser.post("/console/sign-out")
    assert browser.get("/console/")["Location"] == "/console/sign-in"


def test_signing_out_ends_the_session_for_the_envelope_too(root, root_token, pool):
    node = make_node(pool["id"])
    browser = signed_in(root_token)
    browser.post("/console/sign-out")
    answer = envelope(browser, "nodes.cordon", {"nodeId": node.id, "reason": "x"})
    assert answer.status_code == 401


@pytest.mark.parametrize("meter", ["gpu.H100.hours"])
def test_the_usage_page_charts_gpu_hours_per_day_and_downloads_the_report(root, root_token,
                                                                         meter):
    from compute.platform.tenancy.models import Tenant

    tenant = Tenant.objects.get(slug="root")
    day = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    for offset, quantity in [(0, "2.5"), (0, "1.5"), (1, "8")]:
        start = day - timedelta(days=offset)
        UsageRecord.objects.create(tenant=tenant, subject=f"rsv_{offset}{quantity}", meter=meter,
                                   quantity=Decimal(quantity), window_start=start,
                                   window_end=start + timedelta(hours=1))
    browser = signed_in(root_token)
    page = text(browser, "/console/usage")
    assert page.count("<rect ") == 2
    assert f"{day.date().isoformat()}: 4.0 GPU-hours" in page
    assert "<td>root</td>" in page  # the root tenant's report: by tenant too
    chart = gpu_hours_chart([{"meter": "vcpu.hours", "quantity": "9",
                              "day": day.date().isoformat()}])
    assert chart["bars"] == []
    answer = browser.get("/console/usage.csv", {"from": (day - timedelta(days=3)).date(),
                                                "to": (day + timedelta(days=1)).date(),
                                                "groupBy": ["meter", "day"]})
    assert answer["Content-Type"] == "text/csv"
    assert answer.content.decode().splitlines() == [
        "meter,day,quantity", f"{meter},{(day - timedelta(days=1)).date()},8.000000",
        f"{meter},{day.date()},4.000000"]


def test_sandboxes_and_checkpoints_have_their_pages(root, root_token, pool):
    make_node(pool["id"])
    sandbox = root("sandboxes.create", poolId=pool["id"], vcpus=2, memoryGiB=4)
    root("audit.checkpoint")
    browser = signed_in(root_token)
    page = text(browser, "/console/sandboxes")
    assert f'id="{sandbox["id"]}"' in page
    assert 'data-action="sandboxes.release"' in page
    assert f'href="/console/sandboxes/{sandbox["id"]}"' in page
    one = text(browser, f"/console/sandboxes/{sandbox['id']}")
    assert '<dd class="state" id="state">placed' in one
    assert "2 vCPUs, 4 GiB" in one
    assert '<dd id="network">none' in one
    assert 'data-action="sandboxes.release"' in one
    assert 'data-action="sandboxes.pause"' not in one  # only a running one can be paused
    assert "No console: the sandbox is placed." in one
    node_page = text(browser, f"/console/nodes/{sandbox['nodeId']}")  # where it runs
    assert f'<tr id="{sandbox["id"]}">' in node_page
    root("sandboxes.release", sandboxId=sandbox["id"])  # stopping: still holds the node
    assert f'<tr id="{sandbox["id"]}">' in text(browser, f"/console/nodes/{sandbox['nodeId']}")
    audit_page = text(browser, "/console/audit")
    (checkpoint,) = root("audit.checkpoints")["items"]
    assert checkpoint["rootHash"] in audit_page


def test_recurring_reservations_show_their_occurrences_and_can_be_ended(root, root_token, pool):
    make_node(pool["id"])
    series = root("series.create", poolId=pool["id"], devices=[{"class": "gpu", "count": 2}],
                  every="weekdays 09:00-10:00", until="2027-01-08", horizonDays=366,
                  **{"from": "2027-01-04"})
    browser = signed_in(root_token)
    page = text(browser, "/console/reservations")
    assert f'<tr id="{series["id"]}"' in page
    assert "weekdays 09:00-10:00 (UTC)" in page
    assert "placed 5" in page
    assert f'name="seriesId" value="{series["id"]}"' in page
    assert 'data-action="capacity.earliest"' in page
    assert 'name="atEarliest"' in page
    root("series.release", seriesId=series["id"])
    ended = text(browser, "/console/reservations")
    assert "cancelled 5" in ended
    assert f'name="seriesId" value="{series["id"]}"' not in ended


def test_mig_instances_idle_flags_and_offering_limits_show(root, root_token, pool, acme):
    make_node(pool["id"], mig={0: ["1g.10gb"] * 7})
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 2, "mig": 3},
         limits={"idleReclaim": {"belowPercent": 5, "forMinutes": 30, "release": True}})
    rsv = root("reservations.create", poolId=pool["id"], duration=3_600_000,
               devices=[{"class": "mig", "profile": "1g.10gb", "count": 2}])
    browser = signed_in(root_token)
    pools_page = text(browser, "/console/pools")
    assert "<th>MIG 1g.10gb</th><td>7</td>" in pools_page
    assert "<td>5</td></tr>" in pools_page  # two of seven booked now
    offered = pools_page[pools_page.index("<h3>Offerings</h3>"):]
    assert "idle under 5.0% for 30.0 min is released after 10 min" in offered, offered[:600]
    page = text(browser, f"/console/reservations/{rsv['id']}")
    assert "2 MIG 1g.10gb instances" in page
    assert "Idle since" not in page
    reservation = Reservation.objects.get(pk=rsv["id"])
    reservation.idle_since = timezone.now()  # what reservation_idle_check writes
    reservation.save(update_fields=["idle_since"])
    assert "Idle since" in text(browser, f"/console/reservations/{rsv['id']}")
    form = text(browser, "/console/reservations")
    assert '<option value="gpu-share">GPU shares</option>' in form


def test_the_pending_queue_and_each_tenants_fair_share_show(root, root_token, pool, acme):
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8}, share=3)
    make_node(pool["id"])
    reserve(root, pool, 8)
    waiting = reserve(acme, pool, 8).result
    first = reserve(root, pool, 8, priorityClass="high").result
    owner = text(signed_in(root_token), "/console/reservations")
    queue = owner[owner.index('id="queue"'):owner.index("<h2>Recurring")]
    assert queue.index(f'id="queue-{first["id"]}"') < queue.index(f'id="queue-{waiting["id"]}"')
    assert '<td class="why">1 ahead (1 of a higher priority); ' in queue
    pools = text(signed_in(root_token), "/console/pools")
    assert "<h3>Fair share</h3>" in pools
    assert "<td>acme</td><td>3</td><td>0.75</td>" in pools  # 3 of the owner's 1 and acme's 3
    member = text(signed_in(acme("tokens.create", name="m", role="member")["token"]),
                  "/console/reservations")
    mine = member[member.index('id="queue"'):member.index("<h2>Recurring")]
    assert f'id="queue-{waiting["id"]}"' in mine
    assert first["id"] not in mine  # another tenant's request: its place counts, its id hides


def test_the_queue_shows_planned_starts(root, root_token):
    from reservations.reconcilers import reconcile_pool

    site = root("sites.create", kind="shared", region="eu-1")
    pool = root("pools.create", siteId=site["id"], gpuModel="H100", **{"class": "metal-host"},
                policy={**POLICY, "sharing": {"planStarts": True}})
    make_node(pool["id"])
    reserve(root, pool, 6, duration=2 * 3_600_000)
    big = reserve(root, pool, 8).result
    reconcile_pool(pool["id"])
    page = text(signed_in(root_token), "/console/reservations")
    queue = page[page.index('id="queue"'):page.index("<h2>Recurring")]
    row = queue[queue.index(f'id="queue-{big["id"]}"'):]
    assert '<td class="position">1</td>' in row
    planned = row[row.index('<td class="planned">') + len('<td class="planned">'):]
    assert planned[:2] == "20", planned[:40]  # a time, in the planned-start column
    assert "planned to start at" in row


def test_the_webhooks_page_subscribes_shows_deliveries_and_sends_a_dead_one_again(
        root_token, settings):
    from compute.platform.webhooks.reconcilers import sweep
    from tests.support.receiver import receiving
    from tests.support.work import run_due_work

    settings.BC_WEBHOOK_ALLOW = "127.0.0.1/32"
    browser = signed_in(root_token)
    with receiving() as receiver:
        made = envelope(browser, "webhooks.create", {"url": receiver.url, "types": "site.*",
                                                     "maxAttempts": 1})
        assert made.status_code == 200, made.content
        hook = made.json()["result"]
        receiver.status = 500
        assert envelope(browser, "sites.create", {"kind": "shared", "region": "eu-7"}
                        ).status_code == 200
        sweep()
        run_due_work()
        page = text(browser, "/console/webhooks")
        assert f'id="{hook["id"]}"' in page
        assert receiver.url in page
        assert 'class="dead"' in page
        assert "answered 500" in page
        assert 'data-action="webhooks.replay"' in page
        assert hook["secret"] not in page  # shown once, in the answer to the form only
        [dead] = envelope(browser, "webhooks.deliveries",
                          {"webhookId": hook["id"]}).json()["result"]["items"]
        assert dead["state"] == "dead"
        receiver.status = 200
        replayed = envelope(browser, "webhooks.replay", {"webhookId": hook["id"],
                                                         "deliveryId": dead["id"]})
        assert replayed.json()["result"] == {"replayed": 1}
        sweep()
        run_due_work()
        assert [m["type"] for m in receiver.messages()] == ["site.created"]
        assert 'class="delivered"' in text(browser, "/console/webhooks")
