"""A store as a year of use leaves it: threads, their turns, the workers they dispatched and the extractors
that distilled them, asks, approvals, handoffs, gate decisions and usage, written with COPY.

    python -m tests.bench.seed_store --dsn DSN [--events 10000000] [--tasks 20000] [--threads 2000]

The shapes are those of a real run (an interactive thread's turn dispatching a worker that runs a tool, its
approval, the worker's extraction and the harness's report, as journaled by the services on the scripted
model): the same event types, the same columns set (a turn's records carry the thread as session, a
worker's its own session), payloads of the same structure and about the same size (task.spawned and
stream.system.init ~3 KB, stream.result ~2.3 KB, a tool call and its result 0.5-1.5 KB). Workers' lengths are
skewed (log-normal): most are short, a few run for thousands of lines. Threads overlap in time (a few are
active at once), so one thread's records are spread over the journal as they are in use.

What is open now does not grow with the store and is seeded the same at any size: a few pending asks, a
pending turn, an ended task not yet settled, messages waiting in chat_queue (`OPEN_*` below).

Needs a superuser DSN on a migrated database whose journal is empty: the journal is written first under
session_replication_role = replica (no per-row foreign-key triggers), then the rows it names. With
`rebuild_indexes` the journal's secondary indexes are dropped during the load and built after it
(what makes 10 million events take minutes, not hours).
"""

from __future__ import annotations

import argparse
import json
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

# rows per COPY write (one network write, a few MB)
CHUNK = 5_000
# threads in progress at once: how far one thread's records are spread over the journal
ACTIVE_THREADS = 24
# what is open now, the same at any size of the store
OPEN_PENDING_ASKS = 3
OPEN_PENDING_CHAT = 2

EPOCH = time.time() - 3600


@dataclass(frozen=True)
class Shape:
    events: int = 10_000_000
    tasks: int = 20_000
    threads: int = 2_000
    projects: int = 10
    span_days: float = 365.0
    seed: int = 35


@dataclass
class Task:
    id: uuid.UUID
    role: str
    thread: Thread
    session_id: uuid.UUID
    parent: Task | None = None
    body: int = 0  # a worker's tool calls
    status: str = "success"
    first: float = 0.0
    last: float = 0.0
    question_id: uuid.UUID | None = None
    brief: str = ""


@dataclass
class Thread:
    id: uuid.UUID
    title: str
    mode: str
    project_id: uuid.UUID | None
    archived: bool
    tasks: list[Task] = field(default_factory=list)
    # the order its tasks run in: (kind, task)
    steps: list[tuple[str, Task]] = field(default_factory=list)
    first: float = 0.0
    last: float = 0.0


@dataclass
class Seeded:
    """What was written, and the ids a benchmark or a test reads back."""

    events: int
    tasks: int
    threads: int
    seconds: float
    thread_ids: list[uuid.UUID]
    worker_ids: list[uuid.UUID]
    # the longest worker (a task with many events) and the newest thread
    long_worker: uuid.UUID
    newest_thread: uuid.UUID
    busiest_thread: uuid.UUID
    journal_bytes: int = 0


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_VOCAB) for _ in range(n))


_VOCAB = ("the", "file", "test", "passes", "build", "config", "fix", "module", "error", "function", "update",
          "check", "branch", "commit", "review", "import", "return", "value", "server", "client", "query", "index",
          "plan", "step", "worker", "handoff", "deploy", "log", "line", "parse", "cache", "retry", "timeout")
_TOOLS = ("Bash", "Read", "Edit", "Grep", "Glob", "Write")
_INIT_TOOLS = json.dumps(["Task", "Bash", "Edit", "Glob", "Grep", "NotebookEdit", "Read", "TodoWrite", "WebFetch",
                          "WebSearch", "Write", "mcp__harness__ask_user_question", "mcp__harness__get_handoffs",
                          "mcp__harness__get_project_state", "mcp__harness__check_ruled_out",
                          "mcp__harness__dispatch_worker", "mcp__harness__permission"] * 3)
_SLASH = json.dumps(["compact", "context", "cost", "init", "review", "security-review", "doctor", "model", "usage",
                     "clear", "config", "memory", "mcp", "permissions", "status", "todos", "agents"] * 6)
