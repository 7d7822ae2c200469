-- name: try_singleton_lock --
-- Held on a dedicated session for the executor's life: a second executor on this database refuses to start.
SELECT pg_try_advisory_lock(hashtext('petal-dispatch.executor'))

-- name: insert_task --
INSERT INTO tasks (id, project_id, session_id, parent_task_id, role, brief, plan_ref, workdir, allowed_tools,
                   json_schema, status)
VALUES (%(id)s, %(project_id)s, %(session_id)s, %(parent_task_id)s, %(role)s, %(brief)s, %(plan_ref)s,
        %(workdir)s, %(allowed_tools)s, %(json_schema)s, 'pending')

-- name: project_workdir --
SELECT workdir FROM projects WHERE id = %(project_id)s

-- name: claim_pending_tasks --
-- Oldest first; SKIP LOCKED so a concurrent claimer never blocks or takes the same row. A back-off retry
-- waits for its not_before (the poll picks it up then).
UPDATE tasks t
SET status = 'running', activity = 'running', started_at = now(), last_output_at = now()
FROM (
    SELECT id FROM tasks WHERE status = 'pending' AND (not_before IS NULL OR not_before <= now())
      -- a worker of an interactive thread waits for the user's approval (migration 0021)
      AND NOT EXISTS (SELECT 1 FROM approvals a WHERE a.task_id = tasks.id AND a.status = 'open')
    ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT %(n)s
) picked
WHERE t.id = picked.id
RETURNING t.id, t.project_id, t.session_id, t.parent_task_id, t.role, t.brief, t.plan_ref, t.workdir,
          t.allowed_tools, t.attempt, t.json_schema

-- name: role_profile --
SELECT role, system_prompt, allowed_tools, use_mcp FROM role_profiles WHERE role = %(role)s

-- name: insert_session --
INSERT INTO sessions (id, project_id, role, lifecycle, substrate_session_id)
VALUES (%(id)s, %(project_id)s, %(role)s, %(lifecycle)s, %(id)s::text)
ON CONFLICT (id) DO UPDATE SET lifecycle = EXCLUDED.lifecycle, updated_at = now()

-- name: update_session --
UPDATE sessions
SET lifecycle = %(lifecycle)s,
    substrate_session_id = coalesce(%(substrate_session_id)s, substrate_session_id),
    updated_at = now()
WHERE id = %(id)s

-- name: set_task_process --
UPDATE tasks SET pid = %(pid)s, session_id = %(session_id)s WHERE id = %(id)s

-- name: finish_task --
UPDATE tasks
SET status = %(status)s, status_reason = %(reason)s, exit_code = %(exit_code)s, exit_signal = %(exit_signal)s,
    activity = NULL, ended_at = now(), last_output_at = coalesce(%(last_output_at)s, last_output_at)
WHERE id = %(id)s

-- name: set_task_activity --
UPDATE tasks SET activity = %(activity)s WHERE id = %(id)s AND status = 'running'

-- name: touch_tasks_output --
UPDATE tasks t SET last_output_at = u.at
FROM unnest(%(ids)s::uuid[], %(ats)s::timestamptz[]) AS u(id, at)
WHERE t.id = u.id

-- name: mark_stop_requested --
UPDATE tasks SET stop_requested_at = now() WHERE id = %(id)s

-- name: task_status --
SELECT status FROM tasks WHERE id = %(id)s

-- name: cancel_pending_task --
UPDATE tasks SET status = 'cancelled', status_reason = %(reason)s, ended_at = now()
WHERE id = %(id)s AND status = 'pending'
RETURNING id

-- name: claim_stop_requests --
UPDATE stop_queue q
SET status = 'claimed', claimed_at = now()
FROM (
    SELECT id FROM stop_queue WHERE status = 'pending' ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT 100
) picked
WHERE q.id = picked.id
RETURNING q.id, q.task_id, q.reason

-- name: finish_stop_request --
UPDATE stop_queue SET status = %(status)s, error = %(error)s, done_at = now() WHERE id = %(id)s

-- name: tasks_with_pending_questions --
-- a question that timed out no longer holds its asker (the tool returned): it may stall again
SELECT DISTINCT task_id FROM questions WHERE status = 'pending' AND timed_out_at IS NULL
                                          AND task_id = ANY(%(ids)s::uuid[])

