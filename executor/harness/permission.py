"""The permission path's harness side: the `permission_prompt` MCP tool that decides every Bash/edit call.

Every spawn with the harness MCP runs with `substrate.permission_args()`: `permissions.ask` rules for
Bash and the edit tools, so every such call — pre-allowed and CLI-auto-allowed ones too — reaches this tool, and the CLI fails closed (an
error or timeout runs nothing). What the CLI does with it is recorded in docs/claude-cli.md ("Permission
path"). The tool:
- knows its caller by the spawn's credential (executor/harness/identity.py), and measures paths against the directory
  the task's process was really started in;
- allows at once what the classifier (executor/gates/classify.py) allows — read-only calls, edits inside the tree;
- for a gated call: a standing rule (gate_rules) decides if one covers it; else an autonomous thread is
  refused at once, and an interactive one gets an approval card in the Asks panel (Allow once / Allow for
  this task / Always allow in this thread / Deny, or a typed reason that goes back to the model);
- journals every gated decision as `gate.decided` before it answers, so the worker's end can be derived
  from the harness's own record.

Its result stays one text block, the JSON the CLI's contract needs (`{"behavior":"allow","updatedInput":…}`
or `{"behavior":"deny","message":…}`): no output schema, no structuredContent, which the CLI refuses.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

from executor import asks
from executor import gates
from executor.gates import CARD_PREFIX
from executor.harness.identity import tool_use_id as call_tool_use_id
from executor.harness.services import Harness
from executor.run import substrate
from executor.run.caller import Caller
from shared import logs, receipts
from shared.models import NewEvent

log = logs.get(__name__)

TOOL_NAME = substrate.PERMISSION_TOOL.rsplit("__", 1)[-1]
SERVER_NAME = "harness"
ALLOW_ONCE, ALLOW_TASK, ALLOW_THREAD, DENY = ("Allow once", "Allow for this task", "Always allow in this thread",
                                              "Deny")
PREVIEW_CHARS = 3_500
WORKDIR_CACHE = 1_000  # tasks whose directory is kept (far more than ever run at once)
CANNOT_CHECK = ("Refused: the harness could not check this call at its hard gates. Do not retry it; say so in "
                "your report.")


def cli_args() -> list[str]:
    """The flags that send every non-read-only call through the tool (substrate.build_command adds them to
    every spawn that has the harness MCP)."""
    return substrate.permission_args()


@dataclass(frozen=True)
class GateContext:
    workdir: str
    home: str
    mode: gates.Mode


@dataclass(frozen=True)
class Outcome:
    """One decided call, for the journal (`gate.decided`) and the handoff's gate_decisions."""
    tool_name: str
    tool_use_id: str | None
    summary: str
    verdict: gates.Verdict
    decision: gates.Decision
    decided_by: str = "autonomous_policy"
    waited_s: float = 0.0


Decide = Callable[[Context, str, dict[str, Any], str | None], Awaitable[str]]


def _register(mcp: MCPServer, decide: Decide) -> None:
    # One text block, not structured output: the CLI refuses a result with structuredContent.
    @mcp.tool(name=TOOL_NAME, structured_output=False)
    async def permission_prompt(tool_name: str, input: dict[str, Any], ctx: Context,  # noqa: A002 - the CLI's name
                                tool_use_id: str | None = None) -> str:
        """Decides whether a worker's tool call may run (called by Claude Code, not by the model)."""
        return await decide(ctx, tool_name, input, tool_use_id)


def register_standalone(mcp: MCPServer, context: Callable[[Context], Awaitable[GateContext]],
                        on_decided: Callable[[Outcome], Awaitable[None]] | None = None) -> None:
    """The tool without a database: `context` says where the call runs; a gated call is refused even in an
    interactive thread (no one to ask). For probing the CLI and for the benchmark."""

    async def decide(ctx: Context, tool_name: str, tool_input: dict[str, Any], tool_use_id: str | None) -> str:
        try:
            where = await context(ctx)
            verdict = gates.classify(tool_name, tool_input, where.workdir, where.home)
        except Exception:
            log.exception("permission_prompt_failed", tool=tool_name, tool_use_id=tool_use_id)
            return gates.permission_result("deny", tool_input, CANNOT_CHECK)
        if not verdict.gated:
            return gates.permission_result("allow", tool_input)
        if on_decided is not None:
            await on_decided(Outcome(tool_name, tool_use_id, gates.summary(tool_name, tool_input), verdict, "deny"))
        return gates.permission_result("deny", tool_input, gates.deny_message(verdict))

    _register(mcp, decide)


