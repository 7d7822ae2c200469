-- Notifications: the notifier's cursor and duty, push subscriptions, sent notes.

-- name: store_push_key --
-- policy: what will notify, as this executor is configured (the page shows it)
INSERT INTO push_config (public_key, ntfy, policy) VALUES (%(public_key)s, %(ntfy)s, %(policy)s)
ON CONFLICT (id) DO UPDATE SET public_key = EXCLUDED.public_key, ntfy = EXCLUDED.ntfy, policy = EXCLUDED.policy,
                               updated_at = now()

-- name: init_notify_cursor --
INSERT INTO notify_cursor (last_seq) SELECT last_seq FROM journal_head ON CONFLICT (id) DO NOTHING

-- name: get_notify_cursor --
SELECT c.last_seq, h.last_seq AS head FROM notify_cursor c, journal_head h

-- name: advance_notify_cursor --
UPDATE notify_cursor SET last_seq = greatest(last_seq, %(seq)s)

-- name: list_notify_candidates --
-- The records after the cursor that may call for a notification, with their task's role and brief.
SELECT j.seq, j.event_type, j.task_id, j.session_id, j.payload, t.role, t.brief, t.session_id AS task_session
FROM journal j LEFT JOIN tasks t ON t.id = j.task_id
WHERE j.seq > %(after)s AND j.event_type IN ('question.asked', 'task.stalled', 'task.exited', 'executor.lost',
                                             'routine.run_ended')
ORDER BY j.seq
LIMIT %(limit)s

-- name: check_thread_watched --
-- A turn's end is not pushed while a page shows its thread, nor in a routine's run (whose end is pushed once,
-- as the run's: routine.run_ended).
SELECT true AS holds WHERE EXISTS (SELECT 1 FROM client_presence WHERE thread_id = %(thread_id)s
                                   AND seen_at > now() - make_interval(secs => %(seconds)s))
                        OR EXISTS (SELECT 1 FROM routine_runs WHERE thread_id = %(thread_id)s)

-- name: check_page_visible --
-- A page is in front of the user, on any device: it said so within `seconds` (it says so every 20 s while
-- visible, and at once when hidden).
SELECT true AS holds WHERE EXISTS (SELECT 1 FROM client_presence
                                   WHERE visible AND seen_at > now() - make_interval(secs => %(seconds)s))

-- name: check_thread_muted --
-- The user muted the note's thread: the one it names, or the thread of the turn its task (a worker, its
-- extractor) descends from.
WITH RECURSIVE up AS (
    SELECT id, parent_task_id, session_id FROM tasks WHERE id = %(task_id)s
    UNION ALL
    SELECT t.id, t.parent_task_id, t.session_id FROM tasks t JOIN up ON t.id = up.parent_task_id
)
SELECT true AS holds WHERE EXISTS (SELECT 1 FROM notify_mutes m
                                   WHERE m.thread_id = %(thread_id)s OR m.thread_id IN (SELECT session_id FROM up))

-- name: list_deferred_notifications --
-- The notes waiting for the next digest (finished runs), oldest first, with how long the oldest has waited.
SELECT id, kind, task_id, thread_id, seq, title, body, url, detail,
       extract(epoch FROM now() - min(created_at) OVER ()) AS waited_s
FROM notifications WHERE outcome = 'deferred'
ORDER BY created_at, id
LIMIT 500

-- name: finish_deferred_notifications --
UPDATE notifications SET outcome = %(outcome)s, detail = coalesce(detail, '{}') || %(delivery)s
WHERE id = ANY(%(ids)s) AND outcome = 'deferred'

-- name: check_recent_notification --
SELECT true AS holds WHERE EXISTS (
    SELECT 1 FROM notifications
    WHERE kind = %(kind)s AND outcome IN ('sent', 'digested')
      AND created_at > now() - make_interval(secs => %(seconds)s)
      AND (task_id = %(task_id)s OR (%(task_id)s::uuid IS NULL AND thread_id IS NOT DISTINCT FROM %(thread_id)s::uuid))
)

-- name: check_question_notified --
-- A question's own note went out within the window (a question asked again is not pushed twice; two questions of
-- one task are two notes).
SELECT true AS holds WHERE EXISTS (
    SELECT 1 FROM notifications
    WHERE task_id IS NOT DISTINCT FROM %(task_id)s::uuid AND kind = %(kind)s AND outcome IN ('sent', 'digested')
      AND detail ->> 'question_id' = %(question_id)s::text
      AND created_at > now() - make_interval(secs => %(seconds)s)
)

-- name: record_notification --
INSERT INTO notifications (kind, task_id, thread_id, seq, title, body, url, outcome, detail)
VALUES (%(kind)s, %(task_id)s, %(thread_id)s, %(seq)s, %(title)s, %(body)s, %(url)s, %(outcome)s, %(detail)s)

-- name: list_push_subscriptions --
SELECT id, endpoint, p256dh, auth FROM push_subscriptions ORDER BY created_at

-- name: delete_push_subscription --
DELETE FROM push_subscriptions WHERE id = %(id)s

-- name: mark_push_failed --
UPDATE push_subscriptions SET last_error = %(error)s WHERE id = %(id)s

-- name: mark_push_succeeded --
UPDATE push_subscriptions SET last_success_at = now(), last_error = NULL WHERE id = %(id)s

-- name: claim_notify_requests --
UPDATE notify_queue q SET status = 'done', done_at = now()
FROM (SELECT id FROM notify_queue WHERE status = 'pending' ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT 10) p
WHERE q.id = p.id
RETURNING q.id, q.kind

-- name: finish_notify_request --
UPDATE notify_queue SET status = %(status)s, error = %(error)s, done_at = now() WHERE id = %(id)s

-- name: get_fleet_secret --
SELECT value FROM fleet_secrets WHERE name = %(name)s

-- name: offer_fleet_secret --
-- The first executor to get here sets the fleet's value; every later one reads that one.
INSERT INTO fleet_secrets (name, value, created_by) VALUES (%(name)s, %(value)s, %(created_by)s)
ON CONFLICT (name) DO NOTHING

-- name: try_duty_lock --
-- A once-per-fleet duty (the notifier): held on its own session; a survivor takes it when the holder's
-- session ends.
SELECT pg_try_advisory_lock(hashtext('petal-dispatch.duty:' || %(duty)s))

-- name: insert_notification_action --
-- A notification's one-use answer to a pending question, by its token's sha256 (the token itself is only in the
-- notification); none for a question no longer pending. Expired tokens go as new ones come.
WITH gone AS (DELETE FROM notification_actions WHERE expires_at < now() - interval '1 day')
INSERT INTO notification_actions (token_sha256, question_id, channel, expires_at)
SELECT %(sha256)s, q.id, %(channel)s, now() + make_interval(secs => %(ttl_s)s)
FROM questions q WHERE q.id = %(question_id)s AND q.status = 'pending'
RETURNING question_id
