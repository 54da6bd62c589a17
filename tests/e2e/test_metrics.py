"""What an operator watches and plugs in, on `dev --sim 8` under a short workload: `/metrics`
scraped twice, per pool and tenant series that move with the ledger, the agents' GPU telemetry
under dcgm-exporter's names, a Grafana dashboard whose every query reads a series served, and
a webhook whose receiver was down for a while getting every event in order from the stack's
own workers."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.e2e.test_idle_reclaim import set_load
from tests.e2e.test_tutorial_cli import booked_uuids
from tests.support.receiver import Receiver, receiving
from tests.support.waiting import wait_until

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "better-compute.json"
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(stack: Stack) -> tuple[Series, set[str]]:
    """Every sample, and the names of the families served (with or without samples)."""
    url = stack.env["BETTER_COMPUTE_URL"].removesuffix("/api/compute") + "/metrics"
    with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310
        text = answer.read().decode()
    families = list(text_string_to_metric_families(text))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in families for s in family.samples}
    return samples, {family.name for family in families}


def total(samples: Series, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    return sum(v for (n, found), v in samples.items()
               if n == name and set(labels.items()) <= set(found))


def series_named(expression: str) -> set[str]:
    """The metric names a PromQL expression reads."""
    text = re.sub(r'"[^"]*"', "", expression)  # strings
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)  # matchers and ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", text)
    return {name for name in names if not re.fullmatch(r"\d.*|and|or|unless|bool|offset", name)}


def served(name: str, families: set[str]) -> bool:
    suffixes = ("", "_total", "_bucket", "_sum", "_count", "_created")
    return any(name == family + suffix for family in families for suffix in suffixes)


def test_the_series_an_operator_watches_move_under_a_workload(tmp_path):
    stack = start_stack(tmp_path, "--sim", "8", env_extra={
        "BCD_TELEMETRY_SECONDS": "1", "BETTER_COMPUTE_WEBHOOK_ALLOW": "127.0.0.1/32"})
    try:
        with receiving() as receiver:
            watch_and_book(stack, receiver)
    finally:
        assert stop_stack(stack) == 0


def watch_and_book(stack: Stack, receiver: Receiver) -> None:
    pool = stack.env["POOL"]
    stack.ok("tenants", "create", "--slug", "acme")
    stack.ok("pools", "offer", pool, "--to", "acme", "--quota", "gpu=16")
    member = stack.ok("tokens", "create", "--name", "ml", "--role", "member", "--tenant",
                      "acme", "--query", "token")
    acme = {**stack.env, "BETTER_COMPUTE_TOKEN": member, "BETTER_COMPUTE_TENANT": "acme"}
    admin = stack.ok("tokens", "create", "--name", "hooks", "--role", "admin", "--tenant",
                     "acme", "--query", "token")
    hooks = {**acme, "BETTER_COMPUTE_TOKEN": admin}
    hook = stack.json("webhooks", "create", "--url", receiver.url, "--types", "reservation.*",
                      env=hooks)
    receiver.status = 503  # down while the first bookings happen

    def reporting(samples: Series) -> int:
        return len([labels for name, labels in samples if name == "DCGM_FI_DEV_GPU_UTIL"
                    and ("simulated", "true") in labels])

    assert wait_until(lambda: reporting(scrape(stack)[0]) == 64, timeout=60)
    before, _ = scrape(stack)
    gpus = total(before, "bc_pool_gpus", pool=pool, state="total")
    assert (gpus, total(before, "bc_pool_gpus", pool=pool, state="allocated")) == (64, 0)
    assert total(before, "bc_pool_nodes", pool=pool, simulated="true") == 8

    kept = stack.json("reserve", "--pool", pool, "--gpus", "4", "--for", "1h", env=acme)
    ended = stack.json("reserve", "--pool", pool, "--gpus", "2", "--for", "1h", env=acme)
    assert (kept["state"], ended["state"]) == ("active", "active")
    # The webhook's first attempts met a receiver that was down; it is up again at once (so
    # the next attempt, backed off 1, 2, 4 … s, is soon).
    assert wait_until(lambda: any(d["lastStatus"] == 503 for d in stack.json(
        "webhooks", "deliveries", hook["id"], env=hooks)["items"]), timeout=30)
    receiver.status = 200
    set_load(stack, kept, 77)
    assert stack.cli("release", ended["id"], env=acme).returncode == 0
    uuids = set(booked_uuids(stack, kept["id"]))

    def busy(samples: Series) -> list[float]:
        return [v for (n, labels), v in samples.items() if n == "DCGM_FI_DEV_GPU_UTIL"
                and dict(labels)["UUID"] in uuids]

    assert wait_until(lambda: busy(scrape(stack)[0]) == [77.0] * 4, timeout=30)
    after, families = scrape(stack)
    assert total(after, "bc_pool_gpus", pool=pool, state="allocated") == 4
    assert total(after, "bc_pool_gpus", pool=pool, state="available") == 60
    assert total(after, "bc_tenant_atoms_allocated", pool=pool, tenant="acme") == 4
    assert total(after, "bc_usage_rate", tenant="acme", meter="gpu.H100.hours") == 4
    assert total(after, "bc_usage_metered_total", tenant="acme") > 0  # the released one
    assert total(after, "bc_usage_metered_total", tenant="acme") > total(
        before, "bc_usage_metered_total", tenant="acme")

    # Every reservation event reached the receiver, in order, each once.
    events = stack.json("events", "list", "--types", "reservation.*", env=acme)["items"]
    assert len(events) >= 6  # two bookings' pending, placed, binding, active; a release

    def received() -> list[int]:
        return [m["data"]["seq"] for m in receiver.messages()]

    assert wait_until(lambda: received()[:len(events)] == [e["seq"] for e in events],
                      timeout=60), (received(), [e["seq"] for e in events])
    assert len(set(received())) == len(received())
    delivered, _ = scrape(stack)
    assert total(delivered, "bc_webhook_deliveries", tenant="acme",
                 state="delivered") >= len(events)

    queries = [target["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"]
               for target in panel["targets"]]
    assert len(queries) >= 20
    unknown = {name for query in queries for name in series_named(query)
               if not served(name, families)}
    assert unknown == set()


def test_the_promql_reader_finds_metric_names_not_labels_or_functions():
    expression = ('histogram_quantile(0.99, sum by (le, method) (rate(bc_api_request_seconds_'
                  'bucket{pool=~"$pool"}[5m]))) + on(pool) group_left(name) bc_pool_info / 2^30')
    assert series_named(expression) == {"bc_api_request_seconds_bucket", "bc_pool_info"}
    assert not served("bc_pool_gpus_total", {"bc_pool"})
    assert served("bc_preemptions_total", {"bc_preemptions"})