def register(server: MCPServer, harness: Harness) -> None:
    """The tool as the harness serves it: caller by credential, rules and cards from the store."""
    _register(server, Gatekeeper(harness).decide)


# ---- the approval card ------------------------------------------------------------------------------------
def _fence(text: str, lang: str = "") -> str:
    ticks = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    return f"{ticks}{lang}\n{text}\n{ticks}"


def preview(tool_name: str, tool_input: dict[str, Any]) -> str:
    """The exact command, path or diff, as markdown (the card renders it sanitized)."""
    path = next((v for k in gates.PATH_KEYS if isinstance(v := tool_input.get(k), str)), None)
    if isinstance(tool_input.get("command"), str):
        text = _fence(tool_input["command"], "sh")
    elif tool_name in ("Edit", "MultiEdit") and path:
        edits = tool_input.get("edits") if tool_name == "MultiEdit" else [tool_input]
        diff: list[str] = []
        for e in edits if isinstance(edits, list) else []:
            if isinstance(e, dict):
                diff += difflib.unified_diff(str(e.get("old_string", "")).splitlines(),
                                             str(e.get("new_string", "")).splitlines(), path, path, lineterm="")
        text = f"`{path}`\n\n" + _fence("\n".join(diff), "diff")
    elif path and isinstance(tool_input.get("content"), str):
        text = f"`{path}` (whole file)\n\n" + _fence(tool_input["content"])
    else:
        text = _fence(json.dumps(tool_input, ensure_ascii=False, indent=1, sort_keys=True), "json")
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "\n… (cut; the card shows the start)"


def approval_question(tool_name: str, tool_input: dict[str, Any], verdict: gates.Verdict, role: str,
                      in_thread: bool) -> dict[str, Any]:
    detail = f" ({verdict.reason})" if verdict.reason else ""
    options = [{"label": ALLOW_ONCE, "description": "run this call now", "preview": preview(tool_name, tool_input)}]
    # a call no standing rule can hold exactly (gates.standing_pattern) is offered once only
    standing = gates.standing_pattern(tool_name, tool_input)[0] is not None
    if standing:
        options.append({"label": ALLOW_TASK,
                        "description": "run it, and the same call again in this task without asking"})
    if in_thread and standing:
        options.append({"label": ALLOW_THREAD,
                        "description": "a standing rule for this thread (listed in Context, revocable there)"})
    options.append({"label": DENY, "description": "refuse it; or type a reason instead, and the model reads it"})
    return receipts.mark({"question": f"A {role} wants to run {gates.summary(tool_name, tool_input, 200)!r} — hard gate "
                        f"'{verdict.label}'{detail}. Allow it?",
            "header": "Gate", "multiSelect": False, "options": options,
            # what the gate saw, kept with the card (a restart that orphans it still knows what was refused)
            "gate": {"category": verdict.category, "label": verdict.label, "reason": verdict.reason,
                     "tool": tool_name, "summary": gates.summary(tool_name, tool_input)}},
        # binds the answer to this exact call: the card shows its start, two calls alike there still differ here
        "tool_call", receipts.of_call(tool_name, tool_input))


NOT_FOR_THE_MODEL = "permission_prompt is the harness's check of your tool calls; it is not a tool to call."


def _from_the_cli(ctx: Context, tool_use_id: str | None) -> bool:
    """The CLI asks about a call with that call's id both as the argument and as the request's
    `claudecode/toolUseId` (docs/claude-cli.md); a model calling the tool directly gets its own call's id
    in the meta, which it cannot know in advance to pass as the argument."""
    return bool(tool_use_id) and call_tool_use_id(ctx) == tool_use_id


# ---- the harness's gatekeeper -----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Ruling:
    decision: gates.Decision  # allow | deny
    decided_by: str
    message: str = ""
    extra: dict[str, Any] | None = None


