"""The console's fleet board: sign in with a token, see the tenant's own nodes and totals;
a revoked token signs the browser out; another tenant sees none of it."""

from __future__ import annotations

from django.test import Client

from compute.platform.tenancy.models import ApiToken
from tests.factories import make_node
from tests.reservations.conftest import reserve


def signed_in(token: str) -> Client:
    browser = Client()
    response = browser.post("/console/sign-in", {"token": token})
    assert (response.status_code, response["Location"]) == (302, "/console/")
    return browser


def test_the_board_shows_nodes_held_gpus_and_a_zero_overlap_check(root, root_token, pool):
    node = make_node(pool["id"])
    assert reserve(root, pool, 4).result["state"] == "binding"
    page = signed_in(root_token).get("/console/").content.decode()
    assert node.hostname in page
    assert 'id="gpus">4/8<' in page  # booked for a window that holds now
    assert 'id="overlaps">0<' in page
    assert 'id="pending">0<' in page


def test_the_session_keeps_the_token_id_never_its_secret(root_token):
    browser = signed_in(root_token)
    session = browser.session
    stored = list(session.values())
    assert root_token.split(".")[1] not in str(stored)
    assert stored == [root_token.removeprefix("biam_").split(".")[0]]


def test_a_bad_token_is_refused_on_the_form_and_no_session_is_made(db):
    browser = Client()
    response = browser.post("/console/sign-in", {"token": "biam_tok_nothing.secret"})
    assert response.status_code == 401
    assert "invalid API token" in response.content.decode()
    assert browser.get("/console/")["Location"] == "/console/sign-in"


def test_revoking_the_token_signs_the_browser_out(root, root_token):
    minted = root("tokens.create", name="ops", role="viewer")
    browser = signed_in(minted["token"])
    assert browser.get("/console/").status_code == 200
    root("tokens.revoke", tokenId=minted["id"])
    assert browser.get("/console/")["Location"] == "/console/sign-in"
    assert ApiToken.objects.get(pk=minted["id"]).revoked_at is not None


def test_a_tenant_sees_only_its_own_fleet(root_token, pool, acme):
    node = make_node(pool["id"])  # root's pool
    token = acme("tokens.create", name="ops", role="admin")["token"]
    page = signed_in(token).get("/console/").content.decode()
    assert node.hostname not in page
    assert "No nodes yet" in page
    assert signed_in(root_token).get("/console/").content.decode().count(f'id="{node.id}"') == 1


def test_sign_out_needs_a_post_with_the_csrf_token(root_token):
    browser = Client(enforce_csrf_checks=True)
    browser.post("/console/sign-in", {"token": root_token})  # no CSRF token: refused
    assert browser.get("/console/")["Location"] == "/console/sign-in"


def test_the_overlap_count_is_a_real_check_of_the_bookings(root, root_token, pool):
    """With the EXCLUDE constraint gone (inside this test's transaction), a double booking
    gets in, and the board's Overlaps must say so."""
    from django.db import connection

    from reservations.constraints import BOOKING_NO_OVERLAP

    make_node(pool["id"])
    reserve(root, pool, 2)
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no pending checks before ALTER
        cursor.execute(f"ALTER TABLE reservations_booking DROP CONSTRAINT {BOOKING_NO_OVERLAP}")
        cursor.execute("INSERT INTO reservations_booking (allocation_id, device_id, during) "
                       "SELECT allocation_id, device_id, during FROM reservations_booking "
                       "LIMIT 1")
    page = signed_in(root_token).get("/console/").content.decode()
    assert 'id="overlaps" class="bad">1<' in page
