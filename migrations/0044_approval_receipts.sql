-- Approval receipts: an approval binds to exactly what was approved. A gate card or a dispatch approval
-- carries, in its question, the sha256 of canonical JSON of what it asks about (the tool and its input; the
-- worker's role, brief, project, tools and directory). When the user's approval is acted on, what is about
-- to run is hashed the same way: one receipt per approval, and a mismatch refuses to run (journaled as
-- approval.mismatch). GET /api/receipts exports them with what then ran, its cost and its outcome.
CREATE TABLE approval_receipts (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    kind            text NOT NULL CHECK (kind IN ('gate', 'dispatch')),
    question_id     uuid NOT NULL REFERENCES questions (id),
    task_id         uuid NOT NULL REFERENCES tasks (id),  -- gate: whose call; dispatch: the worker approved
    thread_id       uuid,
    tool_use_id     text,  -- gate: the call's id
    subject         text NOT NULL,  -- what the card showed in one line (the call's summary, the brief's start)
    answer          text,
    answered_by     text,
    approved_sha256 text CHECK (approved_sha256 ~ '^[0-9a-f]{64}$'),  -- NULL: asked before receipts existed
    checked_sha256  text NOT NULL CHECK (checked_sha256 ~ '^[0-9a-f]{64}$'),  -- what was about to run
    matched         boolean NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX approval_receipts_thread ON approval_receipts (thread_id, created_at);

GRANT SELECT, INSERT ON approval_receipts TO petal_executor;
GRANT SELECT ON approval_receipts TO petal_ingress;

INSERT INTO event_types (name, tier, description) VALUES
    ('approval.mismatch', 'derived', 'an approval''s receipt did not match what was about to run (the approved '
                                     'input''s hash differs): refused, nothing ran')
ON CONFLICT (name) DO NOTHING;
