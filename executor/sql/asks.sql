-- Questions in the Asks panel: asked, answered, closed.

-- name: mark_question_timed_out --
-- ask_user_question stopped waiting, but in a thread the question stays answerable (pending, marked late).
UPDATE questions SET timed_out_at = now() WHERE id = %(id)s AND status = 'pending' AND timed_out_at IS NULL
RETURNING id

-- name: take_asked_question --
-- The same questions asked again — by the re-run of a turn an executor's stop cut off, or in the same
-- session while the first asker is gone — take over the existing row instead of adding a second: a pending
-- row waits for its answer under the new call (one pending ask per tool call, across restarts); the answer
-- the user gave to the cut-off turn (its re-run chain, through retry_of) answers the re-run at once.
WITH RECURSIVE chain(id) AS (
    SELECT retry_of FROM tasks WHERE id = %(task_id)s AND retry_of IS NOT NULL
    UNION
    SELECT t.retry_of FROM tasks t JOIN chain c ON t.id = c.id WHERE t.retry_of IS NOT NULL
), found AS (
    SELECT q.id, q.tool_use_id, q.status FROM questions q LEFT JOIN tasks t ON t.id = q.task_id
    WHERE q.questions = %(questions)s AND q.asked_by = %(asked_by)s
      AND ((q.status = 'pending' AND q.source_session_uuid = %(session_id)s
            AND (t.id IS NULL OR t.id = %(task_id)s OR t.status <> 'running'))
           OR (q.status = 'answered' AND q.answered_by IS NOT NULL AND q.task_id IN (SELECT id FROM chain)))
    ORDER BY (q.status = 'pending') DESC, q.created_at DESC
    LIMIT 1
    FOR UPDATE OF q SKIP LOCKED
), moved AS (
    -- an answered row is left as it is (answered questions are not written again)
    UPDATE questions q SET task_id = %(task_id)s, timed_out_at = NULL
    FROM found WHERE q.id = found.id AND found.status = 'pending'
    RETURNING q.id
)
SELECT found.id, found.tool_use_id, found.status FROM found

-- name: insert_question --
INSERT INTO questions (tool_use_id, source_session_uuid, task_id, questions, asked_by)
VALUES (%(tool_use_id)s, %(session_id)s, %(task_id)s, %(questions)s, %(asked_by)s)
ON CONFLICT (tool_use_id) DO NOTHING
RETURNING id

-- name: get_question_by_tool_use_id --
-- The row a tool call's retry waits on: only the caller's own (its task's or its thread's). The id is the caller's
-- word, unique across every thread: another's row under it is never joined (its answers read, its card re-told).
SELECT id FROM questions WHERE tool_use_id = %(tool_use_id)s
  AND (task_id = %(task_id)s OR source_session_uuid = %(session_id)s)

-- name: get_question --
-- answered_by: who answered (the ingress's request identity, or the chat message's sender); an answer
-- without it was not written by the ingress and is not the user's
SELECT id, status, answers, response, answered_via, answered_by FROM questions WHERE id = %(id)s

-- name: close_question --
UPDATE questions SET status = 'cancelled', response = %(response)s
WHERE id = %(id)s AND status = 'pending'
RETURNING id

-- name: close_abandoned_question --
-- Its asking tool call went away (the process ended): closed, unless it was marked late first (a parked process the
-- supervisor ended past PETAL_MAX_PARKED): that one stays answerable, its answer goes to the thread.
UPDATE questions SET status = 'cancelled', response = %(response)s
WHERE id = %(id)s AND status = 'pending' AND timed_out_at IS NULL
RETURNING id

-- name: lock_thread_questions --
-- One asker at a time per thread between looking for the same question and putting it up (held to commit).
SELECT pg_advisory_xact_lock(hashtextextended('questions:' || %(thread_id)s::text, 0)) AS locked

-- name: get_thread_repeat --
-- The same questions (texts, headers, options) already before the user in this thread — asked by its turns
-- or by any task they dispatched, transitively — pending; else the thread's last question of this asker when
-- it is the same and was answered by the user within the window.
WITH RECURSIVE tree(id) AS (
    SELECT t.id FROM tasks t WHERE t.session_id = %(thread_id)s
    UNION
    SELECT c.id FROM tree JOIN tasks c ON c.parent_task_id = tree.id
), latest AS (
    SELECT q.id, q.tool_use_id, q.questions, q.status, q.answers, q.response, q.answered_via, q.answered_by,
           q.answered_at, q.timed_out_at
    FROM questions q
    WHERE q.task_id IN (SELECT id FROM tree) AND q.asked_by = %(asked_by)s
    ORDER BY (q.status = 'pending' AND q.questions = %(questions)s) DESC, q.created_at DESC
    LIMIT 1
)
SELECT id, tool_use_id, status, answers, response, answered_via, answered_by, timed_out_at FROM latest
WHERE questions = %(questions)s
  AND (status = 'pending'
       OR (status = 'answered' AND answered_by IS NOT NULL
           AND answered_at > now() - make_interval(secs => %(window_s)s)))

-- name: take_late_question --
-- A late question asked again in its thread: the new call waits on it, so its answer comes back as the call's
-- result (no longer late, no note in its chat).
UPDATE questions SET task_id = %(task_id)s, timed_out_at = NULL
WHERE id = %(id)s AND status = 'pending'
RETURNING id

-- name: get_question_receipt --
-- The hash an approval card was asked with (shared/receipts.py); NULL for a card asked before receipts.
SELECT questions -> 0 -> 'receipt' ->> 'sha256' AS sha256 FROM questions WHERE id = %(id)s

-- name: insert_approval_receipt --
-- One per approval acted on: what the card approved against what was about to run (matched: the same).
INSERT INTO approval_receipts (kind, question_id, task_id, thread_id, tool_use_id, subject, answer, answered_by,
                               approved_sha256, checked_sha256, matched)
VALUES (%(kind)s, %(question_id)s, %(task_id)s, %(thread_id)s, %(tool_use_id)s, %(subject)s, %(answer)s,
        %(answered_by)s, %(approved_sha256)s, %(checked_sha256)s, %(matched)s)
RETURNING id
