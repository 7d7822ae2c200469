"""Hard gates end to end: threads, the real CLI with the permission path, the harness's gate tool, the Asks
panel, standing rules (real PostgreSQL, the real claude CLI, the scripted model playing every role)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from executor import gates
from executor.harness import permission
from executor.settle import briefs
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests.harness import Harness, running_executor
from tests.pg import DB
from tests.resilience import settled
from tests.scenarios import dispatch, extractor, handoff, one_worker
from tests.served import ingress_server
from tests.wait import until



def _bash(command: str) -> dict[str, Any]:
    return {"tool_use": {"name": "Bash", "input": {"command": command}}}


# the extractor's handoff for a worker that did what the gates allowed
DONE = handoff("the step", "done what was allowed", next_step="see the gates")


async def _thread(http: httpx.AsyncClient, mode: str) -> str:
    made = await http.post("/api/threads", json={"title": mode, "mode": mode})
    assert made.status_code == 202, made.text
    return str(made.json()["thread_id"])


async def _approved(http: httpx.AsyncClient) -> str:
    """An interactive thread whose first turn dispatched a worker, approved: returns the thread's id."""
    thread = await _thread(http, "interactive")
    await http.post("/api/chat", json={"text": "go", "thread_id": thread})
    await _answer(http, await until(lambda: _card(http, "start a worker"), "the dispatch card"), briefs.APPROVE)
    return thread


async def _worker(h: Harness) -> dict[str, Any] | None:
    cur = await (await h._conn()).execute("SELECT id FROM tasks WHERE role = 'worker' ORDER BY created_at LIMIT 1")
    row = await cur.fetchone()
    return await h.task(row[0]) if row else None


async def _card(http: httpx.AsyncClient, needle: str) -> dict[str, Any] | None:
    asks = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
    return next((a for a in asks if needle in a["questions"][0]["question"]), None)


async def _answer(http: httpx.AsyncClient, ask: dict[str, Any], label: str | None = None,
                  response: str | None = None) -> None:
    body: dict[str, Any] = {"response": response} if response else {}
    if label:
        body["answers"] = {ask["questions"][0]["question"]: label}
    answered = await http.post(f"/api/asks/{ask['id']}/answer", json=body)
    assert answered.status_code == 200, answered.text


def _tool_results(events: list[Any]) -> dict[str, str]:
    """tool_use_id → the text the model got back."""
    out = {}
    for e in events:
        if e.event_type == "stream.user":
            content = (e.payload.get("message") or {}).get("content")
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    out[block["tool_use_id"]] = json.dumps(block.get("content"))
    return out


def _commands(events: list[Any]) -> list[tuple[str, str]]:
    """(tool_use_id, command) of every Bash call, in order."""
    return [(b["id"], b["input"]["command"]) for e in events if e.event_type == "stream.assistant"
            for b in e.payload["message"]["content"] if isinstance(b, dict) and b.get("type") == "tool_use"
            and b.get("name") == "Bash"]


GATED = [  # one per seed category, then compounds hiding a gated part
    ("rm -rf sentinel-dir", "destructive"),
    ("touch ../outside.txt", "outside_tree"),
    ("sudo true", "privilege_escalation"),
    ("ufw allow 8080", "network_config"),
    ("cat ~/.ssh/id_rsa", "secrets"),
    ("git push origin main", "git_beyond_branch"),
    ("pip install requests", "dependency"),
    ("systemctl restart nginx", "cross_service"),
    ("ls && sudo true", "privilege_escalation"),
    ('bash -c "git push origin main"', "git_beyond_branch"),
    ("echo $(cat ~/.ssh/id_rsa)", "secrets"),
]


