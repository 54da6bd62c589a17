"""Test harness: one real embedded Postgres per session, a clean transaction per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from compute.core import pg
from compute.core.dburl import parse_database_url

# Tests start subprocesses (pg_ctl, dev, agents) while in-process gRPC servers run: gRPC's
# fork handlers must not run in those children, which exec at once.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")


@pytest.fixture(scope="session")
def embedded_postgres() -> Iterator[pg.EmbeddedPostgres | None]:
    """A throw-away server for the session, unless DATABASE_URL names a real one."""
    if os.environ.get("DATABASE_URL"):
        yield None
        return
    from tests.support.pg_guard import guard

    server = pg.throwaway().start()
    guarded = guard(server)  # stops it should this process die before the end below
    yield server
    server.stop()
    guarded.communicate(timeout=30)  # end of file: the guard finds it stopped already


@pytest.fixture(scope="session")
def django_db_keepdb(request: pytest.FixtureRequest,
                     embedded_postgres: pg.EmbeddedPostgres | None) -> bool:
    """A throw-away server goes with its databases: dropping the test database first would
    only race the connections of processes a test started (and warn of them)."""
    return embedded_postgres is not None or bool(request.config.getvalue("reuse_db"))


@pytest.fixture(scope="session")
def django_db_modify_db_settings(embedded_postgres: pg.EmbeddedPostgres | None,
                                 django_db_modify_db_settings_parallel_suffix: None) -> None:
    if embedded_postgres is None:
        return
    from django.conf import settings
    from django.db import connections

    fresh = parse_database_url(embedded_postgres.url)
    settings.DATABASES["default"].update(fresh)
    connections["default"].settings_dict.update(fresh)


POLICY = {"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 8},
          "hostShare": {"vcpusPerGpu": 12, "memoryGiBPerGpu": 96}}


@pytest.fixture(scope="session", autouse=True)
def results_match_their_schemas() -> Iterator[None]:
    """The OpenAPI document's result schemas are checked against every answer of the run."""
    from tests.support.shapes import checking_results

    with checking_results() as mismatches:
        yield
    assert not mismatches, "results that differ from their schema:\n" + "\n".join(
        sorted(set(mismatches)))


@pytest.fixture
def api(client: Any) -> Any:
    from tests.support.client import ApiClient

    return ApiClient(client)


@pytest.fixture
def root_token(db: None) -> str:
    from compute.platform.tenancy.services import root_bootstrap

    return root_bootstrap().plaintext


@pytest.fixture
def root(api: Any, root_token: str) -> Any:
    """The API as the root administrator."""
    return api.as_token(root_token)


@pytest.fixture
def acme(root: Any) -> Any:
    """A customer tenant `acme` and the API as its administrator."""
    return root.new_tenant("acme")


@pytest.fixture
def globex(root: Any) -> Any:
    return root.new_tenant("globex")


@pytest.fixture
def pool(root):
    from tests.factories import with_default_image

    site = root("sites.create", kind="shared", region="eu-1")
    return with_default_image(root, root("pools.create", siteId=site["id"], gpuModel="H100",
                                         policy=POLICY, **{"class": "metal-host"}))


@pytest.fixture
def cpu_pool(root):
    from tests.factories import with_default_image

    site = root("sites.create", kind="shared", region="eu-1", idempotencyKey="site")
    return with_default_image(root, root("pools.create", siteId=site["id"],
                                         policy={"sandboxes": {"network": "outbound"}},
                                         **{"class": "cpu-host"}))


@pytest.fixture(autouse=True)
def no_address_throttled_before() -> None:
    """Every test's calls come from 127.0.0.1: one test's bad tokens do not throttle the
    next test's calls."""
    from compute.platform.iam.refusals import _THROTTLED

    _THROTTLED.clear()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup`, tests that share something costly run on one worker: a
    module's tests when they share a module- or class-scoped fixture (a `dev` stack, say),
    and every test of the agent's built artifacts (PyInstaller runs once). The rest are
    shared out one by one."""
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        if fixtures is None:
            continue
        used = fixtures.name2fixturedefs
        if "agent_artifacts" in used:
            item.add_marker(pytest.mark.xdist_group("agent-artifacts"))
            # whichever runs first builds them: PyInstaller takes minutes on busy cores
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(900))
        elif any(d.scope in ("module", "class", "package") and d.baseid.startswith("tests")
                 for defs in used.values() for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: two workers per core. Half of a worker's time is spent waiting (on the
    processes an end-to-end test starts, guests that boot, timeouts that must pass), and a
    second worker per core fills it."""
    return 2 * len(os.sched_getaffinity(0))
