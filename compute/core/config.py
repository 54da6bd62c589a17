"""Every environment variable of the control plane, its CLI and its Python client.

Declared once here with type, default and meaning (the settings reference is generated from
this list); read here and nowhere else. Django's settings read theirs through `VARIABLES`,
the CLI and the client theirs through the same, without importing Django.
"""

from __future__ import annotations

import os

from bcd.contract.variables import Declared, Variable

CLI = "CLI and client"
DEV = "dev"

VARIABLES = Declared(
    Variable("DATABASE_URL", "str", None,
             "the Postgres server, as libpq reads it: several hosts "
             "(`@a:5432,b:5432/db?target_session_attrs=read-write`), a socket folder "
             "(`?host=/run/postgresql`), any libpq parameter (`sslmode=verify-full`, "
             "`connect_timeout`). Unset: the embedded server `better-compute dev` runs",
             secret=True),
    Variable("BETTER_COMPUTE_HOME", "path", None,
             "where the embedded database, the secrets files and `dev`'s state live "
             "(default `/var/lib/better-compute` as root, else "
             "`$XDG_DATA_HOME/better-compute`, `~/.local/share/better-compute`)"),
    Variable("XDG_DATA_HOME", "path", None,
             "the user's data folder, under which a non-root user's state lives"),
    Variable("BETTER_COMPUTE_DEBUG", "bool", False, "Django's debug pages (never in production)"),
    Variable("BETTER_COMPUTE_SECRET_KEY", "str", None,
             "Django's secret key (sessions, CSRF); default: a 0600 file under the state dir. "
             "Required with a database on the network", secret=True),
    Variable("BETTER_COMPUTE_SECRET_KEY_FILE", "path", None,
             "a file holding `BETTER_COMPUTE_SECRET_KEY`"),
    Variable("BETTER_COMPUTE_ALLOWED_HOSTS", "str", "*",
             "host names the API answers for, comma-separated"),
    Variable("BETTER_COMPUTE_STATIC_ROOT", "path", None,
             "where `collectstatic` puts files (default `<state>/static`)"),
    Variable("BETTER_COMPUTE_DB_CONN_MAX_AGE", "int", 300,
             "seconds a process keeps a database connection (checked before reuse)"),
    Variable("BETTER_COMPUTE_DB_PREPARE", "bool", True,
             "prepare the booking path's statements on their connection and plan them once "
             "(`plan_cache_mode=force_generic_plan`); `0` for a connection pooler that cannot "
             "follow prepared statements"),
    Variable("BETTER_COMPUTE_LEDGER_RECHECK", "bool", True,
             "check every booking written again from the rows, past the EXCLUDE constraints' "
             "GiST indexes; `0` only to show that the invariant checks catch an overlap "
             "(`sim run --without exclude` sets it)"),
    Variable("BETTER_COMPUTE_TLS", "bool", False,
             "the API is served over HTTPS (usually behind a proxy that sets "
             "`X-Forwarded-Proto`): Secure cookies, plain HTTP redirected, HSTS"),
    Variable("BETTER_COMPUTE_HSTS_SECONDS", "int", None,
             "HSTS max-age (a year under `BETTER_COMPUTE_TLS`, else 0)"),
    Variable("BETTER_COMPUTE_HSTS_SUBDOMAINS", "bool", False, "HSTS covers subdomains"),
    Variable("BETTER_COMPUTE_HSTS_PRELOAD", "bool", False, "HSTS asks for preloading"),
    Variable("BETTER_COMPUTE_IAM_BACKEND", "str", "compute.platform.iam.embedded.EmbeddedIAM",
             "dotted path of the class that decides every API call"),
    Variable("BETTER_COMPUTE_TRUST_DOMAIN", "str", "better-compute.local",
             "the SPIFFE trust domain of node certificates"),
    Variable("BETTER_COMPUTE_GATEWAY_URL", "str", None,
             "the gateways' session addresses published in the well-known document, comma "
             "separated (`grpcs://gw-1:8443,grpcs://gw-2:8443`): agents spread over them and "
             "move to another when theirs is lost"),
    Variable("BETTER_COMPUTE_GATEWAY_JOIN_URL", "str", None,
             "the gateway's join address published in the well-known document"),
    Variable("BETTER_COMPUTE_DOWNLOADS_DIR", "path", None,
             "the folder `/downloads/<name>` serves agent artifacts from"),
    Variable("BETTER_COMPUTE_HEARTBEAT_SECONDS", "int", 10, "seconds between node heartbeats"),
    Variable("BETTER_COMPUTE_NODE_LEASE_SECONDS", "int", 40,
             "seconds of silence after which a node is unreachable (nothing it holds is "
             "released)"),
    Variable("BETTER_COMPUTE_BINDING_TIMEOUT_SECONDS", "int", 300,
             "seconds a node has to report a hold before the reservation is placed elsewhere "
             "(not counted while the node is unreachable)"),
    Variable("BETTER_COMPUTE_REFUSAL_BURST", "int", 100, "refused calls a caller may make at once"),
    Variable("BETTER_COMPUTE_REFUSALS_PER_MINUTE", "int", 60,
             "refused calls a caller may make per minute after the burst"),
    Variable("BETTER_COMPUTE_AUTH_FAILURE_BURST", "int", 20,
             "failed authentications one source address may make at once"),
    Variable("BETTER_COMPUTE_AUTH_FAILURES_PER_MINUTE", "int", 10,
             "failed authentications one source address may make per minute after the burst"),
    Variable("BETTER_COMPUTE_STREAMS_PER_CALLER", "int", 8,
             "event streams one caller may hold at once, across every API process"),
    Variable("BETTER_COMPUTE_STREAMS_PER_TENANT", "int", 64,
             "event streams one tenant may hold at once, across every API process"),
    Variable("BETTER_COMPUTE_CALLS_PER_TENANT", "int", 32,
             "calls of one tenant running at once, across every API process"),
    Variable("BETTER_COMPUTE_CALLS_PER_CALLER", "int", 16,
             "calls of one caller running at once, across every API process"),
    Variable("BETTER_COMPUTE_TENANT_CALLS_IN_FLIGHT", "int", 16,
             "calls of one tenant an API process holds at once, running or waiting"),
    Variable("BETTER_COMPUTE_DB_RETRY_MAX_SECONDS", "float", 30.0,
             "the longest a queue worker waits between two attempts to reach a database that "
             "is away (the wait doubles from 0.5 s)"),
    Variable("BETTER_COMPUTE_BMC_POLL_SECONDS", "int", 60,
             "how often the provisioner asks each enrolled machine's BMC how it is"),
    Variable("BETTER_COMPUTE_WEBHOOK_ALLOW", "str", "public",
             "where webhooks may be sent, comma-separated: `public` (any globally routable "
             "address), CIDRs (`10.0.0.0/8`, `127.0.0.1/32`) and host names "
             "(`hooks.example.com`, `*.example.com`); loopback and private addresses only when "
             "a CIDR or the host's name allows them"),
    Variable("BETTER_COMPUTE_WEBHOOK_TIMEOUT_SECONDS", "float", 10.0,
             "how long one webhook attempt may take before it counts as failed"),
    Variable("BETTER_COMPUTE_USAGE_SINK_URLS", "str", "",
             "comma-separated URLs that receive each closed usage record as a CloudEvent "
             "(com.better-compute.usage), besides the IAM backend; allowed as webhooks are "
             "(BETTER_COMPUTE_WEBHOOK_ALLOW)"),
    Variable("BETTER_COMPUTE_OIDC_ISSUER", "str", "",
             "an OpenID Connect issuer whose JWTs the API takes as bearer tokens (its "
             "discovery document and keys are read from it); empty: API tokens only"),
    Variable("BETTER_COMPUTE_OIDC_AUDIENCE", "str", "",
             "the audiences an OIDC token may carry, comma-separated (client ids, for ID "
             "tokens): the console's first, then others such as the CLI's"),
    Variable("BETTER_COMPUTE_OIDC_CLIENT_SECRET", "str", "",
             "the console's client secret at the OIDC issuer (its client id is the "
             "audience; empty for a public client, which PKCE protects)", secret=True),
    Variable("BETTER_COMPUTE_OIDC_ROLES", "str", "",
             "OIDC groups to roles in tenants, comma-separated: "
             "`gpu-ops=root:operator,ml-team=acme:member` (a token with none of them is "
             "refused)"),
    Variable("BETTER_COMPUTE_OIDC_GROUPS_CLAIM", "str", "groups",
             "the claim of an OIDC token that lists its groups"),
    Variable("BETTER_COMPUTE_OIDC_LEEWAY_SECONDS", "float", 30.0,
             "how far an OIDC token's expiry and not-before may be off the API's clock"),
    Variable("BETTER_COMPUTE_KEK", "str", None,
             "the key-encryption key (base64 of 32 bytes) sealing the PKI and audit keys; "
             "default: a 0600 file made on first use, `<state>/secrets/kek`. Required with a "
             "database on the network", secret=True),
    Variable("BETTER_COMPUTE_KEK_FILE", "path", None, "a file holding the KEK"),
    Variable("BETTER_COMPUTE_WITHOUT_KEK", "bool", False,
             "this process must never seal or unseal (the gateway sets it for itself)"),
    Variable("BETTER_COMPUTE_LOG_LEVEL", "str", "INFO", "the log level"),
    Variable("BETTER_COMPUTE_REQUEST_LOG_LEVEL", "str", "INFO",
             "the level of the one JSON line per API request (`compute.requests`)"),
    Variable("BETTER_COMPUTE_Q_WORKERS", "int", 2, "django-q2 worker processes"),
    Variable("BETTER_COMPUTE_API_THREADS", "int", 1,
             "threads per API worker process that run requests, each with its own connection"),
    Variable("BETTER_COMPUTE_API_URL", "str", "http://127.0.0.1:3000",
             "the API the gateway relays joins and renewals to"),
    Variable("BETTER_COMPUTE_IAM_DECISION_LOG", "path", None,
             "a file every IAM decision is appended to, one JSON line each (the fleet "
             "simulator's check that the fleet path asks IAM nothing)"),
    Variable("BETTER_COMPUTE_PROCESS", "str", "unknown",
             "the name a process gives itself in the IAM decision log"),
    Variable("BETTER_COMPUTE_URL", "str", None,
             "the API the CLI, the client and MCP call (`…/api/compute`; plain http only for "
             "loopback)", reader=CLI),
    Variable("BETTER_COMPUTE_TOKEN", "str", None,
             "the API token of the CLI, the client and MCP (never a command-line argument)",
             reader=CLI, secret=True),
    Variable("BETTER_COMPUTE_TOKEN_FILE", "path", None,
             "a file holding the CLI's API token", reader=CLI),
    Variable("BETTER_COMPUTE_TENANT", "str", None,
             "the CLI's and the client's default tenant (`--tenant`)", reader=CLI),
    Variable("BETTER_COMPUTE_AUDIT_KEY", "str", None,
             "the audit signing key `audit check-proof` checks against (`--public-key`)",
             reader=CLI),
    Variable("BCD_ROOT", "path", "/",
             "where the install script installs bcd and its files (a folder to try it in)",
             reader="install script"),
    Variable("BCD_SIM", "str", None,
             "any value: the install script joins a simulated machine (`bcd join --sim`), to "
             "try it on a machine without GPUs (with BCD_ROOT, as a user other than root)",
             reader="install script"),
    Variable("BETTER_COMPUTE_DEV_RESTART_SECONDS", "float", 1.0,
             "how long `dev` waits before restarting a process of its stack that died",
             reader=DEV),
    environ=os.environ,
)


# Typed reads: `text` ('' when unset), `whole`, `number`, `flag`, and `is_set`.
text, whole, number = VARIABLES.text, VARIABLES.whole, VARIABLES.number
flag, is_set = VARIABLES.flag, VARIABLES.is_set


def environment(**extra: str) -> dict[str, str]:
    """This process's environment with `extra` over it: what a child process is given."""
    return {**os.environ, **extra}


def export(name: str, value: str) -> None:
    """Sets a declared variable for this process and the ones it starts."""
    os.environ[VARIABLES[name].name] = value


def unset(name: str) -> None:
    os.environ.pop(VARIABLES[name].name, None)


def export_default(name: str, value: str) -> None:
    """Sets a variable unless it is set (DJANGO_SETTINGS_MODULE, GRPC_ENABLE_FORK_SUPPORT)."""
    os.environ.setdefault(name, value)
