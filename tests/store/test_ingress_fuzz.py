"""Property-based fuzz of every OpenAPI route: whatever arrives, the answer is never a 5xx."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.pg import DB, Cluster
from tests.served import ingress_server

# text with the characters PostgreSQL refuses (NUL) and JSON can smuggle in (lone surrogates)
texts = st.one_of(st.text(max_size=30), st.text(alphabet=st.sampled_from("a\x00\ud800\udfff\u00e9 {}\"\\"),
                                                 max_size=10))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
ids = st.one_of(st.uuids().map(str), texts, st.just("toolu_x"), st.just("a\x00b"))
params = st.dictionaries(st.sampled_from(["after_seq", "limit", "status", "thread_id", "running", "tier",
                                          "task_id", "scope_id", "event_type"]),
                         st.one_of(texts, st.integers().map(str), st.uuids().map(str)), max_size=4)


def _fill(path: str, value: str) -> str:
    for name in ("{task_id}", "{thread_id}", "{ask_id}", "{project_id}"):
        path = path.replace(name, value)
    return path


@pytest.fixture(scope="module")
def server(cluster: Cluster) -> Iterator[tuple[str, dict[str, Any]]]:
    """One server for the whole fuzz run, in its own thread and loop."""
    db: DB = cluster.create_migrated()
    started = threading.Event()
    holder: dict[str, Any] = {}

    def run() -> None:
        async def main() -> None:
            async with ingress_server(db.ingress_dsn) as url:
                holder["url"] = url
                holder["stop"] = asyncio.Event()
                holder["loop"] = asyncio.get_running_loop()
                started.set()
                await holder["stop"].wait()

        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(60)
    spec = httpx.get(holder["url"] + "/openapi.json").json()
    yield holder["url"], spec
    holder["loop"].call_soon_threadsafe(holder["stop"].set)
    thread.join(30)
    cluster.drop(db)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_route_answers_5xx_to_any_input(server: tuple[str, dict[str, Any]], data: st.DataObject) -> None:
    url, spec = server
    routes = [(path, method) for path, ops in spec["paths"].items() for method in ops if path != "/api/stream"]
    path, method = data.draw(st.sampled_from(routes))
    body = data.draw(st.one_of(json_values, st.fixed_dictionaries({"text": texts}),
                               st.fixed_dictionaries({"title": texts, "mode": texts}),
                               st.fixed_dictionaries({"answers": json_values, "response": json_values})))
    # encoded by hand: JSON may carry lone surrogates as escapes, which a client library refuses to send
    content = json.dumps(body).encode() if method != "get" else None
    headers = {"content-type": "application/json"} if content is not None else {}
    target = _fill(path, quote(data.draw(ids), safe="", errors="surrogatepass"))
    query = urlencode(data.draw(params), quote_via=lambda v, *a: quote(v, safe="", errors="surrogatepass"))
    with httpx.Client(base_url=url, timeout=10) as http:
        response = http.request(method.upper(), f"{target}?{query}", content=content, headers=headers)
    assert response.status_code < 500, (method, path, body, response.text)


def test_the_stream_rejects_a_bad_resume_point_without_a_5xx(server: tuple[str, dict[str, Any]]) -> None:
    url, _ = server
    for bad in ("-1", "x", "1e9", str(uuid.uuid4())):
        assert httpx.get(url + "/api/stream", headers={"Last-Event-ID": bad}, timeout=5).status_code == 400