class Gatekeeper:
    def __init__(self, harness: Harness, home: str | None = None):
        self.harness = harness
        # `~` as the CLI's children see it: they inherit the executor's environment
        self.home = home or os.path.expanduser("~")
        self._workdirs: dict[uuid.UUID, str] = {}

    async def _workdir(self, task_id: uuid.UUID) -> str:
        """The task's real directory; fixed once its process started, so kept (an allowed call then costs
        one query: the caller's credential)."""
        found = self._workdirs.get(task_id)
        if found is not None:
            return found
        row = await gates.GateStore(self.harness.q).workdir(task_id)
        if row is None:
            raise LookupError(f"no task {task_id}")
        if row.spawned_in is None:
            if row.workdir is None:  # the spawn's record not yet written: never guess a directory
                raise LookupError(f"the directory of task {task_id} is not known yet")
            return os.path.realpath(row.workdir)
        found = os.path.realpath(row.spawned_in)
        if len(self._workdirs) >= WORKDIR_CACHE:
            self._workdirs.pop(next(iter(self._workdirs)))
        self._workdirs[task_id] = found
        return found

    async def decide(self, ctx: Context, tool_name: str, tool_input: dict[str, Any], tool_use_id: str | None) -> str:
        if not _from_the_cli(ctx, tool_use_id):
            # the model calling the tool itself: its answer would run nothing, but a card or a rule would
            return gates.permission_result("deny", tool_input, NOT_FOR_THE_MODEL)
        try:
            caller = await self.harness.identities.caller(ctx, TOOL_NAME)
            verdict = gates.classify(tool_name, tool_input, await self._workdir(caller.task_id), self.home)
            if verdict.gated:
                found = await gates.GateStore(self.harness.q).thread_mode(caller.thread_id)
                mode: gates.Mode = "interactive" if found == "interactive" else "autonomous"
        except Exception:
            # fail closed, and visibly: a deny is listed in the run's permission_denials, an error is not
            log.exception("permission_prompt_failed", tool=tool_name, tool_use_id=tool_use_id)
            return gates.permission_result("deny", tool_input, CANNOT_CHECK)
        if not verdict.gated:
            return gates.permission_result("allow", tool_input)
        started = time.monotonic()
        try:
            ruling = await self._rule(caller, tool_name, tool_input, verdict, mode, tool_use_id, ctx)
        except asyncio.CancelledError:
            # the harness is stopping (or the CLI went away) while a card waits: the call never runs, and
            # the record says so
            await self._journal(caller, tool_name, tool_input, tool_use_id, verdict, mode,
                                _Ruling("deny", "harness_stopped"), time.monotonic() - started, durable=False)
            raise
        except Exception:
            log.exception("permission_prompt_failed", tool=tool_name, tool_use_id=tool_use_id)
            ruling = _Ruling("deny", "gate_error", CANNOT_CHECK)
        await self._journal(caller, tool_name, tool_input, tool_use_id, verdict, mode, ruling,
                            time.monotonic() - started)
        if ruling.decision == "allow":
            return gates.permission_result("allow", tool_input)
        return gates.permission_result("deny", tool_input, ruling.message)

    async def _rule(self, caller: Caller, tool_name: str, tool_input: dict[str, Any], verdict: gates.Verdict,
                    mode: gates.Mode, tool_use_id: str | None, ctx: Context) -> _Ruling:
        rules = await gates.GateStore(self.harness.q).live_rules(
            tool_name, task_id=caller.task_id, thread_id=caller.thread_id, project_id=caller.project_id)
        for rule in rules:
            if gates.rule_covers(rule.pattern, rule.tool_name, tool_name, tool_input):
                why = f"a standing rule ({rule.scope}) refuses it"
                return _Ruling(rule.decision, "rule",
                               gates.deny_message(verdict, why=why) if rule.decision == "deny" else "",
                               {"rule_id": str(rule.id), "rule_scope": rule.scope})
        if gates.decide(verdict, mode) == "deny":
            return _Ruling("deny", "autonomous_policy", gates.deny_message(verdict))
        return await self._ask(caller, tool_name, tool_input, verdict, tool_use_id, ctx)

    async def _ask(self, caller: Caller, tool_name: str, tool_input: dict[str, Any], verdict: gates.Verdict,
                   tool_use_id: str | None, ctx: Context) -> _Ruling:
        question = approval_question(tool_name, tool_input, verdict, caller.role, caller.thread_id is not None)
        card_id = f"{CARD_PREFIX}{tool_use_id or uuid.uuid4()}"
        if self.harness.waiting.full(caller.task_id):  # its cards count with its questions (harness/waiting.py)
            return _Ruling("deny", "too_many_waiting", gates.deny_message(
                verdict, why=f"the task has {self.harness.waiting.most} questions waiting already"))
        with self.harness.waiting.admitted(caller.task_id):
            final = await self.harness.asks.ask([question], tool_use_id=card_id, caller=caller, progress=ctx,
                                                asked_by="harness")
        extra: dict[str, Any] = {"question_id": str(final.id)}
        if final.answered_by is not None:
            extra["answered_by"] = final.answered_by
        if final.response == asks.NOT_THE_USERS:
            # closed by a write that does not carry the ingress's mark: not the user's approval
            return _Ruling("deny", "unverified_answer", gates.deny_message(
                verdict, why="its approval card was closed by an answer that did not come from the user"), extra)
        choice = final.answers.get(question["question"])
        if choice in (ALLOW_ONCE, ALLOW_TASK, ALLOW_THREAD) and final.answered_by:
            if not await self._receipt(caller, final, choice, tool_name, tool_input, tool_use_id):
                return _Ruling("deny", "receipt_mismatch", gates.deny_message(
                    verdict, why="the approval it got was for a different call (the approved input's hash is "
                                 "not this call's)"), {**extra, "answer": choice})
            if choice != ALLOW_ONCE:
                extra |= await self._add_rule(caller, tool_name, tool_input, verdict,
                                              "task" if choice == ALLOW_TASK else "thread", final.answered_by)
            return _Ruling("allow", "user", extra={**extra, "answer": choice})
        if final.response == asks.TIMED_OUT and not choice:
            return _Ruling("deny", "timeout", gates.deny_message(
                verdict, why=f"nobody approved it within {round(self.harness.asks.timeout_s)} s, so the approval "
                             "timed out and the call was refused"), extra)
        reason = choice if isinstance(choice, str) and choice != DENY else final.response
        said = f"the user refused it, saying: {reason!r}" if reason else "the user refused it"
        return _Ruling("deny", "user", gates.deny_message(verdict, why=said), {**extra, "answer": choice or reason})

    async def _receipt(self, caller: Caller, final: asks.Answer, choice: str, tool_name: str,
                       tool_input: dict[str, Any], tool_use_id: str | None) -> bool:
        """The approval's receipt: the hash its card was asked with (read back from the card the user answered)
        against this call's; recorded either way, a mismatch journaled. True when the call may run."""
        store = self.harness.asks.store
        receipt = asks.Receipt("gate", final.id, caller.task_id, caller.thread_id, gates.summary(tool_name, tool_input),
                               choice, final.answered_by, await store.approved_sha256(final.id),
                               receipts.of_call(tool_name, tool_input), tool_use_id)
        receipt_id = await store.insert_receipt(receipt)
        if not receipt.matched:
            log.warning("approval_mismatch", question_id=str(final.id), tool_use_id=tool_use_id)
            await self.harness.writer.write([NewEvent("approval.mismatch", {
                "receipt_id": str(receipt_id), "kind": "gate", "question_id": str(final.id),
                "tool_use_id": tool_use_id, "summary": receipt.subject, "approved_sha256": receipt.approved_sha256,
                "checked_sha256": receipt.checked_sha256, "answered_by": final.answered_by}, tier="derived",
                task_id=caller.task_id, session_id=caller.session_id, project_id=caller.project_id)])
        return receipt.matched

    async def _add_rule(self, caller: Caller, tool_name: str, tool_input: dict[str, Any], verdict: gates.Verdict,
                        scope: str, answered_by: str) -> dict[str, Any]:
        """A standing allow for exactly this call (the command, or the path), in the task or its thread, made
        by `answered_by` (who answered the card)."""
        pattern, why_not = gates.standing_pattern(tool_name, tool_input)
        if pattern is None:
            return {"rule_refused": why_not}
        rule_id = await gates.GateStore(self.harness.q).insert_rule(gates.NewRule(
            scope, tool_name, pattern, "allow", answered_by, category=verdict.category,
            task_id=caller.task_id if scope == "task" else None,
            session_id=caller.thread_id if scope == "thread" else None))
        await self.harness.writer.put(NewEvent("gate.rule_added", {
            "rule_id": str(rule_id), "scope": scope, "tool": tool_name, "pattern": pattern[:4000],
            "decision": "allow", "category": verdict.category, "created_by": answered_by}, tier="derived",
            task_id=caller.task_id, session_id=caller.session_id, project_id=caller.project_id))
        return {"rule_id": str(rule_id), "rule_scope": scope}

    async def _journal(self, caller: Caller, tool_name: str, tool_input: dict[str, Any], tool_use_id: str | None,
                       verdict: gates.Verdict, mode: gates.Mode, ruling: _Ruling, waited_s: float, *,
                       durable: bool = True) -> None:
        payload = {"category": verdict.category, "label": verdict.label, "reason": verdict.reason,
                   "tool": tool_name, "tool_use_id": tool_use_id, "summary": gates.summary(tool_name, tool_input),
                   "decision": ruling.decision, "decided_by": ruling.decided_by, "mode": mode,
                   "wait_s": round(waited_s, 3), **(ruling.extra or {})}
        event = NewEvent("gate.decided", payload, tier="derived", task_id=caller.task_id,
                         session_id=caller.session_id, project_id=caller.project_id)
        log.info("gate_decided", **{k: v for k, v in payload.items() if k != "summary"})
        if durable:
            # durable before the CLI hears the answer: the worker's end reads this record
            await self.harness.writer.write([event])
        else:
            await self.harness.writer.put(event)
