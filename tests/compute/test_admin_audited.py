"""The Django admin cannot bypass the audit trail: no model whose writes are audited can be
added, changed or deleted from it, and its actions run the services after an IAM decision,
writing the same audit row and event as the API."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.test import Client, RequestFactory
from django.urls import reverse

from audit.models import AuditEvent
from compute.platform.tenancy.services import user_create
from fleet.models import Node
from tests.factories import make_node
from tests.reservations.conftest import reserve
from tests.support.writes import recorded

PASSWORD = "a long admin passphrase"


def staff(role: str = "admin", name: str = "ops") -> Client:
    user_create(tenant_slug="root", username=name, password=PASSWORD, role=role, staff=True)
    browser = Client()
    assert browser.login(username=name, password=PASSWORD)
    return browser


def test_no_admin_page_can_add_change_or_delete_a_row(root, pool):
    node = make_node(pool["id"])
    reserve(root, pool, 2)
    browser = staff()
    request = RequestFactory().get("/admin/")
    request.user = get_user_model().objects.get(username="ops")
    # Django's own users and groups are sign-in accounts, not control-plane state: what a
    # user may do comes from its principal's role binding, read-only here like the rest.
    registered = {model: model_admin for model, model_admin in admin.site._registry.items()
                  if model._meta.app_label != "auth"}
    assert len(registered) >= 25
    for model, model_admin in registered.items():
        name = f"{model._meta.app_label}.{model._meta.model_name}"
        assert not model_admin.has_add_permission(request), name
        assert not model_admin.has_change_permission(request), name
        assert not model_admin.has_delete_permission(request), name
        for inline in model_admin.get_inline_instances(request):
            assert not inline.has_change_permission(request), name
        info = model._meta.app_label, model._meta.model_name
        assert browser.get(reverse("admin:{}_{}_add".format(*info))).status_code == 403, name
        row = model.objects.first()
        if row is not None:
            url = reverse("admin:{}_{}_change".format(*info), args=[row.pk])
            assert browser.get(url).status_code == 200, name  # view only
            assert browser.post(url, {}).status_code == 403, name
            delete = reverse("admin:{}_{}_delete".format(*info), args=[row.pk])
            assert browser.post(delete, {"post": "yes"}).status_code == 403, name
    node.refresh_from_db()
    assert Node.objects.filter(pk=node.pk).exists()
    assert not node.cordoned


def test_an_admin_action_runs_the_service_and_writes_its_audit_row(root, pool):
    node = make_node(pool["id"])
    browser = staff()
    with recorded() as written:
        answer = browser.post(reverse("admin:fleet_node_changelist"),
                              {"action": "nodes_cordon", "_selected_action": [node.id]})
    assert answer.status_code == 302
    node.refresh_from_db()
    assert node.cordoned
    assert written.audit == ["node.cordon"]
    assert written.events == ["node.cordoned"]
    row = AuditEvent.objects.filter(action="node.cordon").get()
    assert row.origin == "admin"
    assert row.decision_id


def test_an_admin_action_refused_by_iam_is_audited_and_changes_nothing(root, pool):
    node = make_node(pool["id"])
    browser = staff(role="viewer", name="looker")
    with recorded() as written:
        browser.post(reverse("admin:fleet_node_changelist"),
                     {"action": "nodes_cordon", "_selected_action": [node.id]})
    node.refresh_from_db()
    assert not node.cordoned
    assert written.audit == ["!nodes.cordon"]
    assert written.events == []


@pytest.mark.parametrize(("action", "changelist"), [("reservations_release",
                                                "admin:reservations_reservation_changelist")])
def test_releasing_from_the_admin_is_the_release_service(root, pool, action, changelist):
    make_node(pool["id"])
    rsv = reserve(root, pool, 1).result
    browser = staff()
    with recorded() as written:
        browser.post(reverse(changelist), {"action": action, "_selected_action": [rsv["id"]]})
    assert root("reservations.get", reservationId=rsv["id"])["state"] in {"released",
                                                                          "cancelled"}
    assert written.audit == ["reservation.release"]