async def test_an_autonomous_worker_runs_the_benign_calls_and_every_gated_one_is_refused_and_listed(
        db: DB, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "sentinel-dir").mkdir(parents=True)
    (work / "sentinel-dir" / "keep").write_text("keep")
    # the model cannot use the gate tool itself to make a card or a refusal of its own
    direct = {"tool_use": {"name": "mcp__harness__permission_prompt", "input": {
        "tool_name": "Bash", "input": {"command": "sudo true"}, "tool_use_id": "toolu_made_up"}}}
    replies = [_bash("ls"), _bash("touch made-here.txt"), *[_bash(c) for c, _ in GATED], direct, {"text": "done"}]
    scenario = one_worker("gate run", *replies, result=DONE)
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, extract=True) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = await _thread(http, "autonomous")
            await http.post("/api/chat", json={"text": "run the gates", "thread_id": thread})
            worker = await until(lambda: _worker(h), "the worker")
            final = await h.wait_final(worker["id"], timeout=180)
            handoff = (await h.wait_event(worker["id"], "handoff", timeout=120)).payload
            events = await h.events(worker["id"])

    assert final["status"] == "gated"
    assert (work / "sentinel-dir" / "keep").exists()
    assert not (tmp_path / "outside.txt").exists()
    assert (work / "made-here.txt").exists()  # an edit inside the tree ran without a card
    calls = _commands(events)
    results = _tool_results(events)
    assert [c for _, c in calls] == ["ls", "touch made-here.txt", *[c for c, _ in GATED]]
    assert "sentinel-dir" in results[calls[0][0]]
    for tool_use_id, command in calls[2:]:
        assert "Refused at the hard gate" in results[tool_use_id] and "stay within the task's scope" in \
            results[tool_use_id].lower(), command
    [direct_id] = [b["id"] for e in events if e.event_type == "stream.assistant"
                   for b in e.payload["message"]["content"] if b.get("name") == "mcp__harness__permission_prompt"]
    # the CLI hides its permission prompt tool from the model (the tool also refuses a call whose request
    # id is not the call it asks about)
    assert "No such tool available" in results[direct_id] or permission.NOT_FOR_THE_MODEL in results[direct_id]
    decided = [e.payload for e in events if e.event_type == "gate.decided"]
    assert [(d["summary"], d["category"], d["decision"], d["decided_by"]) for d in decided] == [
        (f"Bash: {c}", cat, "deny", "autonomous_policy") for c, cat in GATED]
    assert [(g["category"], g["tool"], g["summary"], g["decision"], g["decided_by"])
            for g in handoff["gate_decisions"]] == [(cat, "Bash", f"Bash: {c}", "deny", "autonomous_policy")
                                                    for c, cat in GATED]
    assert handoff["status"] == "gated"


