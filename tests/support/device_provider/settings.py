"""A small OpenID provider with the device authorization grant (RFC 8628), run as its own
process in the tests: django-oauth-toolkit, with its access tokens minted as JWTs signed with
the provider's OIDC key (as Keycloak, Okta or Entra ID issue them), so that the API verifies
them against the provider's published keys. Configured by environment: its SQLite file,
its RSA key, and its public URL."""

import os
from pathlib import Path

SECRET_KEY = "device-provider-of-the-tests"
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes",
                  "django.contrib.sessions", "oauth2_provider"]
MIDDLEWARE = ["django.contrib.sessions.middleware.SessionMiddleware",
              "django.middleware.csrf.CsrfViewMiddleware",
              "django.contrib.auth.middleware.AuthenticationMiddleware"]
ROOT_URLCONF = "tests.support.device_provider.urls"
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates",
              "DIRS": [str(Path(__file__).parent / "templates")], "APP_DIRS": True,
              "OPTIONS": {"context_processors": ["django.template.context_processors.request"]}}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ["DEVICE_PROVIDER_DB"]}}
USE_TZ = True
LOGIN_URL = "/accounts/login/"
ISSUER = os.environ["DEVICE_PROVIDER_URL"] + "/o"
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": Path(os.environ["DEVICE_PROVIDER_KEY"]).read_text(),
    "OIDC_ISS_ENDPOINT": ISSUER,
    "SCOPES": {"openid": "who you are", "profile": "your name", "email": "your email"},
    "ACCESS_TOKEN_GENERATOR": "tests.support.device_provider.tokens.jwt_access_token",
    "ACCESS_TOKEN_EXPIRE_SECONDS": 300,
    "OAUTH_DEVICE_VERIFICATION_URI": os.environ["DEVICE_PROVIDER_URL"] + "/o/device/",
    "DEVICE_FLOW_INTERVAL": 1,
}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"stderr": {"class": "logging.StreamHandler"}},
           "loggers": {"django.request": {"handlers": ["stderr"], "level": "ERROR"}}}
