"""The ingress as a server: the app on hypercorn, connected as the ingress role only, until `stop`."""

from __future__ import annotations

import asyncio
import socket

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config

from ingress.app import IngressConfig, create_app, shutdown_trigger
from shared import logs

log = logs.get(__name__)


def hypercorn_config(config: IngressConfig) -> Config:
    server = Config()
    server.bind = [_shared_bind(config.host, config.port) if config.reuse_port else f"{config.host}:{config.port}"]
    server.accesslog = None
    # thousands of SSE clients reconnect at once after a restart: hypercorn's 100 would drop SYNs into retries
    server.backlog = 2048
    server.errorlog = logs.foreign("hypercorn.error")  # "Running on …" in the log style of every other line
    server.graceful_timeout = config.graceful_timeout_s
    server.keep_alive_timeout = 75.0
    return server


def _shared_bind(host: str, port: int) -> str:
    """A listening socket other ingress processes of this user bind too (SO_REUSEPORT: the kernel spreads new
    connections over them), handed to hypercorn by its descriptor. Bound here, so a port held by anyone else
    fails now, as hypercorn's own bind would."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    return f"fd://{sock.detach()}"  # hypercorn owns the descriptor from here


async def serve(config: IngressConfig, stop: asyncio.Event) -> None:
    """Serve until `stop` is set; open SSE streams end at once (their clients resume by Last-Event-ID)."""
    app = create_app(config)
    log.info("ingress_listening", bind=f"http://{config.host}:{config.port}/")
    # hypercorn types the app with its own ASGI scope TypedDicts, starlette with a plain mapping
    await hypercorn_serve(app, hypercorn_config(config),  # type: ignore[arg-type]
                          shutdown_trigger=shutdown_trigger(app, stop))
