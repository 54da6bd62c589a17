from django.contrib import admin
from django.urls import path

from compute.api.envelope import EnvelopeView
from compute.api.openapi import openapi_view
from compute.downloads import download_view
from compute.wellknown import wellknown_view
from fleet.views import join_view, renew_view

urlpatterns = [
    path(".well-known/better-compute", wellknown_view, name="wellknown"),
    path("api/agent/join", join_view, name="agent-join"),
    path("api/agent/renew", renew_view, name="agent-renew"),
    path("downloads/<str:name>", download_view, name="download"),
    path("api/compute/openapi.json", openapi_view, name="openapi"),
    path("api/compute/<str:group>/<str:method>", EnvelopeView.as_view(), name="envelope"),
    path("admin/", admin.site.urls),
]
