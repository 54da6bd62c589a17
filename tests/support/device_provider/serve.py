"""Run the provider: migrate its SQLite file, make its client and user, serve on a port.

    python -m tests.support.device_provider.serve PORT CLIENT_ID USER PASSWORD GROUP
"""

import os
import sys


def main() -> None:
    port, client_id, username, password, group = sys.argv[1:6]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.device_provider.settings")
    import django

    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from oauth2_provider.models import Application

    call_command("migrate", verbosity=0)
    user = User.objects.create_user(username, email=f"{username}@example.com",
                                    password=password)
    user.groups.add(Group.objects.create(name=group))
    Application.objects.create(
        client_id=client_id, name="better-compute CLI", user=None,
        client_type=Application.CLIENT_PUBLIC,
        authorization_grant_type=Application.GRANT_DEVICE_CODE, algorithm="RS256")
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from django.core.wsgi import get_wsgi_application

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    make_server("127.0.0.1", int(port), get_wsgi_application(),
                handler_class=Quiet).serve_forever()


if __name__ == "__main__":
    main()