_SYSTEM_PROMPT = json.dumps(
    "You are the orchestrator of petal-dispatch, working for one person who reads you from a phone. Plan the "
    "work, and hand each concrete piece to a headless worker with mcp__harness__dispatch_worker (give it a "
    "complete, self-contained brief). The call returns at once; when the worker finishes, the harness sends you "
    "its handoff as a new message. Keep replies short." * 4)


class Journal:
    """Encodes events as COPY text rows, in seq order, with created_at spread over the span."""

    def __init__(self, shape: Shape, total: int):
        self.seq = 0
        self.start = EPOCH - shape.span_days * 86400
        self.step = shape.span_days * 86400 / max(total, 1)
        self.rows: list[str] = []
        self._sec = -1
        self._prefix = ""

    def now(self) -> float:
        return self.start + self.seq * self.step

    def _ts(self, t: float) -> str:
        sec = int(t)
        if sec != self._sec:
            self._sec, self._prefix = sec, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(sec))
        return f"{self._prefix}.{int((t - sec) * 1e6):06d}+00"

    def add(self, event_type: str, payload: str, *, task: Task | None = None, session: uuid.UUID | None = None,
            project: uuid.UUID | None = None, parent: str | None = None, message: uuid.UUID | None = None,
            tier: str = "raw") -> str:
        self.seq += 1
        t = self.now()
        if task is not None:
            if not task.first:
                task.first = t
            task.last = t
        event_id = str(uuid.uuid4())
        # COPY text: backslashes doubled (JSON text has no raw tabs or newlines)
        self.rows.append("\t".join((event_id, str(self.seq), str(project) if project else "\\N",
                                    str(session) if session else "\\N", str(task.id) if task else "\\N",
                                    parent or "\\N", str(message) if message else "\\N", event_type, tier,
                                    self._ts(t), payload.replace("\\", "\\\\"))) + "\n")
        return event_id


def _assistant(rng: random.Random, session: uuid.UUID, content: str) -> str:
    return ('{"type": "assistant", "uuid": "%s", "message": {"id": "msg_%s", "role": "assistant", "type": "message", '
            '"model": "claude-sonnet-4-5", "usage": {"input_tokens": %d, "output_tokens": %d, '
            '"cache_read_input_tokens": %d}, "content": [%s], "stop_reason": null, "stop_sequence": null, '
            '"context_management": null}, "timestamp": "2026-01-01T00:00:00.000Z", "request_id": "req_%s", '
            '"session_id": "%s", "parent_tool_use_id": null}'
            % (uuid.uuid4(), uuid.uuid4().hex[:24], rng.randint(3, 4000), rng.randint(5, 900),
               rng.randint(0, 60000), content, uuid.uuid4().hex[:24], session))


def _tool_use(rng: random.Random, tool_id: str) -> str:
    name = rng.choice(_TOOLS)
    arg = json.dumps(f"{_words(rng, 3).replace(' ', '/')}.py" if name != "Bash" else _words(rng, rng.randint(3, 12)))
    return '{"id": "%s", "name": "%s", "type": "tool_use", "input": {"%s": %s}}' % (
        tool_id, name, "command" if name == "Bash" else "file_path", arg)


def _tool_result(rng: random.Random, session: uuid.UUID, tool_id: str) -> str:
    out = json.dumps(_words(rng, rng.randint(10, 160)))
    return ('{"type": "user", "uuid": "%s", "message": {"role": "user", "content": [{"type": "tool_result", '
            '"content": %s, "is_error": false, "tool_use_id": "%s"}]}, "timestamp": "2026-01-01T00:00:00.000Z", '
            '"session_id": "%s", "tool_use_result": {"stderr": "", "stdout": %s, "interrupted": false}}'
            % (uuid.uuid4(), out, tool_id, session, out))


