"""The notifier's decisions on the fake query layer (executor/notify/): who holds the duty, what is held back,
when a burst becomes a digest, where the cursor goes, and which journal records make a note at all."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson
import psycopg
import pytest
from structlog.testing import capture_logs

from executor.notify import notes
from executor.notify.duty import Duty
from executor.notify.notes import Note
from executor.notify.notifier import PAGE, Notifier, NotifyConfig, wants
from executor.notify.quiet import QuietHours
from executor.notify.store import Candidate, NotifyStore
from shared.listener import Notification
from tests.fake_queries import FakeWork

pytestmark = pytest.mark.unit

TASK, THREAD = uuid.uuid4(), uuid.uuid4()


# ---- the duty -----------------------------------------------------------------------------------------------


class _Cursor:
    def __init__(self, row: tuple[Any, ...] | None):
        self.row = row

    async def fetchone(self) -> tuple[Any, ...] | None:
        return self.row


class _Conn:
    """A connection of the duty's own: the lock granted or not, a session that may be cut."""

    def __init__(self, granted: bool):
        self.granted = granted
        self.closed = False
        self.cut = False
        self.pings = 0

    async def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> _Cursor:
        if self.cut:
            raise psycopg.OperationalError("the server closed the connection")
        if params is None:
            self.pings += 1
            return _Cursor((1,))
        assert params == {"duty": "notifier"}
        return _Cursor((self.granted,))

    async def close(self) -> None:
        self.closed = True


class _Connect:
    def __init__(self, *granted: bool):
        self.granted = list(granted)
        self.made: list[_Conn] = []
        self.names: list[str] = []
        self.down = False

    async def __call__(self, dsn: str, name: str) -> Any:
        if self.down:
            raise psycopg.OperationalError("connection refused")
        self.names.append(name)
        self.made.append(_Conn(self.granted.pop(0)))
        return self.made[-1]


async def test_the_duty_is_taken_once_and_then_kept_on_its_own_session() -> None:
    connect = _Connect(True)
    duty = Duty("dsn", "notifier", "exec-a", connect=connect)
    assert await duty.held() and await duty.held()
    assert len(connect.made) == 1 and connect.made[0].pings == 1  # the second look only pings the session
    assert connect.names == ["petal-duty:notifier:exec-a"]


async def test_a_duty_another_executor_holds_is_not_taken_and_its_connection_is_let_go() -> None:
    connect = _Connect(False, True)
    duty = Duty("dsn", "notifier", connect=connect)
    assert not await duty.held()
    assert connect.made[0].closed
    assert await duty.held()  # the holder died: the next look takes it
    assert len(connect.made) == 2 and not connect.made[1].closed


async def test_a_cut_session_loses_the_duty_and_the_next_look_takes_it_again() -> None:
    connect = _Connect(True, True)
    duty = Duty("dsn", "notifier", connect=connect)
    assert await duty.held()
    connect.made[0].cut = True
    assert await duty.held()
    assert connect.made[0].closed and len(connect.made) == 2


async def test_an_outage_is_said_once_and_again_only_after_the_duty_could_be_checked() -> None:
    connect = _Connect(False)
    connect.down = True
    duty = Duty("dsn", "notifier", connect=connect)
    with capture_logs() as logged:
        assert not await duty.held() and not await duty.held()
        connect.down = False
        assert not await duty.held()  # checked: another holds it
        connect.down = True
        assert not await duty.held()
    assert [e["event"] for e in logged] == ["duty_check_failed", "duty_check_failed"]


async def test_released_duty_closes_its_session() -> None:
    connect = _Connect(True)
    duty = Duty("dsn", "notifier", connect=connect)
    await duty.release()  # nothing held: nothing to close
    assert await duty.held()
    await duty.release()
    assert connect.made[0].closed


# ---- a pass of the notifier ---------------------------------------------------------------------------------


