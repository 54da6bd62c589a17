import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "compute.settings")
django_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (after Django setup)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path, re_path  # noqa: E402

from compute.http.watch import events_watch  # noqa: E402

application = ProtocolTypeRouter({
    "http": URLRouter([
        # The console watches with its session cookie: sessions and users are read for it.
        path("api/compute/events/watch", AuthMiddlewareStack(events_watch)),
        re_path(r"", django_app),
    ]),
})
