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
SELECT e.id, e.task_id, e.thread_id, e.question_id, q.status AS question_status, q.answered_by,
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

-- name: get_thread_mode --
SELECT mode FROM sessions WHERE id = %(id)s AND role = 'orchestrator'

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
-- A re-extraction passed the gate: the worker's status is its exit-derived one again (extraction_failed
-- only ever replaced a `success`).
UPDATE tasks t SET status = j.payload ->> 'status', status_reason = j.payload ->> 'reason'
FROM (SELECT payload FROM journal WHERE task_id = %(id)s AND event_type = 'task.exited'
      ORDER BY seq DESC LIMIT 1) j
WHERE t.id = %(id)s AND t.status = 'extraction_failed'
RETURNING t.status
