-- Orchestrator threads: chat, turns, thread controls.

-- name: get_thread_mode --
SELECT mode FROM sessions WHERE id = %(id)s AND role = 'orchestrator'

-- name: get_thread_project --
SELECT p.id, p.name, p.workdir, p.plan FROM sessions s JOIN projects p ON p.id = s.project_id WHERE s.id = %(id)s

-- name: claim_thread_controls --
-- A Retry of a failed turn waits while the thread has a turn open (turns of one thread never overlap);
-- meanwhile it holds the thread's messages back, so the retried messages still go before later ones.
UPDATE thread_control_queue q SET status = 'claimed', claimed_at = now()
FROM (SELECT c.id FROM thread_control_queue c
      WHERE c.status = 'pending'
        -- a thread made from a stored conversation: only the executor holding its file makes it
        AND (c.args -> 'adopt' ->> 'executor' IS NULL OR c.args -> 'adopt' ->> 'executor' = %(executor)s)
        AND NOT (c.action = 'retry' AND EXISTS (SELECT 1 FROM tasks t WHERE t.session_id = c.thread_id
                                                AND (t.status IN ('pending', 'running') OR t.settled_at IS NULL)))
      ORDER BY c.created_at FOR UPDATE OF c SKIP LOCKED LIMIT 50) picked
WHERE q.id = picked.id
RETURNING q.id, q.thread_id, q.action, q.args, q.created_at

-- name: finish_thread_control --
UPDATE thread_control_queue SET status = %(status)s, error = %(error)s, done_at = now() WHERE id = %(id)s

-- name: create_thread --
INSERT INTO sessions (id, role, lifecycle, title, mode, project_id)
VALUES (%(id)s, 'orchestrator', 'idle', %(title)s, %(mode)s, %(project_id)s)
ON CONFLICT (id) DO NOTHING
RETURNING id

-- name: update_thread --
UPDATE sessions
SET title = coalesce(%(title)s, title), mode = coalesce(%(mode)s, mode),
    lifecycle = CASE WHEN %(archive)s THEN 'archived' ELSE lifecycle END, updated_at = now()
WHERE id = %(id)s AND role = 'orchestrator'
RETURNING id

-- name: list_threads_with_pending_chat --
-- Each thread with messages waiting (only %(id)s, when given) and what their delivery depends on, in one round trip
-- on the way to every turn's spawn; `found` is false for a thread that does not exist (yet). A turn is open until its
-- end is settled: a failed turn's re-run is inserted by its settlement, and no later message may start a turn before
-- that. blocked_question: a question the thread's running turn is waiting on (a chat message answers it as a reply).
-- executor_name: the executor its turns are pinned to (its first turn's); adopted: it continues a stored
-- conversation of the CLI's (in that conversation's own directories). terminal_executor: the executor holding the
-- thread's live terminal session, which types the messages in (migration 0047).
SELECT c.thread_id, s.id IS NOT NULL AS found, s.lifecycle, s.mode, s.project_id, s.executor_name,
       s.adopted_session_id IS NOT NULL AS adopted,
       EXISTS (SELECT 1 FROM tasks t WHERE t.session_id = s.id
               AND (t.status IN ('pending', 'running') OR t.settled_at IS NULL)) AS turn_open,
       EXISTS (SELECT 1 FROM thread_control_queue q WHERE q.thread_id = s.id AND q.status IN ('pending', 'claimed'))
           AS controls_pending,
       (SELECT q.id FROM questions q JOIN tasks t ON t.id = q.task_id
        WHERE q.status = 'pending' AND q.timed_out_at IS NULL AND t.session_id = s.id AND t.status = 'running'
        ORDER BY q.created_at LIMIT 1) AS blocked_question,
       (SELECT ts.executor_name FROM terminal_sessions ts WHERE ts.thread_id = s.id AND ts.ended_at IS NULL)
           AS terminal_executor
FROM (SELECT DISTINCT thread_id FROM chat_queue
      WHERE status = 'pending' AND (%(id)s::uuid IS NULL OR thread_id = %(id)s::uuid)) c
LEFT JOIN sessions s ON s.id = c.thread_id AND s.role = 'orchestrator'

-- name: check_thread_create_pending --
SELECT true AS holds WHERE EXISTS (SELECT 1 FROM thread_control_queue WHERE thread_id = %(id)s AND action = 'create'
                                   AND status IN ('pending', 'claimed'))

-- name: take_pending_chat --
-- origin NULL takes every message (a turn boundary); 'user' only the user's own (a reply in chat that
-- answers a pending question: a harness report must never answer for the user, it waits for the boundary).
-- A reply carries text only: a message with attachments waits for the boundary, where a turn takes its files.
-- A boundary takes nothing while the thread has a turn open (as in list_threads_with_pending_chat): run after
-- lock_thread_for_turn, in a statement of its own, it sees a turn another executor started meanwhile.
UPDATE chat_queue c SET status = 'delivered', claimed_at = now(), done_at = now()
FROM (SELECT id FROM chat_queue
      WHERE thread_id = %(thread_id)s AND status = 'pending'
        AND (%(origin)s::text IS NULL OR (origin = %(origin)s AND cardinality(attachment_ids) = 0))
        AND (%(origin)s::text IS NOT NULL
             OR NOT EXISTS (SELECT 1 FROM tasks t WHERE t.session_id = %(thread_id)s
                            AND (t.status IN ('pending', 'running') OR t.settled_at IS NULL)))
      ORDER BY created_at
      FOR UPDATE SKIP LOCKED LIMIT %(limit)s) picked
