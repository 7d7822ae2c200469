"""The ingress app with one extra bare endpoint, on the same hypercorn, for bench_sse's POST baseline.

    python -m tests.bench.ingress_with_bare   (configured by the same environment as `petal-dispatch ingress`)
"""

from __future__ import annotations

import asyncio

from hypercorn.asyncio import serve
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ingress.app import create_app
from ingress.main import hypercorn_config
from petal_dispatch import config, dbserver, ingress_wiring


async def bare(request: Request) -> Response:
    await request.json()
    return Response(b'{"status":"pending"}', status_code=202, media_type="application/json")


def main() -> None:
    settings = config.load()
    ingress = ingress_wiring.ingress_config(settings, dbserver.resolve(settings).ingress_dsn)
    app = create_app(ingress)
    app.router.routes.insert(0, Route("/bench/bare", bare, methods=["POST"]))
    # hypercorn types the app with its own ASGI scope TypedDicts, starlette with a plain mapping
    asyncio.run(serve(app, hypercorn_config(ingress)))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
