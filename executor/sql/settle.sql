-- What follows a task's end: the settler's claims and steps — extraction, the policy, escalations, approvals, late answers —
-- and the one door through which a task comes to be (executor/settle/dispatch.py request_task).

-- name: await_approval --
-- A worker of an interactive thread is recorded pending but is not claimed while its approval is open
-- (claim_pending_tasks); the activity says why it waits. Returns what its approval binds (its receipt).
UPDATE tasks SET activity = 'awaiting_approval' WHERE id = %(id)s AND status = 'pending'
RETURNING role, brief, project_id, allowed_tools, workdir

-- name: insert_approval --
INSERT INTO approvals (task_id, thread_id, question_id) VALUES (%(task_id)s, %(thread_id)s, %(question_id)s)
RETURNING id

-- name: list_answered_approvals --
-- Approvals whose question is closed, or whose worker was stopped meanwhile (its question then closes
-- unanswered), and whose decision is still owed; locked so one pass acts once. answered_by: who answered (an
-- answer without it is not the user's: executor/settle/approvals.py does not act on it); approved_sha256: the
-- hash the card was asked with, against the worker as it is now (its receipt).
SELECT a.id, a.task_id, a.thread_id, a.question_id, q.answers, q.response, q.status AS question_status,
       q.answered_by, t.status AS task_status, t.brief, t.project_id, t.role, t.allowed_tools, t.workdir,
       q.questions -> 0 -> 'receipt' ->> 'sha256' AS approved_sha256
FROM approvals a JOIN questions q ON q.id = a.question_id JOIN tasks t ON t.id = a.task_id
WHERE a.status = 'open' AND (q.status <> 'pending' OR t.status <> 'pending')
ORDER BY a.created_at
FOR UPDATE OF a SKIP LOCKED
LIMIT 20

-- name: resolve_approval --
UPDATE approvals SET status = 'resolved', decision = %(decision)s, resolved_at = now()
WHERE id = %(id)s AND status = 'open'

-- name: release_approved_task --
-- Approved: the pending worker becomes claimable (the approval row is resolved in the same transaction);
-- the NOTIFY wakes the supervisor at commit.
WITH released AS (
    UPDATE tasks SET activity = NULL WHERE id = %(id)s AND status = 'pending' RETURNING id
)
SELECT id, pg_notify('task_pending', id::text) FROM released

-- name: cancel_unapproved_task --
-- Rejected: the worker never starts. Settled here: the approval's own message tells the orchestrator.
UPDATE tasks SET status = 'cancelled', status_reason = 'not approved by the user', activity = NULL,
                 ended_at = now(), settled_at = now()
WHERE id = %(id)s AND status = 'pending'
RETURNING id

-- name: list_undelivered_late_answers --
-- Answers to questions that had timed out, not yet sent to their thread (the asking turn's own thread,
-- or the thread whose turn dispatched the asking worker); locked so one pass delivers each once. Only
-- the user's answers (answered_by: written by the ingress) are sent on.
SELECT q.id, q.task_id, q.questions, q.answers, q.response,
       coalesce((SELECT s.id FROM tasks t JOIN sessions s ON s.id = t.session_id AND s.role = 'orchestrator'
                 WHERE t.id = q.task_id),
                (SELECT s.id FROM tasks t JOIN tasks p ON p.id = t.parent_task_id
                 JOIN sessions s ON s.id = p.session_id AND s.role = 'orchestrator'
                 WHERE t.id = q.task_id)) AS thread_id,
       (SELECT t.role FROM tasks t WHERE t.id = q.task_id) AS asked_by_role
FROM questions q
WHERE q.timed_out_at IS NOT NULL AND q.status = 'answered' AND q.answered_by IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM late_answers l WHERE l.question_id = q.id)
ORDER BY q.answered_at
FOR UPDATE OF q SKIP LOCKED
LIMIT 20

-- name: record_late_answer --
INSERT INTO late_answers (question_id, chat_id) VALUES (%(question_id)s, %(chat_id)s)
ON CONFLICT (question_id) DO NOTHING
RETURNING question_id

