-- Notifications: reach the user's phone when Claude needs them, a worker stalls, or a turn finishes.

-- Web Push subscriptions, written by the ingress when a browser opts in; the executor removes one the
-- push service reports gone (404/410).
CREATE TABLE push_subscriptions (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    endpoint        text NOT NULL UNIQUE CHECK (endpoint ~ '^https?://'),
    p256dh          text NOT NULL,
    auth            text NOT NULL,
    user_agent      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_success_at timestamptz,
    last_error      text
);

-- The executor's VAPID public key, so the ingress can hand it to browsers (the private key stays with
-- the executor, in its data directory or its environment).
CREATE TABLE push_config (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    public_key text NOT NULL,
    ntfy       boolean NOT NULL DEFAULT false,  -- whether the executor also posts to an ntfy topic
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Which thread a page is looking at, refreshed while it is visible: a turn that finishes while someone
-- watches its thread needs no notification.
CREATE TABLE client_presence (
    client_id  text PRIMARY KEY CHECK (length(client_id) BETWEEN 8 AND 100),
    thread_id  uuid,
    seen_at    timestamptz NOT NULL DEFAULT now()
);

-- A queue of notification requests from the ingress (e.g. "send me a test").
CREATE TABLE notify_queue (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    kind       text NOT NULL CHECK (kind IN ('test')),
    status     text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'done', 'failed')),
    error      text,
    created_at timestamptz NOT NULL DEFAULT now(),
    done_at    timestamptz
);
CREATE TRIGGER notify_queue_notify AFTER INSERT ON notify_queue
    FOR EACH ROW EXECUTE FUNCTION notify_row_id('notify_queue');

-- What was sent (or held back by the rate limit): the rate limit's memory and the record.
CREATE TABLE notifications (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    kind       text NOT NULL,
    task_id    uuid,
    thread_id  uuid,
    seq        bigint,
    title      text NOT NULL,
    body       text NOT NULL,
    url        text NOT NULL,
    outcome    text NOT NULL CHECK (outcome IN ('sent', 'digested', 'rate_limited', 'no_channel', 'failed')),
    detail     jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX notifications_recent_idx ON notifications (task_id, kind, created_at);

-- Where the notifier has read the journal up to (a restart neither repeats nor skips a notification).
CREATE TABLE notify_cursor (
    id       boolean PRIMARY KEY DEFAULT true CHECK (id),
    last_seq bigint NOT NULL
);

GRANT SELECT, INSERT, UPDATE, DELETE ON push_subscriptions, push_config, notifications, notify_cursor,
    notify_queue TO petal_executor;
GRANT SELECT ON client_presence TO petal_executor;
GRANT SELECT ON push_config, notify_queue TO petal_ingress;
GRANT SELECT, DELETE ON push_subscriptions TO petal_ingress;
GRANT INSERT (endpoint, p256dh, auth, user_agent), UPDATE (p256dh, auth, user_agent) ON push_subscriptions
    TO petal_ingress;
GRANT SELECT, INSERT, UPDATE ON client_presence TO petal_ingress;
GRANT INSERT (kind) ON notify_queue TO petal_ingress;