def notifier(answers: Mapping[str, Any], **config: Any) -> tuple[Notifier, FakeWork]:
    made = Notifier(None, NotifyConfig(**config))  # type: ignore[arg-type]  # no pool: the store is a fake
    # by default: no thread muted, no page in view, nothing waiting for a digest
    unit = FakeWork({"list_push_subscriptions": [], "record_notification": 1, "check_thread_muted": None,
                     "check_page_visible": None, "list_deferred_notifications": [], **answers})
    made.store = NotifyStore(unit)
    return made, unit


def recorded(unit: FakeWork) -> list[tuple[str, str]]:
    return [(c.params["kind"], c.params["outcome"]) for c in unit.calls if c.name == "record_notification"]


def candidate(seq: int, event_type: str = "task.stalled", **payload: Any) -> dict[str, Any]:
    return {"seq": seq, "event_type": event_type, "task_id": TASK, "session_id": None, "payload": payload,
            "role": "worker", "brief": "count the files", "task_session": None}


async def test_a_turn_someone_is_watching_is_not_notified_nor_recorded() -> None:
    made, unit = notifier({"check_thread_watched": {"holds": True}})
    turn = Note("turn_finished", "Reply ready", "b", "/#chat", TASK, THREAD)
    assert await made._hold_back([turn]) == []
    assert unit.params("check_thread_watched") == {"thread_id": THREAD, "seconds": 60.0}
    assert recorded(unit) == []


async def test_only_a_turns_end_asks_whether_its_thread_is_watched() -> None:
    made, unit = notifier({"check_recent_notification": None})  # check_thread_watched unanswered: never run
    stalled = Note("stalled", "A worker stalled", "b", "/#task", TASK, THREAD)
    assert await made._hold_back([stalled]) == [stalled]
    assert unit.names() == ["check_thread_muted", "check_page_visible", "check_recent_notification"]


async def test_a_note_sent_within_the_rate_limit_is_recorded_as_rate_limited() -> None:
    made, unit = notifier({"check_recent_notification": {"holds": True}}, rate_limit_s=30.0)
    assert await made._hold_back([Note("stalled", "t", "b", "/", TASK)]) == []
    assert [c.params["seconds"] for c in unit.calls if c.name == "check_recent_notification"] == [30.0]
    assert recorded(unit) == [("stalled", "rate_limited")]


async def test_two_notes_of_one_kind_about_one_task_in_a_pass_are_one() -> None:
    made, unit = notifier({"check_recent_notification": None})
    first, again = Note("stalled", "t", "1", "/", TASK), Note("stalled", "t", "2", "/", TASK)
    other = Note("stalled", "t", "3", "/", uuid.uuid4())
    assert await made._hold_back([first, again, other]) == [first, other]
    assert recorded(unit) == [("stalled", "rate_limited")]


async def test_each_question_of_a_task_is_its_own_note_and_one_question_is_pushed_once() -> None:
    made, unit = notifier({"check_question_notified": None})
    approval = Note("question", "t", "1", "/", TASK, detail={"question_id": "q-1"})
    card = Note("question", "t", "2", "/", TASK, detail={"question_id": "q-2"})  # the same worker's gate card
    again = Note("question", "t", "3", "/", TASK, detail={"question_id": "q-1"})
    assert await made._hold_back([approval, card, again]) == [approval, card]
    assert recorded(unit) == [("question", "rate_limited")]
    assert "check_recent_notification" not in unit.names()  # never limited by the task's other questions
    assert [c.params["question_id"] for c in unit.calls if c.name == "check_question_notified"][:2] == ["q-1", "q-2"]
    # their notifications do not replace each other on the device
    assert {orjson.loads(n.payload())["tag"] for n in (approval, card)} == {"question-q-1", "question-q-2"}


