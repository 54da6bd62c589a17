from django.core.wsgi import get_wsgi_application

from compute import config

config.export_default("DJANGO_SETTINGS_MODULE", "compute.settings")
application = get_wsgi_application()
