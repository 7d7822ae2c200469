"""Several executors (separate processes) on one database: spread and placement, same-name refusal,
failover of a killed executor, fencing of a paused one, and the notifier running once for the fleet."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg

from executor.settle import dispatch
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared import journal, threads
from shared.database import Database
from shared.models import NewEvent
from tests.pg import DB, lock_waiter
from tests.push_standin import StandIn
from tests.resilience import check_invariants, settled
from tests.fault.test_executor_process import _executor_env, _task_processes
from tests.fault.test_resilience import post_chat
from tests.harness import worker
from tests import tables
from tests.wait import until
from tests.scenarios import STALL_FOREVER, handoff, one_worker
from tests.served import free_port, ingress_server

LEASE_S = 3.0


def _repo(path: Path) -> Path:
    path.mkdir(parents=True)
    for args in (["init", "--quiet", "-b", "main"], ["commit", "--quiet", "--allow-empty", "-m", "start"]):
        subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
                       check=True, capture_output=True)
    return path


def _env(db: DB, model: ScriptedModelServer, tmp: Path, name: str, **extra: str) -> dict[str, str]:
    env = _executor_env(db, model, tmp)
    env.update(PETAL_EXECUTOR_NAME=name, PETAL_DATA_DIR=str(tmp / f"var-{name}"), PETAL_MCP_PORT=str(free_port()),
               PETAL_LEASE_S=str(LEASE_S), PETAL_MAX_WORKERS="4")
    env.update(extra)
    return env


class Fleet:
    def __init__(self, db: DB, model: ScriptedModelServer, tmp: Path):
        self.db, self.model, self.tmp = db, model, tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def log(self, name: str) -> Path:
        return self.tmp / f"executor-{name}.log"

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{self.log(n).read_text()[-2500:]}" for n in self.procs)

    async def start(self, name: str, **extra: str) -> subprocess.Popen[bytes]:
        with self.log(name).open("ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "petal_dispatch.cli", "executor"],
                                    env=_env(self.db, self.model, self.tmp, name, **extra),
                                    stdout=out, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        await self.until(lambda: tables.joined(self.db.admin_dsn, name), f"executor {name} joined")
        return proc

    async def until(self, check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
        return await until(check, lambda: f"{what}\n{self.logs()}", timeout)

    async def dispatch(self, n: int = 1, **kw: Any) -> list[uuid.UUID]:
        async with Database(self.db.executor_dsn, name="test-dispatcher", max_size=1) as d:
            return [await dispatch.request(d.pool, worker(f"job {i}", workdir=self.tmp / "work", **kw))
                    for i in range(n)]

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()  # reaped below: a Popen collected while its child runs warns, failing a later test
                proc.wait(10)


async def test_eight_workers_spread_over_two_executors_within_capacity_labels_placed_and_a_namesake_refused(
    db: DB, tmp_path: Path
) -> None:
    with ScriptedModelServer(Scenario.single(STALL_FOREVER)) as model:
        fleet = Fleet(db, model, tmp_path)
        try:
            await fleet.start("alpha")
            await fleet.start("beta", PETAL_EXECUTOR_LABELS="gpu, linux")
            project = uuid.uuid4()
            repo = _repo(tmp_path / "repo")  # a project is a git repository: its workers get worktrees of it
            # its workdir lives on alpha's machine
            tables.insert(db.admin_dsn, "projects", id=project, name="p", workdir=str(repo), executor_name="alpha")
            gpu = await fleet.dispatch(2, labels=["gpu"])
            (in_project,) = await fleet.dispatch(project_id=project)
            plain = await fleet.dispatch(5)
            await fleet.until(lambda: tables.count_running(db.admin_dsn) == 8, "eight running")
            by_executor = Counter(n for (n,) in tables.tasks(db.admin_dsn, "executor_name", status="running"))
            placed = dict(tables.tasks(db.admin_dsn, "id", "executor_name"))
            spawned = {t: (p["executor"], int(p["executor_epoch"]))
                       for t, p in tables.records(db.admin_dsn, "task_id", "payload", event_type="task.spawned")}
            epochs = tables.epochs(db.admin_dsn)
            # a second executor named alpha (--name over the environment) refuses to run, in one line, and
            # changes nothing
            same = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "executor", "--name", "alpha"],
                                  capture_output=True, timeout=60, env=_env(db, model, tmp_path, "gamma"))
            epochs_after = tables.epochs(db.admin_dsn)
            status = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "status"], capture_output=True, timeout=60,
                                    env=_env(db, model, tmp_path, "alpha"), text=True)
            async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
                listed = (await http.get("/api/executors")).json()["executors"]
        finally:
            fleet.stop_all()
    assert by_executor == {"alpha": 4, "beta": 4}
    assert all(placed[t] == "beta" for t in gpu) and placed[in_project] == "alpha"
    assert all(spawned[t] == (placed[t], epochs[placed[t]]) for t in [*gpu, in_project, *plain])
    assert same.returncode != 0
    err = same.stderr.decode().strip().splitlines()
    assert err[-1].startswith("petal-dispatch: another executor named 'alpha' is already running"), err
    # refused before any loop ran under alpha's name: no harness server, no threads, sessions or routines
    assert not [line for line in err if "session manager started" in line or "claude_sessions" in line], err
    assert epochs_after == epochs
    assert "alpha" in status.stdout and "beta" in status.stdout and "4/4" in status.stdout, status.stdout
    assert [(x["name"], x["state"], x["load"], x["capacity"], x["labels"]) for x in listed] == [
        ("alpha", "live", 4, 4, []), ("beta", "live", 4, 4, ["gpu", "linux"])]
    assert all(x["lease_age_s"] < LEASE_S and x["version"] for x in listed)


def _worker_reached_model(model: ScriptedModelServer) -> bool:
    return any(r.role == "worker" for r in model.requests)


async def test_a_killed_executors_tasks_crash_as_executor_lost_within_its_lease_and_are_retried_on_another(
    db: DB, tmp_path: Path
) -> None:
    # the first run hangs; the retry finishes
    scenario = one_worker("a long job", {"text": "finished on the retry"}, first_run=[STALL_FOREVER],
                          result=handoff("a long job"))
    # one CLI config directory for both (a shared mount): the thread's next turn may run on the survivor
    shared = {"PETAL_SHARED_CLAUDE_CONFIG": "1"}
    with ScriptedModelServer(scenario) as model:
        fleet = Fleet(db, model, tmp_path)
        try:
            async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
                alpha = await fleet.start("alpha", **shared)
                thread = (await http.post("/api/threads", json={"mode": "autonomous"})).json()["thread_id"]
                await post_chat(http, "run the long job", thread)
                await fleet.until(lambda: _worker_reached_model(model), "the worker reached the model", timeout=90)
                await fleet.start("beta", **shared)
                ((task,),) = tables.tasks(db.admin_dsn, "id", role="worker")
                alpha.send_signal(signal.SIGKILL)
                alpha.wait(10)
                await fleet.until(lambda: tables.task(db.admin_dsn, task, "status_reason") == ("executor_lost",),
                                  "crashed as executor_lost", timeout=LEASE_S + 5)
                await settled(db.admin_dsn, timeout=120)
            # the takeover's timing, all from the database's clock: alpha's last renewal (before its death),
            # the lease that renewal gave, when beta declared it lost and when the task's end was written
            renewed, lease_until, lost_at = tables.executor(db.admin_dsn, "alpha", "renewed_at", "lease_until",
                                                            "lost_at")
            (ended,) = tables.task(db.admin_dsn, task, "ended_at")
            ((journaled,),) = tables.records(db.admin_dsn, "created_at", task_id=task, event_type="task.crashed")
            workers = tables.tasks(db.admin_dsn, "status", "status_reason", "attempt", "executor_name", role="worker")
            lost = tables.payloads(db.admin_dsn, "executor.lost")
            states = {name: lost is not None for name, lost in tables.executors(db.admin_dsn, "name", "lost_at")}
            alerts = tables.rows(db.admin_dsn, "notifications", "title", kind="executor_lost")
        finally:
            fleet.stop_all()
    check_invariants(db.admin_dsn)  # gap-free journal, nothing stuck, no question left open
    # taken over once the lease ran out, never before, and within about 1.5 leases of the last renewal
    # (the lease, then at most one of the survivor's renew-and-reap intervals, a third of a lease)
    assert lease_until <= lost_at == ended, (lease_until, lost_at, ended)
    assert (ended - renewed).total_seconds() <= 1.5 * LEASE_S, (renewed, ended)
    # its record says when it happened, as the task's row does (not when the journal got round to it)
    assert journaled == ended, (journaled, ended)
    assert workers == [("crashed", "executor_lost", 1, "alpha"), ("success", "completed", 2, "beta")]
    assert len(lost) == 1 and lost[0]["name"] == "alpha" and lost[0]["crashed_tasks"] == [str(task)]
    assert lost[0]["taken_over_by"] == "beta"
    assert states == {"alpha": True, "beta": False}
    assert alerts == [("Executor alpha lost",)]  # an alert, like a stalled task


async def test_a_paused_executor_taken_over_is_fenced_when_it_wakes_its_late_writes_refused_its_processes_killed(
    db: DB, tmp_path: Path
) -> None:
    scenario = Scenario(rules=[Rule(role="worker", sessions=1, replies=[STALL_FOREVER]),
                               Rule(role="worker", replies=[{"text": "done on the survivor"}])])
    with ScriptedModelServer(scenario) as model:
        fleet = Fleet(db, model, tmp_path)
        try:
            alpha = await fleet.start("alpha", PETAL_BACKOFF_BASE_S="0")
            (task,) = await fleet.dispatch()
            await fleet.until(lambda: _worker_reached_model(model), "the worker reached the model")
            (old_epoch,) = tables.executor(db.admin_dsn, "alpha", "epoch")
            await fleet.start("beta", PETAL_BACKOFF_BASE_S="0")
            alpha.send_signal(signal.SIGSTOP)  # a paused VM: its claude runs on, its lease does not
            await fleet.until(lambda: tables.task(db.admin_dsn, task, "status_reason") == ("executor_lost",),
                              "taken over", timeout=LEASE_S + 10)
            assert _task_processes(task), "the paused executor's worker is still there"
            ((crashed_seq,),) = tables.records(db.admin_dsn, "seq", task_id=task, event_type="task.crashed")
            alpha.send_signal(signal.SIGCONT)
            await fleet.until(lambda: not _task_processes(task), "the fenced run's processes stopped", timeout=30)
            await fleet.until(lambda: tables.count_events(db.admin_dsn, "executor.fenced"), "alpha rejoined", timeout=30)
            await asyncio.sleep(LEASE_S)  # room for any late write to land (it must not)
            row = tables.task(db.admin_dsn, task, "status", "status_reason", "executor_name", "executor_epoch")
            late = tables.event_types(db.admin_dsn, task, after=crashed_seq)
            new_epoch = tables.executors(db.admin_dsn, "epoch", name="alpha", lost_at=None)
            spawns = [t for t, n in Counter(t for (t,) in tables.records(
                db.admin_dsn, "task_id", event_type="task.spawned")).items() if n > 1]
            alive = alpha.poll() is None
            # the rejoined executor claims again
            (after,) = await fleet.dispatch(executor="alpha")
            await fleet.until(lambda: tables.status(db.admin_dsn, after) == "success",
                              "the rejoined executor ran a new task", timeout=90)
        finally:
            fleet.stop_all()
    assert row == ("crashed", "executor_lost", "alpha", old_epoch)  # its own end was refused
    assert late == [], late  # not one line of the fenced run after the end the survivor wrote
    assert len(new_epoch) == 1 and new_epoch[0][0] > old_epoch and alive
    assert spawns == []  # no task ran twice


async def test_one_question_is_pushed_once_by_the_fleet_and_still_once_after_the_notifiers_holder_dies(
    db: DB, tmp_path: Path
) -> None:
    tasks = [uuid.uuid4() for _ in range(2)]
    with psycopg.connect(db.admin_dsn) as conn:
        for t in tasks:
            tables.insert_task(conn, id=t, brief="a job", status="success")
    with StandIn() as ntfy, ScriptedModelServer(Scenario.single({"text": "x"})) as model:
        fleet = Fleet(db, model, tmp_path)
        extra = {"PETAL_NTFY_URL": f"{ntfy.url}/topic"}
        try:
            await fleet.start("alpha", **extra)
            await fleet.start("beta", **extra)

            async def stalled(task_id: uuid.UUID) -> None:
                async with Database(db.executor_dsn, name="test-journal", max_size=1) as d, \
                        d.pool.connection() as conn:
                    await journal.append_on(conn, [NewEvent("task.stalled", {"silent_s": 200, "threshold_s": 180},
                                                            task_id=task_id)])

            def holder() -> str | None:
                return next(iter(tables.advisory_holders(db.admin_dsn, "petal-duty:notifier:%")), None)

            first_holder = await fleet.until(holder, "a notifier holds the duty")
            await stalled(tasks[0])
            await asyncio.to_thread(ntfy.wait_for, 1)
            await asyncio.sleep(3)  # a second notifier would have sent by now
            first = sum(r.headers["title"] == "A worker stalled" for r in ntfy.received)
            fleet.procs[first_holder.rsplit(":", 1)[1]].send_signal(signal.SIGKILL)
            await fleet.until(lambda: (h := holder()) and h != first_holder, "a survivor took the duty")
            await stalled(tasks[1])
            await fleet.until(lambda: sum(r.headers["title"] == "A worker stalled" for r in ntfy.received) >= 2,
                              "the second stall pushed")
            await asyncio.sleep(3)  # a window in which a duplicate of the second push would arrive (it must not)
            # the killed executor's own loss is an alert too (once its lease expires): count the stalls
            second = sum(r.headers["title"] == "A worker stalled" for r in ntfy.received)
            keys = tables.count(db.admin_dsn, "fleet_secrets", name="vapid_private_pem")
        finally:
            fleet.stop_all()
    assert first == 1 and second == 2
    assert keys == 1


async def test_two_executors_delivering_one_threads_chat_never_open_two_turns_at_once(db: DB) -> None:
    """The two starts race for real: the first is held inside its transaction (its turn written, not yet
    committed) while the second starts; the second must wait on the first's thread lock and then find the
    turn open. Without the lock the second sees no open turn (the first's is uncommitted) and opens another."""
    from executor.journal.writer import JournalWriter
    from executor.settle.threads import Threads

    thread = threads.DEFAULT_THREAD_ID
    with psycopg.connect(db.admin_dsn) as conn:
        tables.insert_thread(conn, thread, mode="interactive")
        tables.insert(conn, "chat_queue", thread_id=thread, text="first")
    async with Database(db.executor_dsn, name="test-a", max_size=2) as a, \
            Database(db.executor_dsn, name="test-b", max_size=2) as b, \
            await psycopg.AsyncConnection.connect(db.admin_dsn) as head:
        delivering = [Threads(d.pool, JournalWriter(d.pool)) for d in (a, b)]
        # the journal head held: the first start stops at its append, the last step before its commit
        await head.execute("SELECT last_seq FROM journal_head FOR UPDATE")
        first = asyncio.create_task(delivering[0]._start_turn(thread, None))
        first_pid = await lock_waiter(db.admin_dsn, "application_name = 'test-a'")
        # a message arrives and the second executor starts a turn while the first's is still uncommitted
        with psycopg.connect(db.admin_dsn) as conn:
            tables.insert(conn, "chat_queue", thread_id=thread, text="second")
        second = asyncio.create_task(delivering[1]._start_turn(thread, None))
        second_pid = await lock_waiter(db.admin_dsn, "application_name = 'test-b'")
        second_waits_on = tables.blocked(db.admin_dsn, second_pid)
        await head.commit()  # the head released: the first commits, then the second goes on
        await asyncio.wait_for(asyncio.gather(first, second), 30)
    with psycopg.connect(db.admin_dsn) as conn:
        turns = tables.tasks(conn, "brief", session_id=thread)
        waiting = tables.rows(conn, "chat_queue", "text", status="pending")
    assert turns == [("first",)], f"two turns at once: {turns}"
    assert waiting == [("second",)]  # it waits for the turn's end
    # how: the second start waited on the first's lock of the thread's row, not on anything after it
    query, blockers = second_waits_on
    assert "FROM sessions" in query and "FOR NO KEY UPDATE" in query, query
    assert blockers == [first_pid], (blockers, first_pid)


async def test_the_context_view_lists_the_executors_and_a_lost_one_stands_out(db: DB) -> None:
    from playwright.async_api import expect

    from tests.web.seen import seen
    from tests.web.test_web_client import browser, page_at

    with psycopg.connect(db.admin_dsn) as conn:
        tables.add(conn, "executors", name="alpha", labels=["gpu"], capacity=4, lease_s=15,
                   lease_until=tables.from_now(seconds=15), version="1.2.3")
        tables.add(conn, "executors", name="<b>beta</b>", labels=[], capacity=2, lease_s=15,
                   lease_until=tables.from_now(seconds=-30), version="1.2.3", lost_at=tables.NOW)
    async with ingress_server(db.ingress_dsn) as url, browser() as b, page_at(b, url) as page:
        await page.click("a[data-tab='context']")
        items = page.locator("#executors li")
        await expect(items).to_have_count(2, timeout=20_000)
        alpha, beta = page.locator("#executors li[data-state='live']"), page.locator("#executors li[data-state='lost']")
        await expect(alpha).to_contain_text("alpha · 0/4")
        await expect(alpha).to_contain_text("gpu")
        await expect(beta).to_contain_text("<b>beta</b>")  # a name is text, never markup
        await seen(beta.locator(".chip.stalled"), "lost", scroll=True)  # seen, not only in the DOM


async def test_a_half_open_lease_connection_is_replaced_before_the_lease_runs_out(db: DB, tmp_path: Path) -> None:
    from tests.proxy import FreezableProxy

    with ScriptedModelServer(Scenario.single(STALL_FOREVER)) as model:
        fleet = Fleet(db, model, tmp_path)
        async with FreezableProxy(db.executor_dsn) as proxy:
            try:
                await fleet.start("alpha", PETAL_EXECUTOR_DSN=proxy.dsn())
                await fleet.start("beta")
                (task,) = await fleet.dispatch(executor="alpha")
                await fleet.until(lambda: tables.task(db.admin_dsn, task, "pid")[0], "running on alpha")
                (epoch,) = tables.executor(db.admin_dsn, "alpha", "epoch")
                # alpha's connections stall without an error (a half-open link); the server keeps its
                # session, and with it the name's lock, for hours
                proxy.freeze_existing()
                # the lease's time left, watched through the freeze: a hung renewal is abandoned after an
                # interval (a third of the lease) and a new connection renews at once, with about a third
                # of the lease to spare (waiting another interval first would leave none)
                least = LEASE_S
                async with await psycopg.AsyncConnection.connect(db.admin_dsn, autocommit=True) as watch:

                    async def watching() -> None:
                        nonlocal least
                        while True:
                            cur = await watch.execute("SELECT extract(epoch FROM lease_until - now())::float8"
                                                      " FROM executors WHERE name = 'alpha'")
                            least = min(least, (await cur.fetchone() or [0.0])[0])
                            await asyncio.sleep(0.05)  # not a wait: the pace of the samples

                    with contextlib.suppress(TimeoutError):  # three leases in which it must not run out
                        await asyncio.wait_for(watching(), LEASE_S * 3)
                (renewed,) = tables.executor(db.admin_dsn, "alpha", "renewed_at")
                age = (tables.now(db.admin_dsn) - renewed).total_seconds()
                after = tables.executors(db.admin_dsn, "epoch", "lost_at", name="alpha")
                row = tables.task(db.admin_dsn, task, "status", "executor_name")
                lost = tables.payloads(db.admin_dsn, "executor.lost")
            finally:
                fleet.procs["alpha"].kill()  # its frozen pool would hold a graceful stop up
                fleet.stop_all()
    assert lost == [] and after == [(epoch, None)], fleet.logs()
    assert age < LEASE_S and row == ("running", "alpha")
    assert least > LEASE_S / 3 / 3, least  # a third of the interval left at the least


async def test_a_sessions_next_turn_waits_for_the_executor_of_its_first_turn(db: DB, tmp_path: Path) -> None:
    session = uuid.uuid4()
    with psycopg.connect(db.admin_dsn) as conn:
        tables.insert_thread(conn, session, role="worker")
    with ScriptedModelServer(Scenario.single(STALL_FOREVER)) as model:
        fleet = Fleet(db, model, tmp_path)
        try:
            await fleet.start("alpha", PETAL_MAX_WORKERS="1")
            (first,) = await fleet.dispatch(session_id=session)
            await fleet.until(lambda: tables.task(db.admin_dsn, first, "pid")[0], "the first turn runs")
            await fleet.start("beta")
            # alpha is full and beta idle: the next turn still waits for alpha (its --resume files are there)
            (second,) = await fleet.dispatch(session_id=session)
            await asyncio.sleep(LEASE_S)  # a window in which the turn must not go to the idle beta
            (pinned,) = tables.thread(db.admin_dsn, session, "executor_name")
            waiting = tables.task(db.admin_dsn, second, "status", "executor_name")
        finally:
            fleet.stop_all()
    assert pinned == "alpha" and waiting == ("pending", None)
