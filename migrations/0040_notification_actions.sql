-- Acting on a notification without opening the page: a question's Web Push notification (and ntfy's, on an
-- access-controlled topic) carries its options as actions and a token that answers that one question, once.
-- The notifier (executor) mints it as it sends and keeps only its sha256; the ingress redeems it (POST
-- /api/notify/act, no user credential: the token is the credential), marking it used in the transaction that
-- answers the question. A token is bound to its question and channel, and expires.
CREATE TABLE notification_actions (
    token_sha256 bytea PRIMARY KEY CHECK (length(token_sha256) = 32),
    question_id  uuid NOT NULL REFERENCES questions (id) ON DELETE CASCADE,
    channel      text NOT NULL CHECK (channel IN ('push', 'ntfy')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    used_at      timestamptz,
    used_choice  text CHECK (length(used_choice) <= 1000)
);
CREATE INDEX notification_actions_question_idx ON notification_actions (question_id);
CREATE INDEX notification_actions_expiry_idx ON notification_actions (expires_at);
GRANT SELECT, INSERT, DELETE ON notification_actions TO petal_executor;
GRANT SELECT, UPDATE (used_at, used_choice) ON notification_actions TO petal_ingress;
