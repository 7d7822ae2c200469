-- name: get_push_config --
SELECT public_key, ntfy, policy, updated_at FROM push_config

-- name: list_notify_mutes --
SELECT m.thread_id FROM notify_mutes m ORDER BY m.muted_at

-- name: insert_notify_mute --
-- A thread's notifications muted (a thread: an orchestrator session); muting again changes nothing.
WITH made AS (
    INSERT INTO notify_mutes (thread_id, muted_by)
    SELECT s.id, %(muted_by)s FROM sessions s WHERE s.id = %(thread_id)s AND s.role = 'orchestrator'
    ON CONFLICT (thread_id) DO NOTHING
    RETURNING thread_id, muted_by, muted_at
)
SELECT thread_id, muted_by, muted_at FROM made
UNION ALL
SELECT thread_id, muted_by, muted_at FROM notify_mutes WHERE thread_id = %(thread_id)s

-- name: delete_notify_mute --
DELETE FROM notify_mutes WHERE thread_id = %(thread_id)s RETURNING thread_id

-- name: count_push_subscriptions --
SELECT count(*) AS subscriptions FROM push_subscriptions

-- name: upsert_push_subscription --
INSERT INTO push_subscriptions (endpoint, p256dh, auth, user_agent)
VALUES (%(endpoint)s, %(p256dh)s, %(auth)s, %(user_agent)s)
ON CONFLICT (endpoint) DO UPDATE SET p256dh = EXCLUDED.p256dh, auth = EXCLUDED.auth, user_agent = EXCLUDED.user_agent
RETURNING id, endpoint, created_at

-- name: delete_push_subscription_by_endpoint --
DELETE FROM push_subscriptions WHERE endpoint = %(endpoint)s RETURNING id

-- name: get_push_subscription_by_endpoint --
SELECT id, created_at, last_success_at, last_error FROM push_subscriptions WHERE endpoint = %(endpoint)s

-- name: enqueue_notify --
INSERT INTO notify_queue (kind) VALUES (%(kind)s) RETURNING id, kind, status, created_at

-- name: upsert_presence --
INSERT INTO client_presence (client_id, thread_id, visible, seen_at)
VALUES (%(client_id)s, %(thread_id)s, %(visible)s, now())
ON CONFLICT (client_id) DO UPDATE SET thread_id = EXCLUDED.thread_id, visible = EXCLUDED.visible, seen_at = now()
RETURNING client_id, thread_id, visible, seen_at

-- name: get_notification_action --
-- A notification's answer button, by its token's sha256, with the question it answers; locked until the answer
-- (or the refusal) commits, so a token answers once.
SELECT a.question_id, a.channel, a.used_at, a.expires_at <= now() AS expired,
       q.status, q.questions, q.answered_by
FROM notification_actions a JOIN questions q ON q.id = a.question_id
WHERE a.token_sha256 = %(sha256)s
FOR UPDATE OF a

-- name: mark_notification_action_used --
UPDATE notification_actions SET used_at = now(), used_choice = %(choice)s
WHERE token_sha256 = %(sha256)s AND used_at IS NULL
