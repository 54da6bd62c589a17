import django

from compute.core import config

config.export_default("DJANGO_SETTINGS_MODULE", "compute.project.settings")
django.setup(set_prefix=False)

from compute.http.threads import ThreadPoolHandler  # noqa: E402  (after Django setup)

# Threads per process that run synchronous views, each with its own database connection.
# One by default: a second thread in a process only adds switching between them (the GIL)
# and a Postgres backend; more processes (`serve --workers`) are the way to add room.
django_app = ThreadPoolHandler(threads=config.whole("BETTER_COMPUTE_API_THREADS"))

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