WHERE c.id = picked.id
RETURNING c.id, c.text, c.origin, c.created_at, c.attachment_ids,
          -- what the journal keeps of each file (the bytes may be purged later; the hash and name stay)
          (SELECT coalesce(jsonb_agg(jsonb_build_object('id', a.id, 'name', a.name, 'media_type', a.media_type,
                                                        'size', a.size_bytes, 'sha256', encode(a.sha256, 'hex'))
                                     ORDER BY array_position(c.attachment_ids, a.id)), '[]'::jsonb)
           FROM attachments a WHERE a.id = ANY(c.attachment_ids)) AS attachments

-- name: fail_pending_chat --
UPDATE chat_queue SET status = 'failed', error = %(error)s, done_at = now()
WHERE thread_id = %(thread_id)s AND status = 'pending'

-- name: answer_in_chat --
-- The reply is the user's as far as its message is: answered_by is who sent it through the ingress (a message
-- written any other way has none, and its answer is not acted on as the user's).
UPDATE questions SET status = 'answered', answers = '{}'::jsonb, response = %(text)s, answered_via = 'chat',
                     answered_by = (SELECT c.sent_by FROM chat_queue c WHERE c.id = %(chat_id)s)
WHERE id = %(id)s AND status = 'pending'
RETURNING id, answered_by

-- name: lock_thread_for_turn --
-- Executors of a fleet deliver chat concurrently: the thread's row lock makes "no turn open → start one"
-- one step (the open-turn check, take_pending_chat's, runs after it in a statement of its own, so it sees the
-- other's commit).
-- NO KEY UPDATE, not UPDATE: a journal append naming the thread checks its key FOR KEY SHARE while it
-- holds the journal head, and this transaction appends next; FOR UPDATE would deadlock the two.
SELECT id FROM sessions WHERE id = %(id)s FOR NO KEY UPDATE

-- name: cancel_archived_turns --
-- A turn queued in a thread before it was archived (a delayed re-run) does not run: it ends as cancelled,
-- settled (nothing is re-run or escalated for it).
UPDATE tasks t SET status = 'cancelled', status_reason = 'thread archived', ended_at = now(), settled_at = now()
FROM sessions s
WHERE s.id = t.session_id AND s.lifecycle = 'archived' AND t.role = 'orchestrator' AND t.status = 'pending'
RETURNING t.id, t.session_id

-- name: stop_archived_turns --
-- A turn running in a thread the user archived is stopped (once: a stop already asked for is not repeated).
INSERT INTO stop_queue (task_id, reason)
SELECT t.id, 'thread archived' FROM tasks t JOIN sessions s ON s.id = t.session_id
WHERE s.lifecycle = 'archived' AND t.role = 'orchestrator' AND t.status = 'running'
  AND NOT EXISTS (SELECT 1 FROM stop_queue q WHERE q.task_id = t.id)
RETURNING task_id

-- name: close_archived_questions --
-- An archived thread's pending questions (its turns', its workers', and the harness's about it) are closed
-- as "thread archived": they leave the Asks panel and show so in its history. `asker_running`: a live tool
-- call waits on the row and journals the close itself.
UPDATE questions q SET status = 'cancelled', response = %(response)s, answered_at = now()
FROM (SELECT q2.id, s.id AS thread_id, t.id AS task_id, coalesce(t.status = 'running', false) AS asker_running
      FROM questions q2
      LEFT JOIN tasks t ON t.id = q2.task_id
      LEFT JOIN tasks p ON p.id = t.parent_task_id
      JOIN sessions s ON s.id IN (q2.source_session_uuid, t.session_id, p.session_id)
      WHERE q2.status = 'pending' AND s.role = 'orchestrator' AND s.lifecycle = 'archived'
      FOR UPDATE OF q2 SKIP LOCKED) closed
WHERE q.id = closed.id AND q.status = 'pending'
RETURNING q.id, q.tool_use_id, closed.thread_id, closed.task_id, closed.asker_running

-- name: delete_purgeable_attachments --
-- Retention: the files of messages in archived threads, and uploads never sent with a message, older than
-- the cut-off. What is deleted is returned for the journal's record.
DELETE FROM attachments a
WHERE a.created_at < now() - make_interval(secs => %(older_than_s)s::float8)
  AND (a.chat_message_id IS NULL
       OR EXISTS (SELECT 1 FROM chat_queue c JOIN sessions s ON s.id = c.thread_id
                  WHERE c.id = a.chat_message_id AND s.lifecycle = 'archived'))
RETURNING a.id, a.name, a.media_type, a.size_bytes, encode(a.sha256, 'hex') AS sha256, a.chat_message_id
