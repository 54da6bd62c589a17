"""`python -m gateway` (or `better-compute gateway`): serve node sessions and joins.

Reads the TLS credentials written by `manage.py bc_gateway_credentials --out DIR`, writes
reports to Postgres (DATABASE_URL) and relays joins and renewals to the API.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal

from bcd.contract.version import version


def main() -> None:
    parser = argparse.ArgumentParser(prog="better-compute gateway", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gateway {version()}")
    parser.add_argument("--listen", default="127.0.0.1:8443", help="sessions (mTLS)")
    parser.add_argument("--join-listen", default="127.0.0.1:8444", help="joins (TLS)")
    parser.add_argument("--api-url", default=os.environ.get("BETTER_COMPUTE_API_URL",
                                                            "http://127.0.0.1:3000"))
    parser.add_argument("--cert-dir", required=True)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "compute.settings")
    from compute.pg import ensure_database_url

    ensure_database_url()
    import django

    django.setup()
    from fleet.pki import trust_domain
    from gateway.server import serve

    logging.basicConfig(level=os.environ.get("BETTER_COMPUTE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")

    async def run() -> None:
        task = asyncio.create_task(serve(listen=args.listen, join_listen=args.join_listen,
                                         api_url=args.api_url, cert_dir=args.cert_dir,
                                         trust_domain=trust_domain()))
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run())


if __name__ == "__main__":
    main()