def _result(rng: random.Random, session: uuid.UUID, text: str, turns: int) -> str:
    inp, outp = rng.randint(20, 90000), rng.randint(10, 8000)
    return ('{"type": "result", "uuid": "%s", "usage": {"speed": "standard", "iterations": [], "input_tokens": %d, '
            '"service_tier": "standard", "inference_geo": "", "output_tokens": %d, "cache_creation": '
            '{"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": %d}, "fallback_credit": null, '
            '"server_tool_use": {"web_fetch_requests": 0, "web_search_requests": 0}, "output_tokens_details": '
            '{"thinking_tokens": 0}, "cache_read_input_tokens": %d, "cache_creation_input_tokens": %d}, '
            '"result": %s, "subtype": "success", "ttft_ms": %d, "is_error": false, "num_turns": %d, '
            '"duration_ms": %d, "stop_reason": "end_turn", "session_id": "%s", "total_cost_usd": %.6f, '
            '"modelUsage": {"claude-sonnet-4-5": {"inputTokens": %d, "outputTokens": %d, "costUSD": %.6f}}, '
            '"permission_denials": [], "duration_api_ms": %d, "terminal_reason": "completed"}'
            % (uuid.uuid4(), inp, outp, rng.randint(0, 5000), rng.randint(0, 200000), rng.randint(0, 5000),
               json.dumps(text), rng.randint(100, 3000), turns, rng.randint(500, 900000), session,
               inp * 3e-6 + outp * 15e-6, inp, outp, inp * 3e-6 + outp * 15e-6, rng.randint(400, 800000)))


def _spawned(task: Task, pid: int) -> str:
    return ('{"pid": %d, "argv": ["claude", "-p", "--output-format", "stream-json", "--verbose", "--setting-sources", '
            '"user", "--session-id", "%s", "--append-system-prompt", %s, "--mcp-config=/var/lib/petal/run/mcp/mcp-%s.json", '
            '"--allowedTools", "mcp__harness__ask_user_question,mcp__harness__get_handoffs,Read,Glob,Grep"], '
            '"role": "%s", "workdir": "/srv/work/%s", "sandbox": "bwrap", "executor": "host-1", "resume": false}'
            % (pid, task.session_id, _SYSTEM_PROMPT, task.id, task.role, task.thread.id))


def _init(session: uuid.UUID) -> str:
    return ('{"type": "system", "subtype": "init", "cwd": "/srv/work", "session_id": "%s", "tools": %s, '
            '"mcp_servers": [{"name": "harness", "status": "connected"}], "model": "claude-sonnet-4-5", '
            '"permissionMode": "default", "slash_commands": %s, "apiKeySource": "ANTHROPIC_API_KEY", '
            '"claude_code_version": "2.1.328", "output_style": "default", "uuid": "%s"}'
            % (session, _INIT_TOOLS, _SLASH, uuid.uuid4()))


def _exited(rng: random.Random, task: Task, lines: int) -> str:
    return ('{"lines": %d, "reason": "completed", "result": {"subtype": "success", "is_error": false, "num_turns": %d, '
            '"duration_ms": %d, "stop_reason": "end_turn", "total_cost_usd": %.6f, "terminal_reason": "completed", '
            '"api_error_status": null}, "signal": null, "status": "%s", "unparsed": 0, "exit_code": %d, '
            '"duration_s": %.3f, "substrate_session_id": "%s", "permission_denials": []}'
            % (lines, rng.randint(1, 40), rng.randint(500, 900000), rng.random(), task.status,
               0 if task.status == "success" else 1, rng.random() * 900, task.session_id))


