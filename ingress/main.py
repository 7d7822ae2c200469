"""The ingress as a server: the app on hypercorn, connected as the ingress role only, until `stop`."""

from __future__ import annotations

import asyncio

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config

from ingress.app import IngressConfig, create_app, shutdown_trigger
from shared import logs

log = logs.get(__name__)


def hypercorn_config(config: IngressConfig) -> Config:
    server = Config()
    server.bind = [f"{config.host}:{config.port}"]
    server.accesslog = None
    server.errorlog = logs.foreign("hypercorn.error")  # "Running on …" in the log style of every other line
    server.graceful_timeout = config.graceful_timeout_s
    server.keep_alive_timeout = 75.0
    return server


async def serve(config: IngressConfig, stop: asyncio.Event) -> None:
    """Serve until `stop` is set; open SSE streams end at once (their clients resume by Last-Event-ID)."""
    app = create_app(config)
    log.info("ingress_listening", bind=f"http://{config.host}:{config.port}/")
    # hypercorn types the app with its own ASGI scope TypedDicts, starlette with a plain mapping
    await hypercorn_serve(app, hypercorn_config(config),  # type: ignore[arg-type]
                          shutdown_trigger=shutdown_trigger(app, stop))
