"""The console's routes, under /console/."""

from django.urls import path

from compute.http.console import pages, session, sso

urlpatterns = [
    path("", pages.board, name="console"),
    path("board", pages.board_tiles, name="console-board"),
    path("sign-in", session.sign_in, name="console-sign-in"),
    path("sign-in/oidc", sso.oidc_start, name="console-sign-in-oidc"),
    path("sign-in/oidc/callback", sso.oidc_callback, name="console-sign-in-oidc-callback"),
    path("sign-out", session.sign_out, name="console-sign-out"),
    path("pools", pages.pools, name="console-pools"),
    path("pools/<str:pool_id>", pages.pool, name="console-pool"),
    path("pools/<str:pool_id>/calendar", pages.pool_calendar, name="console-pool-calendar"),
    path("reservations", pages.reservations, name="console-reservations"),
    path("reservations/<str:reservation_id>", pages.reservation, name="console-reservation"),
    path("sandboxes", pages.sandboxes, name="console-sandboxes"),
    path("sandboxes/<str:sandbox_id>", pages.sandbox, name="console-sandbox"),
    path("nodes", pages.nodes, name="console-nodes"),
    path("nodes/<str:node_id>", pages.node, name="console-node"),
    path("join-tokens", pages.join_tokens, name="console-join-tokens"),
    path("tenants", pages.tenants, name="console-tenants"),
    path("audit", pages.audit, name="console-audit"),
    path("audit/<str:event_id>/proof", pages.audit_proof, name="console-audit-proof"),
    path("usage", pages.usage, name="console-usage"),
    path("webhooks", pages.webhooks, name="console-webhooks"),
    path("usage.csv", pages.usage_csv, name="console-usage-csv"),
]
