"""The floor under the gateway's cost per session: a gRPC server of the same service, on the
same credentials and options, that does nothing per session but say Welcome and read.

    python -m bench.session_floor --listen HOST:PORT --cert-dir DIR [--plain]

With --plain it listens without TLS, so TLS's own share can be told from HTTP/2's. It loads
Django as the gateway does, so both start from the same memory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--cert-dir", required=True)
    parser.add_argument("--plain", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "compute.project.settings")
    os.environ["BETTER_COMPUTE_WITHOUT_KEK"] = "1"
    import django

    django.setup()
    import grpc

    from bcd.contract.proto import agent_pb2 as pb
    from bcd.contract.proto import agent_pb2_grpc
    from gateway.server import CertificateFiles

    class Floor(agent_pb2_grpc.AgentGatewayServicer):
        async def Session(self, request_iterator: Any, context: Any) -> Any:
            yield pb.GatewayMessage(lane=pb.CONTROL, welcome=pb.Welcome(
                epoch=1, heartbeat_seconds=10, lease_seconds=40, node_id="floor"))
            async for _message in request_iterator:
                pass

    async def serve() -> None:
        server = grpc.aio.server(options=[("grpc.keepalive_time_ms", 20_000)])
        agent_pb2_grpc.add_AgentGatewayServicer_to_server(Floor(), server)
        if args.plain:
            server.add_insecure_port(args.listen)
        else:
            server.add_secure_port(args.listen, CertificateFiles(Path(args.cert_dir))
                                   .credentials(require_client_auth=True))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
