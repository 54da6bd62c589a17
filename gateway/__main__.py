"""`python -m gateway` (or `better-compute gateway`): serve node sessions and joins.

Reads the TLS credentials written by `manage.py bc_gateway_credentials --out DIR`, files
reports in Postgres (DATABASE_URL: connect as the role `manage.py bc_gateway_role` makes)
and relays joins and renewals to the API. It runs without the key-encryption key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import click

from bcd.contract.version import version
from compute.core import config


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version(), "--version", prog_name="gateway",
                      message="%(prog)s %(version)s")
@click.option("--cert-dir", required=True, type=click.Path(file_okay=False),
              help="key.pem, cert.pem and ca.pem from bc_gateway_credentials.")
@click.option("--listen", default="127.0.0.1:8443", show_default=True,
              help="Node sessions (mTLS: a node certificate is required).")
@click.option("--join-listen", default="127.0.0.1:8444", show_default=True,
              help="Joins (TLS: a joining machine has no certificate yet).")
@click.option("--api-url", envvar="BETTER_COMPUTE_API_URL", default="http://127.0.0.1:3000",
              show_default=True, help="The API that joins and renewals are relayed to.")
@click.option("--metrics-listen", default=None, metavar="HOST:PORT",
              help="Serve Prometheus metrics (/metrics) here; none by default.")
@click.option("--name", "gateway_name", default="", metavar="NAME",
              help="What `nodes get` shows as the gateway holding a node's session "
                   "[default: HOSTNAME:PORT of --listen].")
def main(cert_dir: str, listen: str, join_listen: str, api_url: str,
         metrics_listen: str | None, gateway_name: str) -> None:
    """Run the gateway: it holds node sessions, files their reports in Postgres and relays
    joins and renewals to the API. It holds no CA, no signing key and no KEK, and never
    calls IAM."""
    config.export_default("DJANGO_SETTINGS_MODULE", "compute.project.settings")
    for name in ("BETTER_COMPUTE_KEK", "BETTER_COMPUTE_KEK_FILE"):
        config.unset(name)
    config.export("BETTER_COMPUTE_WITHOUT_KEK", "1")
    from compute.core.pg import require_database_url

    require_database_url()
    import django

    django.setup()
    from compute.core.metrics import serve_metrics
    from fleet.pki import trust_domain
    from gateway.server import serve

    logging.basicConfig(level=config.text("BETTER_COMPUTE_LOG_LEVEL"),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if metrics_listen:
        serve_metrics(metrics_listen)

    async def run() -> None:
        task = asyncio.create_task(serve(listen=listen, join_listen=join_listen,
                                         api_url=api_url, cert_dir=cert_dir,
                                         trust_domain=trust_domain(), name=gateway_name))
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run())


if __name__ == "__main__":
    main(prog_name="better-compute gateway")