class Writer:
    """Generates each task's records (a generator per thread) and interleaves the threads."""

    def __init__(self, shape: Shape, rng: random.Random, journal: Journal):
        self.shape, self.rng, self.j = shape, rng, journal
        self.pid = 1000
        self.gate_rules: dict[uuid.UUID, uuid.UUID] = {}  # thread -> a standing rule of it

    def thread(self, th: Thread) -> Iterator[None]:
        j = self.j
        j.add("thread.created", json.dumps({"title": th.title, "mode": th.mode}), session=th.id)
        th.first = j.now()
        yield
        for kind, task in th.steps:
            if kind == "turn":
                yield from self.turn(task)
            elif kind == "worker":
                yield from self.worker(task)
            else:
                yield from self.extractor(task)
        if th.archived:
            j.add("thread.archived", json.dumps({"by": "user"}), session=th.id)
        th.last = j.now()
        yield

    def _open(self, task: Task, brief: str, extra: dict[str, Any]) -> None:
        self.pid += 1
        j = self.j
        session = task.session_id if task.role != "worker" and task.role != "extractor" else None
        j.add("task.dispatch_requested", json.dumps({"role": task.role, "brief": brief, "workdir": None,
                                                     "plan_ref": None, **extra}),
              task=task, session=session)

    def turn(self, task: Task) -> Iterator[None]:
        j, rng, th = self.j, self.rng, task.thread
        text = task.brief
        origin = "user" if not text.startswith("[harness]") else "harness"
        j.add("task.user_message" if origin == "user" else "thread.harness_message",
              json.dumps({"text": text, "origin": origin, "thread_id": str(th.id), "attachments": []}),
              task=task, session=th.id, message=uuid.uuid4())
        self._open(task, text, {"messages": 1, "requested_by": None, "parent_task_id": None})
        j.add("task.spawned", _spawned(task, self.pid), task=task, session=th.id, project=th.project_id)
        j.add("stream.system.init", _init(th.id), task=task, session=th.id)
        yield
        workers = [w for w in th.tasks if w.parent is task and w.role == "worker"]
        lines = 2
        for w in workers:
            tool_id = f"toolu_{uuid.uuid4().hex[:20]}"
            call = j.add("stream.assistant", _assistant(rng, th.id, '{"id": "%s", "name": "mcp__harness__dispatch_worker", '
                                                                    '"type": "tool_use", "input": {"brief": %s}}'
                                                        % (tool_id, json.dumps(w.brief))), task=task, session=th.id)
            j.add("task.dispatch_requested", json.dumps({
                "role": "worker", "brief": w.brief, "workdir": None, "plan_ref": None, "tool_use_id": tool_id,
                "requested_by": str(th.id), "parent_task_id": str(task.id)}), task=w)
            if w.question_id is not None:
                j.add("question.asked", json.dumps({
                    "asked_by": "harness", "questions": [{"header": "Dispatch", "options": [
                        {"label": "Approve", "preview": w.brief, "description": "start the worker now"},
                        {"label": "Reject", "description": "do not start it; the orchestrator hears your answer"}],
                        "question": "The orchestrator wants to start a worker with this brief. Start it?",
                        "multiSelect": False}], "question_id": str(w.question_id),
                    "tool_use_id": f"approval-{w.id}", "approval_for": str(w.id)}), task=w, session=th.id)
            j.add("stream.user", _tool_result(rng, th.id, tool_id), task=task, session=th.id, parent=call)
            lines += 2
            yield
        reply = _words(rng, rng.randint(15, 220))
        j.add("stream.assistant", _assistant(rng, th.id, '{"text": %s, "type": "text"}' % json.dumps(reply)),
              task=task, session=th.id)
        j.add("stream.result", _result(rng, th.id, reply, lines), task=task, session=th.id)
        j.add("task.exited", _exited(rng, task, lines + 2), task=task, session=th.id)
        if task.status != "success":
            j.add("turn.failed", json.dumps({"status": task.status, "reason": "exit 1", "action": "leave",
                                             "messages": 1}), task=task, session=th.id, tier="derived")
        for w in workers:
            if w.question_id is not None:
                j.add("question.answered", json.dumps({"question_id": str(w.question_id), "answers": {
                    "The orchestrator wants to start a worker with this brief. Start it?": "Approve"}}),
                      task=w, session=th.id)
                j.add("approval.resolved", json.dumps({"answer": "Approve", "decision": "approved", "response": None,
                                                       "answered_by": "open", "question_id": str(w.question_id)}),
                      task=w, session=th.id, tier="derived")
        yield

    def worker(self, task: Task) -> Iterator[None]:
        j, rng, th, s = self.j, self.rng, task.thread, task.session_id
        j.add("task.spawned", _spawned(task, self.pid), task=task, session=s, project=th.project_id)
        j.add("stream.system.init", _init(s), task=task, session=s)
        rule = self.gate_rules.get(th.id)
        for i in range(task.body):
            tool_id = f"toolu_{uuid.uuid4().hex[:20]}"
            text = '{"text": %s, "type": "text"}, ' % json.dumps(_words(rng, rng.randint(3, 40))) if i % 3 == 0 else ""
            call = j.add("stream.assistant", _assistant(rng, s, text + _tool_use(rng, tool_id)), task=task, session=s)
            if i % 4 == 0:
                by_rule = rule is not None and i % 8 == 0
                j.add("gate.decided", json.dumps({
                    "category": "bash", "tool": "Bash", "summary": _words(rng, 6), "decision": "allow",
                    "decided_by": "rule" if by_rule else "user", "rule_id": str(rule) if by_rule else None,
                    "wait_s": round(rng.random() * 20, 3), "tool_use_id": tool_id}), task=task, session=s,
                      tier="derived")
            j.add("stream.user", _tool_result(rng, s, tool_id), task=task, session=s, parent=call)
            if i % 25 == 24:
                j.add("stream.rate_limit_event", '{"type": "rate_limit_event", "rate_limit_info": {"status": "allowed", '
                      '"resetsAt": 1767225600, "rateLimitType": "five_hour"}, "session_id": "%s"}' % s, task=task, session=s)
            if i % 40 == 39:
                j.add("stream.system.status", '{"type": "system", "subtype": "status", "status": "requesting", '
                      '"session_id": "%s", "uuid": "%s"}' % (s, uuid.uuid4()), task=task, session=s)
            if i % 8 == 7:
                yield
        report = _words(rng, rng.randint(30, 200))
        j.add("stream.assistant", _assistant(rng, s, '{"text": %s, "type": "text"}' % json.dumps(report)),
              task=task, session=s)
        j.add("stream.result", _result(rng, s, report, task.body + 1), task=task, session=s)
        j.add("task.exited", _exited(rng, task, task.body * 2 + 4), task=task, session=s)
        yield

    def extractor(self, task: Task) -> Iterator[None]:
        j, rng, th, s = self.j, self.rng, task.thread, task.session_id
        worker = task.parent
        assert worker is not None
        self._open(task, "Distil this worker's run into a handoff.\n\n" + _words(rng, 160),
                   {"requested_by": None, "parent_task_id": str(worker.id)})
        j.add("task.spawned", _spawned(task, self.pid), task=task, session=s)
        j.add("stream.system.init", _init(s), task=task, session=s)
        handoff = {"goal": _words(rng, 10), "status": worker.status, "artifacts": [_words(rng, 2)],
                   "next_step": _words(rng, 8), "ruled_out": [{"approach": _words(rng, 6), "reason": _words(rng, 8)}],
                   "current_state": _words(rng, 20)}
        tool_id = f"toolu_{uuid.uuid4().hex[:20]}"
        call = j.add("stream.assistant", _assistant(rng, s, '{"id": "%s", "name": "StructuredOutput", "type": "tool_use", '
                                                      '"input": %s}' % (tool_id, json.dumps(handoff))), task=task, session=s)
        j.add("stream.user", _tool_result(rng, s, tool_id), task=task, session=s, parent=call)
        j.add("stream.result", _result(rng, s, "ok", 2), task=task, session=s)
        j.add("task.exited", _exited(rng, task, 6), task=task, session=s)
        j.add("handoff", json.dumps({**handoff, "contract": "petal-dispatch contract version 7", "raw_seq_range": [1, 2],
                                     "worker_task_id": str(worker.id), "extractor_task_id": str(task.id)}),
              task=worker, session=worker.session_id, project=th.project_id, tier="derived")
        j.add("policy.decision", json.dumps({"why": "a clean end", "action": "report", "budget": 0,
                                             "record": "handoff", "status": worker.status, "attempt": 1}),
              task=worker, session=th.id, tier="derived")
        yield