-- name: list_attempt_tool_calls --
-- The tool calls one attempt made, oldest first, each with whether its result came back before the
-- attempt ended; `total` counts them all (the rows are bounded by %(limit)s). The results' ids are read once
-- (not once per call: a long worker's thousands of calls made that quadratic).
WITH results AS MATERIALIZED (
    SELECT rb ->> 'tool_use_id' AS tool_use_id
    FROM journal r,
         jsonb_array_elements(CASE WHEN jsonb_typeof(r.payload -> 'message' -> 'content') = 'array'
                                   THEN r.payload -> 'message' -> 'content' ELSE '[]' END) rb
    WHERE r.task_id = %(task_id)s AND r.event_type = 'stream.user' AND rb ->> 'type' = 'tool_result'
)
SELECT c.block ->> 'name' AS name, c.block -> 'input' AS input, count(*) OVER () AS total,
       EXISTS (SELECT 1 FROM results WHERE results.tool_use_id = c.block ->> 'id') AS finished
FROM journal j,
     jsonb_array_elements(CASE WHEN jsonb_typeof(j.payload -> 'message' -> 'content') = 'array'
                               THEN j.payload -> 'message' -> 'content' ELSE '[]' END) WITH ORDINALITY AS c(block, n)
WHERE j.task_id = %(task_id)s AND j.event_type = 'stream.assistant' AND c.block ->> 'type' = 'tool_use'
ORDER BY j.seq, c.n
LIMIT %(limit)s

-- name: get_settled_worker --
-- A finished task and what the policy needs of it: its thread (when an orchestrator turn dispatched it)
-- and whether its role follows the policy.
SELECT w.id, w.role, w.session_id, w.status, w.status_reason, w.attempt, w.brief, w.plan_ref, w.project_id, w.workdir, w.allowed_tools,
       w.parent_task_id, coalesce(w.retry_of, w.id) AS first_attempt, coalesce(p.follows_policy, false) AS follows_policy,
       s.id AS thread_id
FROM tasks w
LEFT JOIN role_profiles p ON p.role = w.role
LEFT JOIN tasks t ON t.id = w.parent_task_id
LEFT JOIN sessions s ON s.id = t.session_id AND s.role = 'orchestrator'
WHERE w.id = %(id)s

-- name: insert_escalation --
INSERT INTO escalations (task_id, thread_id, question_id) VALUES (%(task_id)s, %(thread_id)s, %(question_id)s)
RETURNING id

-- name: list_answered_escalations --
-- Escalations whose question is closed and whose decision is still owed; locked so one pass acts once.
-- An answer without answered_by was not written by the ingress: it is not the user's, so no choice is read
-- from it (the escalation is relayed, nothing retried).
SELECT e.id, e.task_id, e.thread_id, e.question_id, q.status AS question_status, q.answered_by, e.kind, e.run_id,
       e.raise_usd::float8 AS raise_usd,
       CASE WHEN q.status = 'answered' AND q.answered_by IS NULL THEN NULL ELSE q.answers END AS answers,
       CASE WHEN q.status = 'answered' AND q.answered_by IS NULL
            THEN 'nothing the harness could act on: an answer that did not come from the user was ignored'
            ELSE q.response END AS response
FROM escalations e JOIN questions q ON q.id = e.question_id
WHERE e.status = 'open' AND q.status <> 'pending'
ORDER BY e.created_at
FOR UPDATE OF e SKIP LOCKED
LIMIT 20

-- name: resolve_escalation --
UPDATE escalations SET status = 'resolved', decision = %(decision)s, resolved_at = now()
WHERE id = %(id)s AND status = 'open'

-- name: cancel_thread_pending_workers --
-- Stop the plan: the thread's workers not yet started never start. Settled here: the escalation's own
-- message tells the orchestrator, so no report per cancelled worker follows.
UPDATE tasks w SET status = 'cancelled', status_reason = 'the user stopped the plan', ended_at = now(),
                   settled_at = now()
FROM tasks p
WHERE p.id = w.parent_task_id AND p.session_id = %(thread_id)s AND w.status = 'pending'
RETURNING w.id

-- name: stop_thread_running_workers --
-- Stop the plan: the thread's running workers get a stop request (the supervisor's usual path).
INSERT INTO stop_queue (task_id, reason)
SELECT w.id, 'the user stopped the plan' FROM tasks w JOIN tasks p ON p.id = w.parent_task_id
WHERE p.session_id = %(thread_id)s AND w.status = 'running'
RETURNING task_id

-- name: get_exit_denials --
-- The gate evidence for a `gated` handoff: the harness's own gate decisions (gate.decided, in order), the
-- permission denials the worker's exit recorded, and the directory it ran in (what "outside the project
-- tree" is measured against).
SELECT (SELECT e.payload -> 'permission_denials' FROM journal e
        WHERE e.task_id = %(id)s AND e.event_type = 'task.exited' ORDER BY e.seq DESC LIMIT 1) AS denials,
       (SELECT s.payload ->> 'workdir' FROM journal s
        WHERE s.task_id = %(id)s AND s.event_type = 'task.spawned' ORDER BY s.seq DESC LIMIT 1) AS workdir,
       coalesce((SELECT jsonb_agg(g.payload ORDER BY g.seq) FROM journal g
                 WHERE g.task_id = %(id)s AND g.event_type = 'gate.decided'), '[]') AS decided

