-- Harness MCP caller identity: every spawn gets a random credential, sent by the CLI as a header from
-- its per-spawn MCP config. Only its SHA-256 is stored, so a reader of the database cannot call as a
-- task. The server resolves task, session and thread from the credential alone; it is refused once its
-- process has exited (revoked_at) or its task is no longer 'running', though the row stays, for the record.
CREATE TABLE harness_credentials (
    token_sha256 bytea PRIMARY KEY CHECK (length(token_sha256) = 32),
    task_id      uuid NOT NULL UNIQUE REFERENCES tasks (id) ON DELETE CASCADE,
    -- the spawn's own conversation (the thread is derived from it and the task's parent)
    session_id   uuid NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- set when the spawn's process exits: a surviving grandchild that read the config cannot call as it
    revoked_at   timestamptz
);

-- The executor only: the ingress never needs to know who may call the harness.
GRANT SELECT, INSERT, UPDATE, DELETE ON harness_credentials TO petal_executor;

INSERT INTO event_types (name, tier, description) VALUES
    ('harness.call_refused', 'raw',
     'the harness MCP refused a tool call without a valid per-spawn credential (reason and peer; nothing else written)')
ON CONFLICT (name) DO NOTHING;
