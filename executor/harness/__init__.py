"""The harness MCP server (streamable HTTP at /harness-mcp/), hosted by the executor.

Claude sees its tools as mcp__harness__<name>. It is the information surface; lifecycle control stays in
the harness (dispatch_worker records a request, the supervisor spawns it). The modules:

- `identity`: who is calling, from the per-spawn credential alone (`Caller`); refusals are journaled;
- `scope`: what a caller may name in a tool's arguments (its own thread, its own project) and how far its
  dispatches go (`DispatchLimits`); `refusals`: the journal's budget of refusals, per credential;
- `asks`: the ask service — questions in the Asks panel, their wait, progress and timeout;
- `services`: what the tools share (`Harness`: queries, journal, identities, asks);
- tools by group, each with `register(server, harness)`: `questions` (ask_user_question), `reads`
  (get_handoffs, get_project_state, check_ruled_out), `workers` (dispatch_worker), `permission`
  (permission_prompt, the CLI's check of every Bash/edit call);
- `approvals` (dispatch approvals and late answers, carried out from the store) and `rules` (standing
  gate rules asked for from the page), run by the executor's loops;
- `results`: the base of the tools' typed results.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

from executor.harness import permission, questions, reads, workers
from executor.harness.services import Harness
from shared.after_response import AfterResponse

__all__ = ["PATH", "Harness", "asgi_app", "build"]

PATH = "/harness-mcp/"


def build(harness: Harness) -> MCPServer:
    server = MCPServer("harness", instructions="petal-dispatch harness: ask the user, read handoffs and the "
                       "project state, check rule-outs, and request workers.")
    for group in (questions, reads, workers, permission):
        group.register(server, harness)
    return server


def asgi_app(server: MCPServer, host: str) -> AfterResponse:
    # Host/Origin checks on: only loopback names reach the server (no DNS rebinding from a browser).
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{host}:*", "127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )
    # Stateless: no server-side session per client, so nothing a local process can open by the thousand
    # to exhaust the SDK's session cap and lock real spawns out (each call is identified by its credential
    # anyway, never by a session; progress still flows on the call's own response stream).
    # What a tool leaves for after its response (an answer's record, the task's activity) runs once the
    # response is sent (shared/after_response.py).
    return AfterResponse(server.streamable_http_app(streamable_http_path=PATH, transport_security=security,
                                                    host=host, stateless_http=True))