async def test_an_interactive_worker_asks_and_runs_only_what_the_user_allows(db: DB, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir(parents=True)
    for name in ("sentinel-a", "sentinel-b", "sentinel-c"):
        (work / name).write_text(name)
    log = work / ".env"  # a write the secrets gate asks about, inside the tree (the sandbox keeps any other)
    replies = [_bash("rm -f sentinel-a"), _bash("rm -f sentinel-b"), _bash("rm -f sentinel-c"),
               _bash("echo run >> .env"), _bash("echo run >> .env"), {"text": "done"}]
    scenario = one_worker("asking run", *replies)
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = await _approved(http)
            card = await until(lambda: _card(http, "rm -f sentinel-a"), "the first gate card")
            question = card["questions"][0]
            assert "destructive data op" in question["question"]
            assert "rm -f sentinel-a" in question["options"][0]["preview"]
            assert [o["label"] for o in question["options"]] == [
                permission.ALLOW_ONCE, permission.ALLOW_TASK, permission.ALLOW_THREAD,
                permission.DENY]
            worker = await _worker(h)
            assert worker is not None and worker["activity"] == "awaiting_user"
            await _answer(http, card, permission.DENY)
            card = await until(lambda: _card(http, "rm -f sentinel-b"), "the second gate card")
            await _answer(http, card, response="keep b: it is a fixture")
            card = await until(lambda: _card(http, "rm -f sentinel-c"), "the third gate card")
            await _answer(http, card, permission.ALLOW_ONCE)
            card = await until(lambda: _card(http, "echo run >> .env"), "the fourth gate card")
            await _answer(http, card, permission.ALLOW_TASK)
            final = await h.wait_final(worker["id"], timeout=120)
            events = await h.events(worker["id"])
            asks = (await http.get("/api/asks", params={"limit": 50})).json()["asks"]
            rules = (await http.get("/api/gate-rules", params={"thread_id": thread})).json()["rules"]

    assert (work / "sentinel-a").exists() and (work / "sentinel-b").exists()
    assert not (work / "sentinel-c").exists()
    assert log.read_text() == "run\nrun\n"  # allowed for the task: the identical second call ran unasked
    assert len([a for a in asks if a["tool_use_id"].startswith(gates.CARD_PREFIX)]) == 4
    results = _tool_results(events)
    calls = _commands(events)
    assert "the user refused it" in results[calls[0][0]]
    assert "keep b: it is a fixture" in results[calls[1][0]]
    decided = [(e.payload["summary"], e.payload["decision"], e.payload["decided_by"]) for e in events
               if e.event_type == "gate.decided"]
    assert decided == [("Bash: rm -f sentinel-a", "deny", "user"), ("Bash: rm -f sentinel-b", "deny", "user"),
                       ("Bash: rm -f sentinel-c", "allow", "user"), ("Bash: echo run >> .env", "allow", "user"),
                       ("Bash: echo run >> .env", "allow", "rule")]
    assert final["status"] == "gated"  # the user's refusals are gates that fired
    [rule] = rules
    assert (rule["scope"], rule["pattern"], rule["uses"]) == ("task", "echo run >> .env", 1)


async def test_an_executor_restart_while_a_card_waits_refuses_the_call_and_nothing_runs(
        db: DB, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir(parents=True)
    (work / "sentinel").write_text("keep")
    scenario = one_worker("restart run", _bash("rm -f sentinel"), {"text": "done"})
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = await _thread(http, "interactive")
            await http.post("/api/chat", json={"text": "go", "thread_id": thread})
            await _answer(http, await until(lambda: _card(http, "start a worker"), "the dispatch card"),
                          briefs.APPROVE)
            card = await until(lambda: _card(http, "rm -f sentinel"), "the gate card")
            worker = await _worker(h)
            assert worker is not None
        # the executor stopped with the card open; a new one starts on the same store
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            final = await h.wait_final(worker["id"])
            events = await h.events(worker["id"])
            late = await http.post(f"/api/asks/{card['id']}/answer",
                                   json={"answers": {card["questions"][0]["question"]: permission.ALLOW_ONCE}})
    assert (work / "sentinel").exists()
    assert final["status"] in ("cancelled", "crashed")
    [decided] = [e.payload for e in events if e.event_type == "gate.decided"]
    assert (decided["decision"], decided["decided_by"]) == ("deny", "harness_stopped")
    assert late.status_code == 409  # the card is closed: a late approval cannot run anything


async def test_a_card_nobody_answers_times_out_as_a_refusal_saying_so(db: DB, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir(parents=True)
    (work / "sentinel").write_text("keep")
    scenario = one_worker("timeout run", _bash("rm -f sentinel"), {"text": "done"})
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, ask_timeout_s=4) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = await _thread(http, "interactive")
            await http.post("/api/chat", json={"text": "go", "thread_id": thread})
            await _answer(http, await until(lambda: _card(http, "start a worker"), "the dispatch card"),
                          briefs.APPROVE)
            worker = await until(lambda: _worker(h), "the worker")
            final = await h.wait_final(worker["id"])
            events = await h.events(worker["id"])
    assert (work / "sentinel").exists() and final["status"] == "gated"
    [decided] = [e.payload for e in events if e.event_type == "gate.decided"]
    assert (decided["decision"], decided["decided_by"]) == ("deny", "timeout")
    [(tool_use_id, _)] = _commands(events)
    assert "approval timed out" in _tool_results(events)[tool_use_id]


async def test_a_standing_rule_asked_for_through_the_api_allows_the_call_in_its_thread_until_revoked(
        db: DB, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir(parents=True)
    scenario = Scenario(rules=[
        Rule(role="orchestrator", match_last="[harness]", replies=[{"text": "noted"}]),
        # replies are indexed by the tool results the conversation carries: the first turn's dispatch is one
        Rule(role="orchestrator", match_last="second",
             replies=[{"text": "-"}, dispatch("rule run 2"), {"text": "dispatched"}]),
        Rule(role="orchestrator", replies=[dispatch("rule run 1"), {"text": "dispatched"}]),
        Rule(role="worker", match="rule run", replies=[_bash("echo ran >> .env"), {"text": "done"}]),
        extractor(DONE),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, extract=True) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = await _thread(http, "autonomous")
            # bad input is refused and queues nothing
            for bad in ({"pattern": "x"}, {"pattern": " ", "thread_id": thread},
                        {"pattern": "x", "thread_id": thread, "tool_name": "Nope"},
                        {"pattern": "x", "thread_id": thread, "project_id": thread}):
                refused = await http.post("/api/gate-rules", json=bad)
                assert refused.status_code == 422, (bad, refused.text)
            queued = await http.post("/api/gate-rules", json={"pattern": "echo ran >> .env",
                                                               "thread_id": thread})
            assert queued.status_code == 202, queued.text

            async def made() -> list[dict[str, Any]] | None:
                return (await http.get("/api/gate-rules", params={"thread_id": thread})).json()["rules"] or None
            [rule] = await until(made, "the executor to make the rule")
            assert (rule["scope"], rule["tool_name"], rule["decision"]) == ("thread", "Bash", "allow")
            await http.post("/api/chat", json={"text": "first", "thread_id": thread})
            first = await until(lambda: _worker(h), "the first worker")
            assert (await h.wait_final(first["id"]))["status"] == "success"
            # a clean run's handoff still lists the gate its call passed, and by what
            handoff = (await h.wait_event(first["id"], "handoff")).payload
            assert [(g["summary"], g["decision"], g["decided_by"]) for g in handoff["gate_decisions"]] == [
                ("Bash: echo ran >> .env", "allow", "rule")]

            revoked = await http.delete(f"/api/gate-rules/{rule['id']}")
            assert revoked.status_code == 200 and revoked.json()["revoked_at"]
            assert (await http.delete(f"/api/gate-rules/{rule['id']}")).status_code == 409
            assert (await http.delete(f"/api/gate-rules/{thread}")).status_code == 404
            await http.post("/api/chat", json={"text": "second", "thread_id": thread})

            async def second() -> dict[str, Any] | None:
                cur = await (await h._conn()).execute(
                    "SELECT id FROM tasks WHERE role = 'worker' AND brief LIKE 'rule run 2%%'")
                row = await cur.fetchone()
                return await h.task(row[0]) if row else None
            later = await until(second, "the second worker")
            assert (await h.wait_final(later["id"]))["status"] == "gated"
            listed = (await http.get("/api/gate-rules", params={"thread_id": thread, "revoked": "true"})).json()
            decided = [e.payload for e in await h.events() if e.event_type == "gate.decided"]
    assert (tmp_path / "work" / ".env").read_text() == "ran\n"  # only while the rule was live
    assert [(d["decision"], d["decided_by"]) for d in decided] == [("allow", "rule"), ("deny", "autonomous_policy")]
    assert listed["rules"][0]["uses"] == 1 and listed["rules"][0]["revoked_at"]


async def test_an_executor_killed_while_a_card_waits_leaves_the_call_refused_and_the_refusal_recorded(
        db: DB, tmp_path: Path) -> None:
    import signal

    from tests.fault.test_executor_process import _executor_env, _spawn_executor

    work = tmp_path / "work"
    work.mkdir(parents=True)
    (work / "sentinel").write_text("keep")
    scenario = one_worker("killed run", _bash("rm -f sentinel"), {"text": "done"})
    with ScriptedModelServer(scenario) as model:
        async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            first = _spawn_executor(_executor_env(db, model, tmp_path), tmp_path / "executor1.log")
            try:
                thread = await _thread(http, "interactive")
                await http.post("/api/chat", json={"text": "go", "thread_id": thread})
                await _answer(http, await until(lambda: _card(http, "start a worker"), "the dispatch card"),
                              briefs.APPROVE)
                card = await until(lambda: _card(http, "rm -f sentinel"), "the gate card")
            finally:
                first.send_signal(signal.SIGKILL)
                first.wait(10)
            async with running_executor(db, model, tmp_path) as h:
                async def recorded() -> list[dict[str, Any]] | None:
                    return [e.payload for e in await h.events() if e.event_type == "gate.decided"] or None
                [decided] = await until(recorded, "the refusal to be recorded")
                worker = await _worker(h)
                late = await http.post(f"/api/asks/{card['id']}/answer", json={
                    "answers": {card["questions"][0]["question"]: permission.ALLOW_ONCE}})
    assert (work / "sentinel").exists()
    assert worker is not None and (worker["status"], worker["status_reason"]) == ("crashed", "executor_restart")
    assert (decided["decision"], decided["decided_by"], decided["category"], decided["summary"]) == (
        "deny", "executor_restart", "destructive", "Bash: rm -f sentinel")
    assert late.status_code == 409


async def test_the_context_view_lists_the_thread_s_standing_rules_adds_one_and_revokes_it(
        db: DB, tmp_path: Path) -> None:
    from playwright.async_api import expect

    from shared import threads
    from tests.web.test_web_client import browser, page_at

    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"text": "hello"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, ingress_server(db.ingress_dsn) as url, \
                httpx.AsyncClient(base_url=url) as http, browser() as b:
            await http.post("/api/chat", json={"text": "make the default thread"})

            async def default_thread() -> bool:
                listed = (await http.get("/api/threads")).json()["threads"]
                return any(t["id"] == str(threads.DEFAULT_THREAD_ID) for t in listed)
            await until(default_thread, "the default thread")
            # its first turn ended and settled: its end would re-render the view (and the input the rule is
            # typed into) between the fill and the click
            await settled(db.admin_dsn, timeout=60)
            async with page_at(b, url) as page:
                await page.click("a[data-tab='context']")
                await expect(page.locator("#context-body")).to_contain_text("No standing rules.")
                await page.fill(".gate-rule-add input", "npm test:*")
                await page.click(".gate-rule-add button")
                rule = page.locator("#context-body li", has_text="Bash: npm test:*")
                await expect(rule).to_contain_text("thread, used 0×", timeout=20_000)
                await rule.locator("button", has_text="Revoke").click()
                await expect(page.locator("#context-body")).to_contain_text("No standing rules.", timeout=20_000)
            cur = await (await h._conn()).execute("SELECT pattern, scope, revoked_at IS NOT NULL FROM gate_rules")
            rows = await cur.fetchall()
    assert rows == [("npm test:*", "thread", True)]
