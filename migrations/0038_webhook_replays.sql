-- A webhook delivery sent again is not a new trigger. GitHub's X-Hub-Signature-256 signs the body only: neither its
-- X-GitHub-Delivery id nor a date, so a captured delivery replayed under a new id passed as new. The ingress keeps
-- each accepted body's sha256 per routine for a retention window (ingress/routines.py) and refuses the same body
-- within it. (A Standard Webhooks delivery signs its id and timestamp: the id is refused again through
-- routine_queue's (routine_id, delivery_id), an old one by its timestamp's tolerance.)
CREATE TABLE routine_hook_bodies (
    routine_id  uuid NOT NULL REFERENCES routines (id),
    body_sha256 bytea NOT NULL CHECK (length(body_sha256) = 32),
    received_at timestamptz NOT NULL,
    PRIMARY KEY (routine_id, body_sha256)
);
-- the routine's expired receipts, removed as its next delivery is recorded
CREATE INDEX routine_hook_bodies_age_idx ON routine_hook_bodies (routine_id, received_at);
GRANT SELECT, INSERT, UPDATE, DELETE ON routine_hook_bodies TO petal_ingress;
