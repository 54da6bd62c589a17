"""`@audited` at run time: every path that writes leaves exactly one audit row, or says why
none is due; a second row, a row outside a service and a write without its row are refused,
and what the refused service wrote is rolled back."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from audit.services import AuditDiscipline, audit_exempt, audit_record, audited
from fleet.models import Site


@pytest.fixture
def tenant_id(root) -> str:
    return root("system.whoami")["tenantId"]


@audited
def site_write(*, tenant_id: str, audit: int = 1, exempt: str = "") -> Site:
    site = Site.objects.create(tenant_id=tenant_id, kind="shared", region="r-1")
    if exempt:
        audit_exempt(exempt)
    for _ in range(audit):
        audit_record(tenant_id=tenant_id, actor_id="t", action="site.create", target=site.id)
    return site


@audited
def site_touch(*, tenant_id: str, region: str) -> int:
    """Locks the tenant's sites, then updates those in `region` (perhaps none)."""
    list(Site.objects.select_for_update().filter(tenant_id=tenant_id))
    return Site.objects.filter(tenant_id=tenant_id, region=region).update(name="touched")


def written(tenant_id: str) -> tuple[int, int]:
    return (Site.objects.filter(tenant_id=tenant_id).count(),
            AuditEvent.objects.filter(tenant_id=tenant_id, action="site.create").count())


def test_a_write_with_its_one_audit_row_commits(tenant_id):
    site_write(tenant_id=tenant_id)
    assert written(tenant_id) == (1, 1)


def test_a_write_without_its_audit_row_is_refused_and_rolled_back(tenant_id):
    with pytest.raises(AuditDiscipline, match="site_write wrote fleet_site without its "
                                              "audit row"):
        site_write(tenant_id=tenant_id, audit=0)
    assert written(tenant_id) == (0, 0)


def test_a_second_audit_row_is_refused_and_rolled_back(tenant_id):
    with pytest.raises(AuditDiscipline, match=r"already wrote site\.create"):
        site_write(tenant_id=tenant_id, audit=2)
    assert written(tenant_id) == (0, 0)


def test_a_path_that_says_why_writes_without_a_row_and_cannot_add_one(tenant_id):
    site_write(tenant_id=tenant_id, audit=0, exempt="a test's bookkeeping")
    assert written(tenant_id) == (1, 0)
    with pytest.raises(AuditDiscipline, match="already wrote exempt: a test's bookkeeping"):
        site_write(tenant_id=tenant_id, audit=1, exempt="a test's bookkeeping")
    assert written(tenant_id) == (1, 0)


def test_locks_and_writes_that_touch_no_row_need_no_audit_row(tenant_id):
    site_write(tenant_id=tenant_id)
    assert site_touch(tenant_id=tenant_id, region="elsewhere") == 0
    with pytest.raises(AuditDiscipline, match="site_touch wrote fleet_site"):
        site_touch(tenant_id=tenant_id, region="r-1")
    assert Site.objects.get(tenant_id=tenant_id).name != "touched"


def test_an_audit_row_outside_a_service_is_refused(tenant_id):
    with pytest.raises(AuditDiscipline, match="written by @audited services only"):
        audit_record(tenant_id=tenant_id, actor_id="t", action="site.create")
    with pytest.raises(AuditDiscipline, match="only an @audited service may be exempted"):
        audit_exempt("no service")
