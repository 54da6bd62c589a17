"""Django settings: the control plane's whole configuration, read once at start-up.

Every knob is an environment variable declared in `compute/core/config.py` (with its type, default
and meaning; the settings reference is generated from it); none needs to be set. Code reads
`settings.BC_<NAME>`, never the environment. `DATABASE_URL` selects a Postgres server;
without it the persistent embedded server is used (the entry points start it before settings
load). Importing this module writes nothing: the secret file made on first use is made when
the secret is first read.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from django.utils.functional import lazy

from compute.core import pg
from compute.core.config import flag, is_set, number, text, whole
from compute.core.dburl import PREPARING, networked, one_plan_per_statement, parse_database_url

BASE_DIR = Path(__file__).resolve().parents[2]


def env(name: str) -> str:
    """The variable `BETTER_COMPUTE_<name>` as text ('' when unset)."""
    return text(f"BETTER_COMPUTE_{name}")


DEBUG = flag("BETTER_COMPUTE_DEBUG")
DATABASES = {
    "default": parse_database_url(text("DATABASE_URL") or pg.persistent().url),
}
# A request reuses its process's connection (checked before use, since a server restart or
# failover drops it) instead of opening one per request.
DATABASES["default"]["CONN_MAX_AGE"] = whole("BETTER_COMPUTE_DB_CONN_MAX_AGE")
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
if PREPARING:  # the hot paths' prepared statements (compute.core.db.prepared_cursor)
    one_plan_per_statement(DATABASES["default"])
# A database on the network may be shared by several hosts: the secrets every host must hold
# alike are then required from the environment (or a file), never made up on one host.
SHARED_DATABASE = networked(DATABASES["default"])


def _shared_secret(name: str, purpose: str) -> str:
    value = env(name)
    if not value and (path := env(f"{name}_FILE")):
        value = Path(path).read_text().strip()
    if not value and SHARED_DATABASE:
        raise ImproperlyConfigured(
            f"BETTER_COMPUTE_{name} (or BETTER_COMPUTE_{name}_FILE) is required with a "
            f"database on the network: every host must share {purpose}")
    return value


@cache
def _local_secret_key() -> str:
    return pg.local_secret("django-secret-key")


SECRET_KEY = (_shared_secret("SECRET_KEY", "Django's secret key (sessions, CSRF)")
              or lazy(_local_secret_key, str)())
ALLOWED_HOSTS = [h for h in env("ALLOWED_HOSTS").split(",") if h]

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
    "compute.platform.apps.ComputeConfig",
    "compute.platform.webhooks.apps.WebhooksConfig",
    "audit.apps.AuditConfig",
    "fleet.apps.FleetConfig",
    "reservations.apps.ReservationsConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's, the console's) are served by the app itself.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "compute.http.console.csp.content_security_policy",
]

ROOT_URLCONF = "compute.project.urls"
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
WSGI_APPLICATION = "compute.project.wsgi.application"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env("STATIC_ROOT") or pg.state_root() / "static")  # made by the app
# Without `collectstatic`, files are found where they live (packages, static/); after it,
# they are served compressed from STATIC_ROOT (compute.platform.apps makes the folder).
WHITENOISE_USE_FINDERS = True

# The console's session cookie: never readable by scripts, never sent cross-site. Served over
# TLS (BETTER_COMPUTE_TLS=1, usually behind a proxy that sets X-Forwarded-Proto), cookies are
# Secure, plain HTTP is redirected and browsers are told to keep to HTTPS (HSTS).
SESSION_COOKIE_SAMESITE = "Strict"
SESSION_COOKIE_HTTPONLY = True
BC_TLS = flag("BETTER_COMPUTE_TLS")
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = BC_TLS
SECURE_SSL_REDIRECT = BC_TLS
SECURE_HSTS_SECONDS = (whole("BETTER_COMPUTE_HSTS_SECONDS") if is_set("BETTER_COMPUTE_HSTS_SECONDS")
                       else 31536000 if BC_TLS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = flag("BETTER_COMPUTE_HSTS_SUBDOMAINS")
SECURE_HSTS_PRELOAD = flag("BETTER_COMPUTE_HSTS_PRELOAD")
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if BC_TLS else None

# The largest request body the API reads (413 above it): a sandbox file of 2 MiB, in base64.
DATA_UPLOAD_MAX_MEMORY_SIZE = 4 * 1024 * 1024

REST_FRAMEWORK = {
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
}

# The IAM that decides every API call. Any class with `decide(...)`
# (compute.platform.iam.Authorizer)
# can replace the embedded one, e.g. a client of an external IAM service.
BC_IAM_BACKEND = env("IAM_BACKEND")

# The fleet: node certificates' SPIFFE trust domain, what the well-known document publishes,
# heartbeat and lease of node sessions, how long a hold may take to bind.
BC_TRUST_DOMAIN = env("TRUST_DOMAIN")
BC_GATEWAY_URLS = [url.strip() for url in (env("GATEWAY_URL") or "").split(",") if url.strip()]
BC_GATEWAY_JOIN_URL = env("GATEWAY_JOIN_URL")
BC_DOWNLOADS_DIR = env("DOWNLOADS_DIR")
BC_HEARTBEAT_SECONDS = whole("BETTER_COMPUTE_HEARTBEAT_SECONDS")
BC_LEDGER_RECHECK = flag("BETTER_COMPUTE_LEDGER_RECHECK")
# Refused calls a caller may make: a burst, then so many a minute (compute.platform.iam.refusals).
BC_REFUSAL_BURST = whole("BETTER_COMPUTE_REFUSAL_BURST")
# Failed authentications one source address may make at once, and per minute after.
BC_AUTH_FAILURE_BURST = whole("BETTER_COMPUTE_AUTH_FAILURE_BURST")
BC_AUTH_FAILURES_PER_MINUTE = whole("BETTER_COMPUTE_AUTH_FAILURES_PER_MINUTE")
# Event streams one caller, and one tenant, may hold at once (across every API process).
BC_STREAMS_PER_CALLER = whole("BETTER_COMPUTE_STREAMS_PER_CALLER")
BC_STREAMS_PER_TENANT = whole("BETTER_COMPUTE_STREAMS_PER_TENANT")
# Calls one tenant, and one caller, may have running at once across every API process.
BC_CALLS_PER_TENANT = whole("BETTER_COMPUTE_CALLS_PER_TENANT")
BC_CALLS_PER_CALLER = whole("BETTER_COMPUTE_CALLS_PER_CALLER")
# Calls of one tenant in flight (running or waiting for a thread) in one API process.
BC_TENANT_CALLS_IN_FLIGHT = whole("BETTER_COMPUTE_TENANT_CALLS_IN_FLIGHT")
BC_REFUSALS_PER_MINUTE = whole("BETTER_COMPUTE_REFUSALS_PER_MINUTE")
BC_NODE_LEASE_SECONDS = whole("BETTER_COMPUTE_NODE_LEASE_SECONDS")
BC_BINDING_TIMEOUT_SECONDS = whole("BETTER_COMPUTE_BINDING_TIMEOUT_SECONDS")
# The longest wait of a queue worker between two attempts to reach a database that is away.
BC_DB_RETRY_MAX_SECONDS = number("BETTER_COMPUTE_DB_RETRY_MAX_SECONDS")
# How often the provisioner asks each enrolled machine's BMC whether it answers and is on.
BC_BMC_POLL_SECONDS = whole("BETTER_COMPUTE_BMC_POLL_SECONDS")

# Where webhooks may be sent (compute.platform.webhooks.outbound), and how long one may take.
BC_WEBHOOK_ALLOW = text("BETTER_COMPUTE_WEBHOOK_ALLOW")
BC_WEBHOOK_TIMEOUT_SECONDS = number("BETTER_COMPUTE_WEBHOOK_TIMEOUT_SECONDS")
# Where closed usage records go besides the IAM backend (compute.platform.iam.metering).
BC_USAGE_SINK_URLS = text("BETTER_COMPUTE_USAGE_SINK_URLS")

# OpenID Connect bearer tokens (compute.platform.iam.oidc).
BC_OIDC_ISSUER = text("BETTER_COMPUTE_OIDC_ISSUER")
BC_OIDC_AUDIENCE = text("BETTER_COMPUTE_OIDC_AUDIENCE")
BC_OIDC_ROLES = text("BETTER_COMPUTE_OIDC_ROLES")
BC_OIDC_CLIENT_SECRET = text("BETTER_COMPUTE_OIDC_CLIENT_SECRET")
BC_OIDC_GROUPS_CLAIM = text("BETTER_COMPUTE_OIDC_GROUPS_CLAIM")
BC_OIDC_LEEWAY_SECONDS = number("BETTER_COMPUTE_OIDC_LEEWAY_SECONDS")

# The key-encryption key sealing the PKI and audit keys in Postgres (base64 of 32 bytes),
# or a file holding it; neither set: a 0600 file made on first use under the state dir.
BC_KEK = env("KEK")
BC_KEK_FILE = env("KEK_FILE")
# A process that must never seal or unseal (the gateway): the KEK is refused to it.
BC_WITHOUT_KEK = flag("BETTER_COMPUTE_WITHOUT_KEK")
if SHARED_DATABASE and not (BC_KEK or BC_KEK_FILE or BC_WITHOUT_KEK):
    raise ImproperlyConfigured(
        "BETTER_COMPUTE_KEK (or BETTER_COMPUTE_KEK_FILE) is required with a database on the "
        "network: every host must seal and unseal the PKI and audit keys with the same key")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
                   "json": {"format": "%(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"},
                 "requests": {"class": "logging.StreamHandler", "formatter": "json"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL")},
    # One JSON object per API request (compute.http.envelope.seen), nothing around it.
    "loggers": {"compute.requests": {"handlers": ["requests"], "propagate": False,
                                     "level": env("REQUEST_LOG_LEVEL")}},
}

# django-q2 runs the periodic jobs (compute/platform/schedules.py) on the Postgres ORM broker:
# `python manage.py qcluster`. The sub-second reconcilers run on the sharded work queue
# (`python manage.py bc_worker --loop`), whose leases django-q2's scheduler cannot express.
Q_CLUSTER = {
    "name": "better-compute",
    "orm": "default",
    "workers": whole("BETTER_COMPUTE_Q_WORKERS"),
    "timeout": 3000,
    "retry": 3600,
    "max_attempts": 3,
    "catch_up": False,
    "label": "Periodic jobs",
    # Only periodic jobs run here (each minute at most): the queue is polled each second, not
    # five times a second, and the guard checks its processes each second, not twice.
    "poll": 1.0,
    "guard_cycle": 1.0,
}