def plan(shape: Shape, rng: random.Random) -> list[Thread]:
    """Threads and their tasks: user turns, each dispatching a worker half the time; a worker brings its
    extractor, the harness's report turn and (interactive threads) the approval's turn."""
    projects = [uuid.uuid4() for _ in range(shape.projects)]
    threads: list[Thread] = []
    per_thread = shape.tasks / shape.threads
    made = 0
    for n in range(shape.threads):
        interactive = rng.random() < 0.7
        th = Thread(uuid.uuid4(), f"thread {n} {_words(rng, 3)}", "interactive" if interactive else "autonomous",
                    rng.choice(projects) if rng.random() < 0.3 else None, rng.random() < 0.2)
        budget = round(per_thread * (n + 1)) - made
        while len(th.tasks) < budget:
            turn = Task(uuid.uuid4(), "orchestrator", th, th.id, brief=_words(rng, rng.randint(5, 60)))
            turn.status = "failed" if rng.random() < 0.03 else "success"
            th.tasks.append(turn)
            th.steps.append(("turn", turn))
            if rng.random() < 0.5 and len(th.tasks) + 3 <= budget:
                w = Task(uuid.uuid4(), "worker", th, uuid.uuid4(), parent=turn, brief=_words(rng, rng.randint(10, 80)))
                w.question_id = uuid.uuid4() if interactive else None
                w.status = rng.choice(("success",) * 8 + ("failed", "partial"))
                x = Task(uuid.uuid4(), "extractor", th, uuid.uuid4(), parent=w)
                report = Task(uuid.uuid4(), "orchestrator", th, th.id,
                              brief=f"[harness] Worker {w.id} finished. Its handoff: {_words(rng, 40)}")
                th.tasks += [w, x, report]
                th.steps += [("worker", w), ("extractor", x), ("turn", report)]
        made += len(th.tasks)
        threads.append(th)
    return threads


