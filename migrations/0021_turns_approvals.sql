-- Nothing the user says, answers or is owed gets lost: failed orchestrator turns are recorded and can be
-- retried, a dispatch approval is durable state (not a tool call that times out), and an answer to a
-- question that timed out is still delivered (to the thread, as a message).

-- The chat's Retry of a failed turn is a thread-control row the executor carries out (args: task_id).
ALTER TABLE thread_control_queue DROP CONSTRAINT thread_control_queue_action_check;
ALTER TABLE thread_control_queue ADD CONSTRAINT thread_control_queue_action_check
    CHECK (action IN ('create', 'rename', 'set_mode', 'archive', 'retry'));
-- a turn is run again at most once: "is it already repeated?" is asked on every re-run
CREATE INDEX tasks_retry_of_idx ON tasks (retry_of) WHERE retry_of IS NOT NULL;

-- A worker of an interactive thread waits, pending and unclaimed, until the user answers its approval
-- question; this row says the decision is owed (acted on exactly once, also across executor restarts).
CREATE TABLE approvals (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    task_id     uuid NOT NULL UNIQUE REFERENCES tasks (id),
    thread_id   uuid REFERENCES sessions (id),
    question_id uuid NOT NULL UNIQUE REFERENCES questions (id),
    status      text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resolved')),
    decision    text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    resolved_at timestamptz
);
CREATE INDEX approvals_open_idx ON approvals (created_at) WHERE status = 'open';
GRANT SELECT, INSERT, UPDATE ON approvals TO petal_executor;
GRANT SELECT ON approvals TO petal_ingress;

-- An ask_user_question that timed out in a thread stays pending (answerable, shown late); the tool has
-- returned, so the answer goes to the thread as a message instead. Delivered once: this table's key.
ALTER TABLE questions ADD COLUMN timed_out_at timestamptz;
CREATE TABLE late_answers (
    question_id  uuid PRIMARY KEY REFERENCES questions (id),
    chat_id      uuid,
    delivered_at timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT, INSERT ON late_answers TO petal_executor;
GRANT SELECT ON late_answers TO petal_ingress;

INSERT INTO event_types (name, tier, description) VALUES
    ('turn.failed', 'derived', 'an orchestrator turn ended other than success: its status, reason, messages and what the harness does (re-run, back off, escalate, leave it to the user''s Retry)'),
    ('approval.resolved', 'derived', 'the user answered a dispatch approval and the harness acted on it (the worker starts, or is cancelled)'),
    ('question.timed_out', 'raw', 'ask_user_question stopped waiting; the question stays answerable and a late answer goes to the thread as a message')
ON CONFLICT (name) DO NOTHING;