async def test_a_question_already_pushed_within_the_window_is_not_pushed_again() -> None:
    made, unit = notifier({"check_question_notified": {"holds": True}}, rate_limit_s=30.0)
    assert await made._hold_back([Note("question", "t", "b", "/", TASK, detail={"question_id": "q-1"})]) == []
    assert recorded(unit) == [("question", "rate_limited")]


def test_a_digest_counts_each_kind_and_links_to_the_asks_when_a_question_is_in_it() -> None:
    digest = Notifier._digest([Note("question", "t", "b", "/"), Note("question", "t", "b", "/"),
                               Note("stalled", "t", "b", "/")])
    assert (digest.kind, digest.title, digest.body, digest.url) == (
        "digest", "3 things need you", "2 questions, 1 stalled task", "/#asks")
    assert Notifier._digest([Note("turn_finished", "t", "b", "/")]).url == "/#tasks"


async def test_without_any_channel_a_note_is_recorded_as_no_channel() -> None:
    made, unit = notifier({})
    assert await made.deliver([Note("stalled", "t", "b", "/")]) == ("no_channel", {})
    assert unit.names() == ["list_push_subscriptions"]


async def test_a_pass_with_nothing_new_moves_the_cursor_to_the_journals_head() -> None:
    made, unit = notifier({"claim_notify_requests": [], "get_notify_cursor": {"last_seq": 10, "head": 42},
                           "list_notify_candidates": [], "advance_notify_cursor": 1})
    assert await made.pass_once() == []
    assert unit.params("list_notify_candidates") == {"after": 10, "limit": PAGE}
    assert unit.params("advance_notify_cursor") == {"seq": 42}


async def test_a_pass_notifies_what_is_due_and_moves_the_cursor_past_the_head() -> None:
    made, unit = notifier({"claim_notify_requests": [], "get_notify_cursor": {"last_seq": 10, "head": 42},
                           "list_notify_candidates": [candidate(11), candidate(12, "task.started")],
                           "check_recent_notification": None, "advance_notify_cursor": 1})
    due = await made.pass_once()
    assert [n.kind for n in due] == ["stalled"]  # task.started calls for no note
    assert recorded(unit) == [("stalled", "no_channel")]
    assert unit.params("advance_notify_cursor") == {"seq": 42}


async def test_a_full_page_moves_the_cursor_only_to_its_last_record() -> None:
    page = [candidate(100 + i, "task.started") for i in range(PAGE)]
    made, unit = notifier({"claim_notify_requests": [], "get_notify_cursor": {"last_seq": 99, "head": 10_000},
                           "list_notify_candidates": page, "advance_notify_cursor": 1})
    await made.pass_once()
    assert unit.params("advance_notify_cursor") == {"seq": 99 + PAGE}  # the rest is the next pass's


async def test_a_burst_of_more_than_digest_after_is_sent_as_one_digest() -> None:
    rows = [candidate(i, task_id=str(i)) for i in range(1, 5)]
    rows = [{**r, "task_id": uuid.uuid4()} for r in rows]  # four stalled tasks
    made, unit = notifier({"claim_notify_requests": [], "get_notify_cursor": {"last_seq": 0, "head": 4},
                           "list_notify_candidates": rows, "check_recent_notification": None,
                           "advance_notify_cursor": 1}, digest_after=3)
    assert len(await made.pass_once()) == 4
    assert recorded(unit) == [("stalled", "no_channel")] * 4 + [("digest", "no_channel")]
    assert unit.names().count("list_push_subscriptions") == 1  # delivered once, as the digest


# ---- only when needed ----------------------------------------------------------------------------------------

QUIET_NOW = "00:00-23:59 UTC"  # a window the test runs in (but for the last minute of a UTC day)


async def test_a_muted_thread_s_note_is_held_and_nothing_else_is_asked() -> None:
    made, unit = notifier({"check_thread_muted": {"holds": True}})
    assert await made._hold_back([Note("stalled", "t", "b", "/", TASK, THREAD)]) == []
    assert recorded(unit) == [("stalled", "muted")]
    assert unit.names() == ["check_thread_muted", "record_notification"]