def _fixed_events(threads: list[Thread]) -> int:
    """Records of everything but the workers' tool calls."""
    n = 0
    for th in threads:
        n += 1 + th.archived
        asks = 3 if th.mode == "interactive" else 0
        for t in th.tasks:
            if t.role == "orchestrator":
                workers = sum(1 for w in th.tasks if w.parent is t and w.role == "worker")
                n += 7 + workers * (3 + asks) + (t.status != "success")
            else:
                n += 5 if t.role == "worker" else 9
    return n


def size_workers(threads: list[Thread], shape: Shape, rng: random.Random) -> None:
    """Each worker's tool calls: log-normal, scaled so the journal comes to about `shape.events`."""
    workers = [t for th in threads for t in th.tasks if t.role == "worker"]
    if not workers:
        return
    rest = max(shape.events - _fixed_events(threads), 0)
    weights = [rng.lognormvariate(0, 1.2) for _ in workers]
    scale = sum(weights)
    # a tool call is 2 records, plus a gate decision every 4th and a status line now and then
    per_call = 2 + 1 / 4 + 1 / 25 + 1 / 40
    for w, weight in zip(workers, weights, strict=True):
        w.body = max(1, int(rest * weight / scale / per_call))


def _interleave(writer: Writer, threads: list[Thread], rng: random.Random, sink: Any) -> None:
    active: list[Iterator[None]] = []
    queue = iter(threads)
    while True:
        while len(active) < ACTIVE_THREADS:
            th = next(queue, None)
            if th is None:
                break
            active.append(writer.thread(th))
        if not active:
            break
        gen = rng.choice(active)
        if next(gen, StopIteration) is StopIteration:
            active.remove(gen)
        if len(writer.j.rows) >= CHUNK:
            sink("".join(writer.j.rows))
            writer.j.rows.clear()
    if writer.j.rows:
        sink("".join(writer.j.rows))
        writer.j.rows.clear()