-- name: list_plan_task_handoffs --
-- Earlier handoffs of one plan task in a project (oldest first), for a new worker's brief.
SELECT j.payload FROM journal j JOIN tasks t ON t.id = j.task_id
WHERE j.event_type = 'handoff' AND t.project_id = %(project_id)s AND t.plan_ref = %(plan_ref)s
ORDER BY j.seq DESC LIMIT %(limit)s

-- name: list_scope_rule_outs --
-- The approaches already ruled out in a scope (project, thread, or the workers a thread dispatched), newest first.
SELECT r ->> 'approach' AS approach, r ->> 'reason' AS reason
FROM journal j, jsonb_array_elements(
    CASE WHEN jsonb_typeof(j.payload -> 'ruled_out') = 'array' THEN j.payload -> 'ruled_out' ELSE '[]' END) r
WHERE j.event_type = 'handoff'
  AND (j.session_id = %(scope)s OR j.project_id = %(scope)s
       OR j.task_id IN (SELECT t.id FROM tasks t JOIN tasks p ON p.id = t.parent_task_id
                        WHERE p.session_id = %(scope)s))
ORDER BY j.seq DESC
LIMIT %(limit)s

-- name: resolve_task_escalation --
-- The user retried a failed turn from the chat: an escalation still open on it is answered by that.
UPDATE escalations SET status = 'resolved', decision = %(decision)s, resolved_at = now()
WHERE task_id = %(task_id)s AND status = 'open'
RETURNING id, question_id

-- name: restore_exit_status --
-- A re-extraction passed validation: the worker's status is its exit-derived one again (extraction_failed
-- only ever replaced a `success`).
UPDATE tasks t SET status = j.payload ->> 'status', status_reason = j.payload ->> 'reason'
FROM (SELECT payload FROM journal WHERE task_id = %(id)s AND event_type = 'task.exited'
      ORDER BY seq DESC LIMIT 1) j
WHERE t.id = %(id)s AND t.status = 'extraction_failed'
RETURNING t.status

-- name: mark_changes_recorded --
UPDATE tasks SET changes_recorded_at = now() WHERE id = %(id)s AND changes_recorded_at IS NULL

-- name: claim_unsettled_task --
-- One ended task whose end is not yet acted on, locked until the settling transaction ends. FOR UPDATE
-- (not NO KEY UPDATE) SKIP LOCKED: another settler passes over it, and so does a row held FOR KEY SHARE.
-- What settlement needs is read from the store (never from the executor's memory), so a restarted
-- executor settles an end the same way: the task row, its thread, its `task.exited` record and that record's
-- event (absent when the task was reconciled or cancelled before it started; an extractor's handoff hangs
-- under it), and whether a project worker's changes are still to be recorded.
SELECT t.id, t.role, t.status, t.status_reason, t.parent_task_id,
       t.json_schema, (t.branch IS NOT NULL AND t.changes_recorded_at IS NULL) AS changes_due,
       -- a project worker whose check failed, with a fix round left (migration 0043)
       (t.status = 'success' AND t.check_round < coalesce((SELECT pr.check_retries FROM projects pr
                                                           WHERE pr.id = t.project_id), 0)
        AND (SELECT NOT (j.payload ->> 'passed')::boolean FROM journal j
             WHERE j.task_id = t.id AND j.event_type = 'task.check' ORDER BY j.seq DESC LIMIT 1) IS TRUE)
           AS fix_round_due,
       coalesce(p.extract_on_exit, false) AS extract_on_exit,
       -- a run in a thread is its turn unless its role says otherwise (a terminal's end is the user's, migration 0047)
       (EXISTS (SELECT 1 FROM sessions s WHERE s.id = t.session_id AND s.role = 'orchestrator')
        AND coalesce(p.turn_of_thread, true)) AS thread_turn,
       (SELECT s.id FROM tasks pt JOIN sessions s ON s.id = pt.session_id AND s.role = 'orchestrator'
        WHERE pt.id = t.parent_task_id) AS thread_id,
       (SELECT j.payload FROM journal j WHERE j.task_id = t.id AND j.event_type = 'task.exited'
        ORDER BY j.seq DESC LIMIT 1) AS exited,
       (SELECT j.event_id FROM journal j WHERE j.task_id = t.id AND j.event_type = 'task.exited'
        ORDER BY j.seq DESC LIMIT 1) AS exit_event,
       budget.run_id AS budget_run_id, budget.mode AS budget_mode
FROM tasks t LEFT JOIN role_profiles p ON p.role = t.role
-- a routine run's process the CLI stopped at its USD cap, or not started with the cap spent: the run (still
-- running) and its thread's mode, for the budget ask (migration 0045)
LEFT JOIN LATERAL (
    WITH RECURSIVE up AS (
        SELECT t.parent_task_id AS parent, t.session_id AS sid, 0 AS depth
        UNION ALL
        SELECT pt.parent_task_id, pt.session_id, up.depth + 1 FROM up JOIN tasks pt ON pt.id = up.parent
        WHERE up.depth < 64
    )
    SELECT r.id AS run_id, s.mode FROM routine_runs r JOIN sessions s ON s.id = r.thread_id
    WHERE r.status = 'running' AND r.thread_id IN (SELECT sid FROM up WHERE sid IS NOT NULL)
    LIMIT 1
) budget ON (t.status = 'skipped' AND t.status_reason LIKE 'budget:%%') OR t.status_reason = 'max_budget_usd'
WHERE t.settled_at IS NULL AND t.status NOT IN ('pending', 'running') AND t.id <> ALL(%(skip)s::uuid[])
ORDER BY t.ended_at NULLS FIRST, t.id
FOR UPDATE OF t SKIP LOCKED
LIMIT 1