async def test_in_quiet_hours_only_a_card_that_holds_up_work_passes_and_only_when_asked() -> None:
    if datetime.now(UTC).strftime("%H:%M") == "23:59":
        pytest.skip("outside the test's quiet window")
    plain = Note("question", "Claude asks", "b", "/", TASK)
    gate = Note("question", "Approve a tool call?", "b", "/", uuid.uuid4(), gate=True)
    for allow_gates, passed in ((False, []), (True, [gate])):
        made, unit = notifier({"check_recent_notification": None},
                              quiet=QuietHours.parse(QUIET_NOW, allow_gates=allow_gates))
        assert await made._hold_back([plain, gate], quiet=True) == passed
        assert recorded(unit) == [("question", "quiet")] * (2 - len(passed))


async def test_a_visible_page_holds_what_is_due_now_and_the_digest_waits_for_it() -> None:
    made, unit = notifier({"check_page_visible": {"holds": True}, "check_recent_notification": None,
                           "check_thread_watched": None})
    stalled = Note("stalled", "t", "b", "/", TASK)
    finished = Note("turn_finished", "Reply ready", "b", "/#chat/x", uuid.uuid4(), THREAD)
    assert await made._hold_back([stalled, finished]) == [finished]  # deferred by the pass, not held here
    assert recorded(unit) == [("stalled", "page_visible")]
    assert unit.names().count("check_page_visible") == 1  # asked once a pass


def deferred(n: int, waited_s: float) -> list[dict[str, Any]]:
    return [{"id": uuid.uuid4(), "kind": "turn_finished", "task_id": uuid.uuid4(), "thread_id": THREAD, "seq": i,
             "title": "Reply ready", "body": "The orchestrator replied.", "url": f"/#chat/{THREAD}", "detail": {},
             "waited_s": waited_s} for i in range(n)]


async def test_finished_runs_go_out_as_one_digest_once_the_oldest_has_waited() -> None:
    early, _ = notifier({"list_deferred_notifications": deferred(3, 119.0)}, digest_s=120)
    await early._digest_due(quiet=False)  # not yet: nothing sent, nothing finished
    made, unit = notifier({"list_deferred_notifications": deferred(3, 121.0), "finish_deferred_notifications": 3},
                          digest_s=120)
    await made._digest_due(quiet=False)
    quiet, quiet_unit = notifier({"list_deferred_notifications": deferred(3, 121.0)}, digest_s=120)
    await quiet._digest_due(quiet=True)
    alone, alone_unit = notifier({"list_deferred_notifications": deferred(1, 121.0),
                                  "finish_deferred_notifications": 1}, digest_s=120)
    await alone._digest_due(quiet=False)
    finished = [c.params for c in unit.calls if c.name == "finish_deferred_notifications"]
    assert len(finished) == 1 and len(finished[0]["ids"]) == 3 and finished[0]["outcome"] == "no_channel"
    assert recorded(unit) == [("digest", "no_channel")]
    assert "list_push_subscriptions" not in quiet_unit.names()
    assert recorded(alone_unit) == []  # one alone goes as itself: its own row is finished, no digest row
    assert [c.params["outcome"] for c in alone_unit.calls if c.name == "finish_deferred_notifications"] == [
        "no_channel"]


def test_the_finished_runs_digest_links_to_their_thread_and_says_what_finished() -> None:
    one_thread = [Note("turn_finished", "Reply ready", "b", "/", uuid.uuid4(), THREAD) for _ in range(2)]
    mixed = one_thread + [Note("routine_failed", "Routine x: failed", "b", "/", uuid.uuid4(), uuid.uuid4())]
    assert (Notifier._digest(one_thread).title, Notifier._digest(one_thread).url) == (
        "2 runs finished", f"/#chat/{THREAD}")
    assert (Notifier._digest(mixed).body, Notifier._digest(mixed).url) == (
        "2 finished turns, 1 failed routine run", "/#tasks")