def _copy(conn: psycopg.Connection[Any], table: str, columns: str, rows: list[tuple[Any, ...]]) -> None:
    with conn.cursor().copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def _ts(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S+00", time.gmtime(t))


def _rows(conn: psycopg.Connection[Any], threads: list[Thread], shape: Shape, writer: Writer) -> None:
    """The rows the journal names: projects, sessions, tasks, questions, approvals, chat, controls, rules."""
    projects = {th.project_id for th in threads if th.project_id}
    _copy(conn, "projects", "id, name, workdir, created_at",
          [(p, f"project-{i}", f"/srv/projects/{i}", _ts(EPOCH - shape.span_days * 86400)) for i, p in enumerate(projects)])
    sessions: list[tuple[Any, ...]] = []
    tasks: list[tuple[Any, ...]] = []
    questions: list[tuple[Any, ...]] = []
    approvals: list[tuple[Any, ...]] = []
    chat: list[tuple[Any, ...]] = []
    controls: list[tuple[Any, ...]] = []
    for th in threads:
        first, last = th.first or EPOCH, th.last or EPOCH
        turns = sum(1 for t in th.tasks if t.role == "orchestrator")
        sessions.append((th.id, th.project_id, "orchestrator", "archived" if th.archived else "idle", th.title, th.mode,
                         str(th.id), turns, _ts(first), _ts(last), "host-1"))
        controls.append((th.id, "create", json.dumps({"title": th.title, "mode": th.mode}), "done", _ts(first), _ts(first)))
        for t in th.tasks:
            start, end = t.first or first, t.last or first
            if t.role != "orchestrator":
                sessions.append((t.session_id, th.project_id, t.role, "idle", None, None, str(t.session_id), 1,
                                 _ts(start), _ts(end), "host-1"))
            tasks.append((t.id, th.project_id if t.role == "worker" else None, t.session_id,
                          t.parent.id if t.parent else None, t.role, t.brief[:2000], t.status, 0 if t.status == "success" else 1,
                          _ts(end), _ts(start), _ts(start), _ts(end), _ts(end), "host-1", 1))
            if t.role == "orchestrator":
                chat.append((uuid.uuid4(), th.id, t.brief, "delivered", "harness" if t.brief.startswith("[harness]") else "user",
                             _ts(start), _ts(start), _ts(start)))
            if t.question_id is not None:
                questions.append((t.question_id, f"approval-{t.id}", th.id, t.id, json.dumps([{"question": "Start it?"}]),
                                  "answered", json.dumps({"Start it?": "Approve"}), "harness", _ts(start), _ts(start), "open"))
                approvals.append((t.id, th.id, t.question_id, "resolved", "approved", _ts(start), _ts(start)))
    _copy(conn, "sessions", "id, project_id, role, lifecycle, title, mode, substrate_session_id, turns, created_at, "
          "updated_at, executor_name", sessions)
    _copy(conn, "tasks", "id, project_id, session_id, parent_task_id, role, brief, status, exit_code, last_output_at, "
          "created_at, started_at, ended_at, settled_at, executor_name, executor_epoch", tasks)
    _copy(conn, "questions", "id, tool_use_id, source_session_uuid, task_id, questions, status, answers, asked_by, "
          "created_at, answered_at, answered_by", questions)
    _copy(conn, "approvals", "task_id, thread_id, question_id, status, decision, created_at, resolved_at", approvals)
    _copy(conn, "chat_queue", "id, thread_id, text, status, origin, created_at, claimed_at, done_at", chat)
    _copy(conn, "thread_control_queue", "thread_id, action, args, status, created_at, done_at", controls)
    _copy(conn, "gate_rules", "id, scope, session_id, tool_name, pattern, decision, category, created_by, created_at",
          [(rule, "thread", th, "Bash", "npm test", "allow", "bash", "open", _ts(EPOCH - 86400))
           for th, rule in writer.gate_rules.items()])


def _open_now(conn: psycopg.Connection[Any], threads: list[Thread]) -> None:
    """What is open now: the same handful at any size (see the module's docstring)."""
    newest = threads[-1]
    turn = newest.tasks[-1] if newest.tasks else None
    for i in range(OPEN_PENDING_ASKS):
        th = threads[-1 - i % len(threads)]
        conn.execute("INSERT INTO questions (tool_use_id, source_session_uuid, task_id, questions, asked_by) "
                     "VALUES (%s, %s, NULL, %s, 'model')", (f"toolu_open_{i}", th.id, json.dumps([{"question": f"open {i}?"}])))
    for i in range(OPEN_PENDING_CHAT):
        conn.execute("INSERT INTO chat_queue (thread_id, text, origin) VALUES (%s, %s, 'user')", (newest.id, f"waiting {i}"))
    if turn is not None:
        # a turn waiting to run, and an end not yet settled (what the claim and the settler find)
        conn.execute("INSERT INTO tasks (session_id, role, brief, status) VALUES (%s, 'orchestrator', 'next', 'pending')",
                     (newest.id,))
        conn.execute("UPDATE tasks SET settled_at = NULL WHERE id = %s", (turn.id,))


def seed(dsn: str, shape: Shape = Shape(), *, rebuild_indexes: bool = False, quiet: bool = True) -> Seeded:
    """Seed a migrated database (empty journal) to `shape`; returns what was written."""
    rng = random.Random(shape.seed)
    started = time.monotonic()
    threads = plan(shape, rng)
    size_workers(threads, shape, rng)
    journal = Journal(shape, shape.events)
    writer = Writer(shape, rng, journal)
    for i, th in enumerate(threads):
        if i % 10 == 3:
            writer.gate_rules[th.id] = uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT last_seq FROM journal_head").fetchone() != (0,):
            raise RuntimeError("seed_store needs an empty journal")
        conn.execute("SET session_replication_role = replica")
        conn.execute("SET maintenance_work_mem = '512MB'")
        dropped: list[str] = []
        if rebuild_indexes:
            dropped = [r[1] for r in conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'journal' AND indexname NOT IN "
                "(SELECT conname FROM pg_constraint WHERE conrelid = 'journal'::regclass)").fetchall()]
            for name, in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'journal' AND indexname NOT IN "
                                      "(SELECT conname FROM pg_constraint WHERE conrelid = 'journal'::regclass)").fetchall():
                conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))
        written = [0]
        with conn.transaction(), conn.cursor().copy(
                "COPY journal (event_id, seq, project_id, session_id, task_id, parent_id, message_id, event_type, "
                "tier, created_at, payload) FROM STDIN") as copy:
            def sink(text: str) -> None:
                copy.write(text)
                written[0] += 1
                if not quiet and written[0] % 100 == 0:
                    print(f"  {journal.seq:,} events, {time.monotonic() - started:.0f} s", flush=True)
            _interleave(writer, threads, rng, sink)
        with conn.transaction():
            _rows(conn, threads, shape, writer)
            conn.execute("UPDATE journal_head SET last_seq = %s", (journal.seq,))
            _open_now(conn, threads)
        for ddl in dropped:
            if not quiet:
                print(f"  {ddl}", flush=True)
            conn.execute(ddl)
        # as autovacuum leaves them: statistics, and the visibility map index-only scans read
        conn.execute("VACUUM ANALYZE journal, tasks, sessions, questions, approvals, chat_queue, "
                     "thread_control_queue, gate_rules, projects")
        journal_bytes = conn.execute("SELECT pg_total_relation_size('journal')").fetchone()[0]  # type: ignore[index]
    workers = [t for th in threads for t in th.tasks if t.role == "worker"]
    long_worker = max(workers, key=lambda t: t.body) if workers else threads[-1].tasks[0]
    busiest = max(threads, key=lambda th: len(th.tasks))
    return Seeded(journal.seq, sum(len(th.tasks) for th in threads), len(threads), time.monotonic() - started,
                  [th.id for th in threads], [w.id for w in workers], long_worker.id, threads[-1].id, busiest.id,
                  journal_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True, help="a superuser DSN of a migrated database with an empty journal")
    parser.add_argument("--events", type=int, default=Shape.events)
    parser.add_argument("--tasks", type=int, default=Shape.tasks)
    parser.add_argument("--threads", type=int, default=Shape.threads)
    args = parser.parse_args()
    shape = Shape(events=args.events, tasks=args.tasks, threads=args.threads)
    s = seed(args.dsn, shape, rebuild_indexes=args.events >= 1_000_000, quiet=False)
    print(f"seeded {s.events:,} events, {s.tasks:,} tasks, {s.threads:,} threads in {s.seconds:.0f} s; "
          f"journal {s.journal_bytes / 2**30:.2f} GiB ({s.journal_bytes / max(s.events, 1):.0f} bytes per event)")


if __name__ == "__main__":
    main()
