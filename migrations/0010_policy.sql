-- The not-clean-return policy: retries (with back-off), escalations the harness asks the user about,
-- and dispatch approvals in interactive threads.
ALTER TABLE tasks
    -- a retry is a new task: the attempt it repeats, and (for a back-off) the earliest time to run it
    ADD COLUMN retry_of uuid REFERENCES tasks (id),
    ADD COLUMN not_before timestamptz;
CREATE INDEX tasks_pending_idx ON tasks (created_at) WHERE status = 'pending';

-- who asked: the model (ask_user_question) or the harness itself (an approval, an escalation)
ALTER TABLE questions ADD COLUMN asked_by text NOT NULL DEFAULT 'model'
    CHECK (asked_by IN ('model', 'harness'));

-- An escalation: a worker's non-clean end the policy hands to the user. The question is the part the
-- user sees; this row is what the harness still owes once it is answered (acted on exactly once).
CREATE TABLE escalations (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    task_id     uuid NOT NULL REFERENCES tasks (id),
    thread_id   uuid REFERENCES sessions (id),
    question_id uuid NOT NULL UNIQUE REFERENCES questions (id),
    status      text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resolved')),
    decision    text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    resolved_at timestamptz
);
CREATE INDEX escalations_open_idx ON escalations (created_at) WHERE status = 'open';

GRANT SELECT, INSERT, UPDATE ON escalations TO petal_executor;
GRANT SELECT ON escalations TO petal_ingress;

-- only workers follow the policy (a role's behaviour is data)
ALTER TABLE role_profiles ADD COLUMN follows_policy boolean NOT NULL DEFAULT false;
UPDATE role_profiles SET follows_policy = true WHERE role = 'worker';

INSERT INTO event_types (name, tier, description) VALUES
    ('policy.decision', 'derived', 'what the not-clean-return policy did with a worker''s end (retry, back off, escalate, skip, report)'),
    ('escalation.resolved', 'derived', 'the user answered an escalation and the harness acted on it')
ON CONFLICT (name) DO NOTHING;
