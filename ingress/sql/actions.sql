-- name: enqueue_chat --
INSERT INTO chat_queue (thread_id, text, client_msg_id, sent_by, attachment_ids)
VALUES (%(thread_id)s, %(text)s, %(client_msg_id)s, %(sent_by)s, %(attachment_ids)s::uuid[])
ON CONFLICT (client_msg_id) DO NOTHING
RETURNING id, thread_id, text, client_msg_id, status, created_at, attachment_ids

-- name: get_chat_by_client_msg_id --
SELECT id, thread_id, text, client_msg_id, status, created_at, attachment_ids
FROM chat_queue WHERE client_msg_id = %(client_msg_id)s

-- name: enqueue_stop --
INSERT INTO stop_queue (task_id, reason) VALUES (%(task_id)s, %(reason)s)
RETURNING id, task_id, status, created_at

-- name: enqueue_thread_control --
INSERT INTO thread_control_queue (thread_id, action, args) VALUES (%(thread_id)s, %(action)s, %(args)s)
RETURNING id, thread_id, action, args, status, created_at

-- name: check_terminal_live --
SELECT true AS holds WHERE EXISTS (SELECT 1 FROM terminal_sessions WHERE thread_id = %(thread_id)s AND ended_at IS NULL)

-- name: check_thread_known --
-- A thread exists once the executor made it, or while its creation waits in the queue.
SELECT true AS holds
WHERE EXISTS (SELECT 1 FROM sessions WHERE id = %(id)s AND role = 'orchestrator')
   OR EXISTS (SELECT 1 FROM thread_control_queue WHERE thread_id = %(id)s AND action = 'create'
              AND status IN ('pending', 'claimed', 'done'))

-- name: get_question_by_ref --
SELECT id, tool_use_id, source_session_uuid, task_id, questions, status, answers, response, created_at, answered_at,
       timed_out_at, answered_by, answered_via
FROM questions
WHERE id = (CASE WHEN %(ref)s ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                 THEN %(ref)s::uuid END)
   OR tool_use_id = %(ref)s

-- name: answer_question --
-- Only a pending question changes; the row's trigger refuses anything else as well. answered_by: who, from
-- the authenticated request (the mark the executor needs to act on the answer as the user's).
UPDATE questions SET status = %(status)s, answers = %(answers)s, response = %(response)s,
                     answered_by = %(answered_by)s
WHERE id = %(id)s AND status = 'pending'
RETURNING id, tool_use_id, source_session_uuid, task_id, questions, status, answers, response, created_at,
          answered_at, timed_out_at, answered_by, answered_via

-- name: get_thread_turn --
-- One orchestrator turn of a thread (the given one, or else the thread's latest that ended other than
-- success), with the run that already repeats it, if any, and a Retry already queued for it, if any.
SELECT t.id, t.status, t.status_reason,
       (SELECT r.id FROM tasks r WHERE r.retry_of = t.id LIMIT 1) AS retried_by,
       (SELECT c.id FROM thread_control_queue c WHERE c.thread_id = t.session_id AND c.action = 'retry'
        AND c.status IN ('pending', 'claimed') AND c.args ->> 'task_id' = t.id::text LIMIT 1) AS retry_queued
FROM tasks t
WHERE t.session_id = %(thread_id)s AND t.role = 'orchestrator'
  AND (t.id = %(task_id)s::uuid
       OR (%(task_id)s::uuid IS NULL AND t.status NOT IN ('pending', 'running', 'success')))
ORDER BY t.created_at DESC
LIMIT 1