-- name: mark_task_settled --
UPDATE tasks SET settled_at = now() WHERE id = %(id)s AND settled_at IS NULL

-- name: get_task_result --
-- A run's last `result` line's structured output (an extractor's) and its size as JSON text: the line is the spawn's
-- word, up to 64 MiB, and an output over %(max_bytes)s is not read (the caller says so).
SELECT CASE WHEN octet_length((payload -> 'structured_output')::text) <= %(max_bytes)s
            THEN payload -> 'structured_output' END AS structured_output,
       octet_length((payload -> 'structured_output')::text) AS structured_bytes
FROM journal WHERE task_id = %(id)s AND event_type = 'stream.result' ORDER BY seq DESC LIMIT 1

-- name: claim_unrecorded_changes --
-- A settled end whose worker's changes were never recorded (the settler records them before it settles an
-- end, so only an end settled some other way, or before it did, is left): one, locked like a settlement.
SELECT t.id FROM tasks t
WHERE t.branch IS NOT NULL AND t.changes_recorded_at IS NULL AND t.settled_at IS NOT NULL
  AND t.status NOT IN ('pending', 'running')
ORDER BY t.ended_at NULLS FIRST, t.id
FOR UPDATE OF t SKIP LOCKED
LIMIT 1

-- name: get_extraction_source --
SELECT t.id, t.role, t.brief, t.status, t.project_id, t.session_id, t.plan_ref, p.extract_on_exit
FROM tasks t LEFT JOIN role_profiles p ON p.role = t.role
WHERE t.id = %(id)s

-- name: list_worker_texts --
-- The worker's last assistant texts and its result text, newest first (bounded by the caller's limit), each cut at
-- %(chars)s characters here: a line is the spawn's word, of any shape and up to 64 MiB, and only its text is asked for.
SELECT event_type,
       left(CASE WHEN event_type = 'stream.result' THEN
                     CASE WHEN jsonb_typeof(payload -> 'result') = 'string' THEN payload ->> 'result' END
                 WHEN jsonb_typeof(payload -> 'message' -> 'content') = 'array' THEN
                     (SELECT string_agg(block ->> 'text', E'\n' ORDER BY n)
                      FROM jsonb_array_elements(payload -> 'message' -> 'content') WITH ORDINALITY AS b(block, n)
                      WHERE jsonb_typeof(block) = 'object' AND block ->> 'type' = 'text')
            END, %(chars)s) AS text
FROM journal
WHERE task_id = %(id)s AND event_type IN ('stream.assistant', 'stream.result')
ORDER BY seq DESC LIMIT %(limit)s

-- name: get_raw_seq_range --
SELECT min(seq), max(seq) FROM journal WHERE task_id = %(id)s AND tier = 'raw'

-- name: list_schema_complaints --
-- What the CLI told the extractor about its StructuredOutput calls (tool results that were errors), the first
-- %(limit)s, each cut at %(chars)s characters here, from lines of any shape (the spawn's word).
SELECT j.event_type, left(CASE WHEN jsonb_typeof(block -> 'content') = 'string' THEN block ->> 'content'
                              ELSE (block -> 'content')::text END, %(chars)s) AS text
FROM journal j
CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(j.payload -> 'message' -> 'content') = 'array'
                                             THEN j.payload -> 'message' -> 'content' ELSE '[]'::jsonb END)
     WITH ORDINALITY AS b(block, n)
