"""Every HTTP route of the control plane (the watch stream is routed in compute.project.asgi)."""

from django.contrib import admin
from django.urls import include, path

from compute.http.agent import join_view, renew_view
from compute.http.downloads import download_view
from compute.http.envelope import EnvelopeView
from compute.http.metrics import healthz_view, metrics_view, readyz_view
from compute.http.openapi import openapi_view
from compute.http.wellknown import wellknown_view

urlpatterns = [
    path(".well-known/better-compute", wellknown_view, name="wellknown"),
    path("api/agent/join", join_view, name="agent-join"),
    path("api/agent/renew", renew_view, name="agent-renew"),
    path("downloads/<str:name>", download_view, name="download"),
    path("api/compute/openapi.json", openapi_view, name="openapi"),
    path("metrics", metrics_view, name="metrics"),
    path("healthz", healthz_view, name="healthz"),
    path("readyz", readyz_view, name="readyz"),
    path("api/compute/<str:group>/<str:method>", EnvelopeView.as_view(), name="envelope"),
    path("console/", include("compute.http.console.urls")),
    path("admin/", admin.site.urls),
]
