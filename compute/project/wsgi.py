from django.core.wsgi import get_wsgi_application

from compute.core import config

config.export_default("DJANGO_SETTINGS_MODULE", "compute.project.settings")
application = get_wsgi_application()