WHERE j.task_id = %(id)s AND j.event_type = 'stream.user'
  AND jsonb_typeof(block) = 'object' AND block ->> 'type' = 'tool_result' AND block -> 'is_error' = 'true'::jsonb
ORDER BY j.seq, b.n
LIMIT %(limit)s

-- name: mark_extraction_failed --
-- (the reason's 'validation gate: ' prefix is what stored rows say: kept as written)
UPDATE tasks SET status = 'extraction_failed', status_reason = 'validation gate: ' || %(reason)s
WHERE id = %(id)s AND status = 'success'

-- name: enqueue_orchestrator_note --
-- A note to a thread's orchestrator (a worker's end, an approval's or escalation's outcome, a late answer),
-- queued in its chat: its next turn carries it (origin 'harness', journaled `thread.harness_message`).
INSERT INTO chat_queue (thread_id, text, origin) VALUES (%(thread_id)s, %(text)s, 'harness') RETURNING id

-- name: enqueue_turn_retry --
-- A Retry answered in an escalation goes the way of the chat's Retry: applied once no turn is open.
INSERT INTO thread_control_queue (thread_id, action, args)
VALUES (%(thread_id)s, 'retry', jsonb_build_object('task_id', %(task_id)s::text))
RETURNING id

-- name: insert_task --
-- The one insert of a requested task (executor/settle/dispatch.py request_task): pending, with where it may
-- run (a named executor and/or labels it must carry). The next attempt of a task (retry_of) is not claimed
-- before its not_before, and is inserted only while no other run repeats that task (nothing is returned then).
-- A routine's run caps every CLI process in it (its turns, their workers and extractors) at the routine's
-- USD per run: a turn finds it through its thread, a worker or extractor through its parent. chat: a thread turn
-- a user's message started (claimed first, migration 0039). continues_task_id: the reviewed worker a follow-up
-- revises (its worktree starts at the reviewed commit, migration 0042).
INSERT INTO tasks (id, project_id, session_id, parent_task_id, role, brief, plan_ref, workdir, allowed_tools,
                   json_schema, status, attempt, retry_of, not_before, placement_executor, required_labels,
                   attachment_ids, max_budget_usd, chat, continues_task_id, check_round)
SELECT %(id)s::uuid, %(project_id)s::uuid, %(session_id)s::uuid, %(parent_task_id)s::uuid, %(role)s::text,
       %(brief)s::text, %(plan_ref)s::text, %(workdir)s::text, %(allowed_tools)s::text[], %(json_schema)s::jsonb,
       'pending', %(attempt)s::int, %(retry_of)s::uuid, now() + make_interval(secs => %(delay_s)s::float8),
       %(executor)s::text, %(labels)s::text[], %(attachment_ids)s::uuid[],
       coalesce((SELECT p.max_budget_usd FROM tasks p WHERE p.id = %(parent_task_id)s::uuid),
                (SELECT rt.usd_per_run FROM routine_runs r JOIN routines rt ON rt.id = r.routine_id
                 WHERE r.thread_id = %(session_id)s::uuid)),
       %(chat)s::boolean, %(continues_task_id)s::uuid, %(check_round)s::int
WHERE %(retry_of)s::uuid IS NULL OR NOT EXISTS (SELECT 1 FROM tasks r WHERE r.retry_of = %(retry_of)s::uuid)
RETURNING id

-- name: get_task_request --
-- What a task was asked to do, where and under which limits: its next attempt asks the same.
SELECT role, brief, project_id, session_id, parent_task_id, plan_ref, workdir, allowed_tools, json_schema,
       placement_executor, required_labels, attempt, attachment_ids, continues_task_id, check_round
FROM tasks WHERE id = %(id)s

-- name: get_project_workdir --
SELECT workdir FROM projects WHERE id = %(project_id)s

-- name: get_review_target --
-- A worker whose diff the user reviewed: what it was asked, where it stands, and the changes the review was of
-- (its last task.changes record).
SELECT t.id, t.role, t.brief, t.status, t.project_id, t.parent_task_id, t.branch, t.review, t.allowed_tools,
       t.check_round,
       (SELECT j.payload FROM journal j WHERE j.task_id = t.id AND j.event_type = 'task.changes'
        ORDER BY j.seq DESC LIMIT 1) AS changes,
       (SELECT j.payload FROM journal j WHERE j.task_id = t.id AND j.event_type = 'task.check'
        ORDER BY j.seq DESC LIMIT 1) AS "check"
FROM tasks t WHERE t.id = %(id)s