-- name: orphaned_running_tasks --
SELECT id, pid, project_id, session_id, parent_task_id, role, brief, plan_ref, workdir, allowed_tools, attempt,
       json_schema
FROM tasks WHERE status = 'running'

-- name: crash_task --
UPDATE tasks SET status = 'crashed', status_reason = %(reason)s, activity = NULL, ended_at = now()
WHERE id = %(id)s AND status = 'running'

-- name: requeue_claimed --
WITH chat AS (
    UPDATE chat_queue SET status = 'pending', claimed_at = NULL WHERE status = 'claimed' RETURNING 1
), stops AS (
    UPDATE stop_queue SET status = 'pending', claimed_at = NULL WHERE status = 'claimed' RETURNING 1
), threads AS (
    UPDATE thread_control_queue SET status = 'pending', claimed_at = NULL WHERE status = 'claimed' RETURNING 1
)
SELECT (SELECT count(*) FROM chat) AS chat, (SELECT count(*) FROM stops) AS stop,
       (SELECT count(*) FROM threads) AS thread_control

-- name: cancel_orphaned_questions --
-- A question whose asking process is gone can never be delivered: close it visibly.
UPDATE questions q SET status = 'cancelled', response = 'the asking process ended (executor restart)'
WHERE q.status = 'pending'
  AND (q.task_id IS NULL OR NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = q.task_id AND t.status = 'running'))
  -- an escalation waits on nobody's process: it stays open across restarts
  AND NOT EXISTS (SELECT 1 FROM escalations e WHERE e.question_id = q.id)
  -- nor does an approval, nor a question that timed out (its late answer goes to the thread)
  AND NOT EXISTS (SELECT 1 FROM approvals a WHERE a.question_id = q.id) AND q.timed_out_at IS NULL
RETURNING q.id, q.task_id

-- name: insert_imported_task --
-- An imported transcript's end happened elsewhere: nothing is owed on it (settled on insert).
INSERT INTO tasks (id, project_id, session_id, role, brief, status, status_reason, started_at, ended_at, settled_at)
VALUES (%(id)s, %(project_id)s, %(session_id)s, %(role)s, %(brief)s, %(status)s, %(reason)s, now(), now(), now())

-- name: insert_question --
INSERT INTO questions (tool_use_id, source_session_uuid, task_id, questions, asked_by)
VALUES (%(tool_use_id)s, %(session_id)s, %(task_id)s, %(questions)s, %(asked_by)s)
ON CONFLICT (tool_use_id) DO NOTHING
RETURNING id

-- name: question_by_tool_use_id --
SELECT id FROM questions WHERE tool_use_id = %(tool_use_id)s

-- name: get_question --
SELECT id, status, answers, response, answered_via FROM questions WHERE id = %(id)s

-- name: close_question --
UPDATE questions SET status = 'cancelled', response = %(response)s
WHERE id = %(id)s AND status = 'pending'
RETURNING id

-- name: running_task_scope --
SELECT id, project_id, session_id FROM tasks WHERE id = %(id)s

-- name: extraction_source --
SELECT t.id, t.role, t.brief, t.status, t.project_id, t.session_id, t.plan_ref, p.extract_on_exit
FROM tasks t LEFT JOIN role_profiles p ON p.role = t.role
WHERE t.id = %(id)s

-- name: worker_texts --
-- The worker's last assistant lines and its result line, newest first (bounded by the caller's limit).
SELECT event_type, payload FROM journal
WHERE task_id = %(id)s AND event_type IN ('stream.assistant', 'stream.result')
ORDER BY seq DESC LIMIT %(limit)s

-- name: raw_seq_range --
SELECT min(seq), max(seq) FROM journal WHERE task_id = %(id)s AND tier = 'raw'

-- name: schema_complaints --
-- What the CLI told the extractor about its StructuredOutput calls (tool results that were errors).
SELECT payload FROM journal WHERE task_id = %(id)s AND event_type = 'stream.user' ORDER BY seq

-- name: mark_extraction_failed --
UPDATE tasks SET status = 'extraction_failed', status_reason = 'validation gate: ' || %(reason)s
WHERE id = %(id)s AND status = 'success'
