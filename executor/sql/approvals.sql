-- name: await_approval --
-- A worker of an interactive thread is recorded pending but is not claimed while its approval is open
-- (claim_pending_tasks); the activity says why it waits.
UPDATE tasks SET activity = 'awaiting_approval' WHERE id = %(id)s AND status = 'pending'

-- name: insert_approval --
INSERT INTO approvals (task_id, thread_id, question_id) VALUES (%(task_id)s, %(thread_id)s, %(question_id)s)
RETURNING id

-- name: list_answered_approvals --
-- Approvals whose question is closed, or whose worker was stopped meanwhile (its question then closes
-- unanswered), and whose decision is still owed; locked so one pass acts once. answered_by: who answered (an
-- answer without it is not the user's: executor/settle/approvals.py does not act on it).
SELECT a.id, a.task_id, a.thread_id, a.question_id, q.answers, q.response, q.status AS question_status,
       q.answered_by, t.status AS task_status, t.brief, t.project_id
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

-- name: mark_question_timed_out --
-- ask_user_question stopped waiting, but in a thread the question stays answerable (pending, marked late).
UPDATE questions SET timed_out_at = now() WHERE id = %(id)s AND status = 'pending' AND timed_out_at IS NULL
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