async def test_a_test_request_is_delivered_recorded_and_finished_with_its_outcome() -> None:
    request = uuid.uuid4()
    made, unit = notifier({"claim_notify_requests": [{"id": request, "kind": "test"}],
                           "finish_notify_request": 1, "get_notify_cursor": {"last_seq": 0, "head": 0},
                           "list_notify_candidates": [], "advance_notify_cursor": 1})
    await made.pass_once()
    assert recorded(unit) == [("test", "no_channel")]
    assert unit.params("finish_notify_request") == {"id": request, "status": "failed", "error": "no_channel"}


async def test_the_fleets_vapid_key_is_the_one_in_the_store_whoever_offered_it() -> None:
    store = NotifyStore(FakeWork({"offer_fleet_secret": 0, "get_fleet_secret": {"value": "the first offer"}}))
    assert await store.fleet_secret("vapid", "mine", offered_by="exec-b") == "the first offer"
    assert isinstance(store.q, FakeWork)
    assert store.q.params("offer_fleet_secret") == {"name": "vapid", "value": "mine", "created_by": "exec-b"}


# ---- which records make a note ------------------------------------------------------------------------------


def row(event_type: str, role: str | None = "worker", **payload: Any) -> Candidate:
    return Candidate.from_row({**candidate(7, event_type, **payload), "role": role, "task_session": THREAD})


def test_a_stalled_task_is_noted_with_its_silence_and_brief() -> None:
    note = notes.note_for(row("task.stalled", silent_s=91.6))
    assert note is not None and (note.kind, note.title, note.url) == ("stalled", "A worker stalled", f"/#task/{TASK}")
    assert note.body == "Silent for 92 s: count the files" and note.thread_id == THREAD


def test_only_an_orchestrators_exit_is_a_finished_turn() -> None:
    assert notes.note_for(row("task.exited", status="success")) is None
    done = notes.note_for(row("task.exited", "orchestrator", status="success", result={"subtype": "success"}))
    failed = notes.note_for(row("task.exited", "orchestrator", status="crashed"))
    assert done is not None and (done.title, done.body, done.url) == (
        "Reply ready", "The orchestrator replied.", f"/#chat/{THREAD}")
    assert failed is not None and (failed.title, failed.body) == ("Turn ended", "The turn ended crashed.")


def test_an_escalation_and_a_gate_card_are_told_apart_from_a_plain_question() -> None:
    asked: dict[str, Any] = {"questions": [{"question": "Which one?\nmore"}]}
    plain = notes.note_for(row("question.asked", **asked))
    escalation = notes.note_for(row("question.asked", **asked, tool_use_id="escalation-1"))
    approval = notes.note_for(row("question.asked", **asked, asked_by="harness"))
    assert plain is not None and (plain.kind, plain.title, plain.body) == ("question", "Claude asks", "Which one?")
    assert escalation is not None and escalation.kind == "escalation"
    assert approval is not None and approval.title == "Approve a worker?"
    budget = notes.note_for(row("question.asked", **asked, asked_by="harness", tool_use_id="budget-1"))
    assert budget is not None and budget.title == "A run reached its budget"


def _options(*labels: Any) -> list[dict[str, Any]]:
    return [{"label": label, "description": ""} for label in labels]


