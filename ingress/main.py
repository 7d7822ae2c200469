"""`petal-dispatch ingress`: the app on hypercorn, connected as the ingress role only."""

from __future__ import annotations

import asyncio
import ipaddress
import signal

from hypercorn.asyncio import serve
from hypercorn.config import Config

from ingress.app import check_auth, create_app, shutdown_trigger
from shared import database, dbserver, errors, logs, ports
from shared.settings import Settings

log = logs.get(__name__)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(settings: Settings) -> None:
    if settings.open_mode and not is_loopback(settings.ingress_host) and not settings.force_open:
        raise errors.ConfigError(
            f"refusing open mode (no authentication) on {settings.ingress_host}: bind to 127.0.0.1, turn "
            "OPEN_MODE off, or set PETAL_FORCE_OPEN=1 if the network itself is trusted (e.g. a tailnet)")


def hypercorn_config(settings: Settings) -> Config:
    config = Config()
    config.bind = [f"{settings.ingress_host}:{settings.ingress_port}"]
    config.accesslog = None
    config.errorlog = logs.foreign("hypercorn.error")  # "Running on …" in the log style of every other line
    config.graceful_timeout = 5.0
    config.keep_alive_timeout = 75.0
    return config


def main(settings: Settings) -> int:
    check_bind(settings)
    check_auth(settings)  # before waiting for the database: an auth set-up that cannot work says so at once
    ports.check_free(settings.ingress_host, settings.ingress_port, "ingress")
    info = dbserver.resolve(settings)
    database.wait_for_schema(info.ingress_dsn, "petal-ingress")  # started during an outage: it waits
    app = create_app(settings, info.ingress_dsn)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info("ingress_listening", bind=f"http://{settings.ingress_host}:{settings.ingress_port}/")
        # hypercorn types the app with its own ASGI scope TypedDicts, starlette with a plain mapping
        await serve(app, hypercorn_config(settings),  # type: ignore[arg-type]
                    shutdown_trigger=shutdown_trigger(app, stop))

    asyncio.run(run())
    return 0
