"""Django settings. Every knob is an environment variable; none needs to be set.

`DATABASE_URL` selects a Postgres server. Without it the persistent embedded server is
used; the entry points (`manage.py`, `better-compute`) start it before settings load.
"""

from __future__ import annotations

import os
from pathlib import Path

from compute import pg
from compute.dburl import parse_database_url

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value.lower() in {"1", "true", "yes", "on"}


DEBUG = _env_bool("BC_DEBUG", False)
SECRET_KEY = os.environ.get("BC_SECRET_KEY") or pg.local_secret("django-secret-key")
ALLOWED_HOSTS = [h for h in os.environ.get("BC_ALLOWED_HOSTS", "*").split(",") if h]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "django_q",
    "compute.apps.ComputeConfig",
    "audit.apps.AuditConfig",
    "fleet.apps.FleetConfig",
    "reservations.apps.ReservationsConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "compute.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
WSGI_APPLICATION = "compute.wsgi.application"

DATABASES = {
    "default": parse_database_url(os.environ.get("DATABASE_URL") or pg.persistent().url),
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(os.environ.get("BC_STATIC_ROOT", pg.state_root() / "static"))

REST_FRAMEWORK = {
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
}

# The IAM that decides every API call. Any class with `decide(...)` (compute.iam.Authorizer)
# can replace the embedded one, e.g. a client of an external IAM service.
BC_IAM_BACKEND = os.environ.get("BC_IAM_BACKEND", "compute.iam.embedded.EmbeddedIAM")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("BC_LOG_LEVEL", "INFO")},
}

# django-q2 runs the periodic jobs (compute/schedules.py) on the Postgres ORM broker:
# `python manage.py qcluster`. The sub-second reconcilers run on the sharded work queue
# (`python manage.py bc_worker --loop`), whose leases django-q2's scheduler cannot express.
Q_CLUSTER = {
    "name": "better-compute",
    "orm": "default",
    "workers": int(os.environ.get("BC_Q_WORKERS", "2")),
    "timeout": 3000,
    "retry": 3600,
    "max_attempts": 3,
    "catch_up": False,
    "label": "Periodic jobs",
}