def test_only_one_single_select_question_s_first_two_options_become_buttons() -> None:
    one = [{"question": "Deploy?", "options": _options("Yes", "Later", "Never")}]
    assert notes.choices(one) == ("Yes", "Later")
    assert notes.choices([{**one[0], "multiSelect": True}]) == ()  # several labels: the page
    assert notes.choices(one + [{"question": "And?", "options": _options("a", "b")}]) == ()  # several questions
    assert notes.choices([{"question": "Odd", "options": _options(None, "", 3, "ok")}]) == ("ok",)
    asked = notes.note_for(row("question.asked", questions=one, question_id="q-1"))
    assert asked is not None and asked.choices == ("Yes", "Later") and asked.url == "/#asks/q-1"
    # a tool call's gate card: allow once, or deny (its last option), not two ways of allowing
    card = [{"question": "rm -rf build?", "options": _options("Allow once", "Allow for this task", "Deny")}]
    gate = notes.note_for(row("question.asked", questions=card, question_id="q-2", tool_use_id="gate-toolu_1"))
    assert gate is not None and gate.choices == ("Allow once", "Deny") and gate.gate


def test_a_note_s_buttons_are_in_its_payload_only_with_a_token() -> None:
    note = Note("question", "Claude asks", "Deploy?", "/#asks/q-1", detail={"question_id": "q-1"},
                choices=("Yes", "x" * 60))
    bare = orjson.loads(note.payload())
    shown = orjson.loads(note.payload("tok"))
    assert set(bare) == {"title", "body", "url", "tag"}  # no token, no buttons: a tap opens the card
    assert shown["token"] == "tok" and shown["question_id"] == "q-1" and shown["choices"] == ["Yes", "x" * 60]
    assert [a["action"] for a in shown["actions"]] == ["0", "1", "reply"]
    assert len(shown["actions"][1]["title"]) == 40  # a button's label is short; the choice sent is the whole label


def test_a_routine_skipped_for_an_overlap_is_not_noted_but_one_over_budget_is() -> None:
    assert notes.note_for(row("routine.run_ended", status="skipped", reason="overlap")) is None
    budget = notes.note_for(row("routine.run_ended", status="skipped", reason="budget: 2.00 USD a day",
                                name="nightly"))
    assert budget is not None and budget.title == "Routine nightly: skipped" and budget.url == "/#routines"


def test_a_gated_routine_run_names_what_the_gate_denied_and_its_cost() -> None:
    note = notes.note_for(row("routine.run_ended", status="gated", name="n", thread_id=str(THREAD), cost_usd=0.5,
                              gate_denials=[{"summary": "Bash sudo"}, {"tool": "Write"}]))
    assert note is not None and note.body == "The gate denied: Bash sudo; Write (0.50 USD)"
    assert note.url == f"/#chat/{THREAD}" and note.detail["gate_denials"] == ["Bash sudo", None]


def test_a_lost_executor_is_noted_with_the_tasks_it_took_down() -> None:
    note = notes.note_for(row("executor.lost", name="vm-2", crashed_tasks=["a", "b"], taken_over_by="vm-1"))
    assert note is not None and note.kind == "executor_lost" and note.task_id is None
    assert note.body.startswith("Its lease expired; 2 running task(s) crashed")


def test_a_line_is_the_first_line_cut_to_its_length() -> None:
    assert notes.line("one\ntwo") == "one"
    assert notes.line("x" * 200, 10) == "x" * 9 + "…"
    assert notes.line(None) == ""


# ---- which wake-ups are worth a pass ------------------------------------------------------------------------


def journal(rows: Any) -> Notification:
    return Notification("journal", "41 " + orjson.dumps(rows).decode())


def test_a_journal_wake_up_of_unnotable_records_is_left_to_the_poll() -> None:
    assert not wants(journal([{"event_type": "stream.line"}, {"event_type": "task.started"}]))
    assert wants(journal([{"event_type": "stream.line"}, {"event_type": "task.stalled"}]))


def test_any_wake_up_whose_rows_cannot_be_read_is_taken() -> None:
    assert wants(Notification("notify_queue", ""))
    assert wants(Notification("journal", "41"))  # only the head: the batch was too big to carry
    assert wants(Notification("journal", "41 [not json"))
    assert wants(journal({"event_type": "stream.line"}))  # not a list
