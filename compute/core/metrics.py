"""The process's Prometheus series (prometheus-client's default registry). Each process
(API, gateway, worker) exposes its own: the API at `/metrics`, the others on a port of their
own. Series read from the database (pending reservations, the work queue) are collected at
scrape time by the API only (compute.http.metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS = (.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)

API_REQUESTS = Counter("bc_api_requests", "Envelope calls answered, by method and HTTP status.",
                       ["method", "status"])
API_SECONDS = Histogram("bc_api_request_seconds", "Envelope call latency, by method.",
                        ["method"], buckets=LATENCY_BUCKETS)
CONFLICTS = Counter("bc_ledger_conflicts",
                    "Writes the ledger's constraints refused, by the constraint.", ["constraint"])
RETRIES = Counter("bc_transaction_retries",
                  "Transactions retried after a serialization failure or deadlock.")
BIND_SECONDS = Histogram("bc_bind_seconds",
                         "From placement to the node's signed AllocationBound (placed -> active).",
                         buckets=(.1, .25, .5, 1, 2, 5, 10, 30, 60, 120, 300))
SESSIONS = Gauge("bc_gateway_sessions", "Node sessions open on this gateway.")
HEARTBEAT_LAG = Histogram("bc_heartbeat_lag_seconds",
                          "From a node sending a heartbeat to this gateway reading it.",
                          buckets=(.01, .05, .1, .25, .5, 1, 2, 5, 10, 30))
REPORT_DUPLICATES = Counter("bc_report_duplicates",
                            "Reports a node sent again that were acknowledged, not reapplied.")
TELEMETRY_SUPERSEDED = Counter(
    "bc_telemetry_superseded",
    "GPU readings dropped unapplied because a newer reading of the same node waited too.")
WEBHOOK_ATTEMPTS = Counter("bc_webhook_attempts",
                           "Webhook deliveries this worker attempted, by outcome (delivered, "
                           "failed, dead).", ["outcome"])
WORK_DONE = Counter("bc_work_items", "Work items this worker finished, by kind and outcome.",
                    ["kind", "outcome"])


def serve_metrics(listen: str) -> None:
    """Serve this process's series at http://HOST:PORT/metrics (a thread of its own)."""
    host, _, port = listen.rpartition(":")
    start_http_server(int(port), addr=host or "127.0.0.1")
