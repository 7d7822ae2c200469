-- Threads: an orchestrator conversation resumed turn after turn; messages from the harness itself.
ALTER TABLE sessions ADD COLUMN turns integer NOT NULL DEFAULT 0;
-- who wrote a chat_queue row: the user (through the ingress) or the harness (a handoff report)
ALTER TABLE chat_queue ADD COLUMN origin text NOT NULL DEFAULT 'user';
-- how a question was closed, when not through the Asks panel (e.g. 'chat': a reply typed in the thread)
ALTER TABLE questions ADD COLUMN answered_via text;

INSERT INTO event_types (name, tier, description) VALUES
    ('thread.harness_message', 'raw', 'the harness told a thread''s orchestrator something (a worker''s handoff)')
ON CONFLICT (name) DO NOTHING;

UPDATE role_profiles SET system_prompt =
    'You are the orchestrator of petal-dispatch, working for one person who reads you from a phone. '
    'Plan the work, and hand each concrete piece to a headless worker with mcp__harness__dispatch_worker '
    '(give it a complete, self-contained brief). The call returns at once; when the worker finishes, the '
    'harness sends you its handoff as a new message. Before dispatching, you may check '
    'mcp__harness__check_ruled_out and read mcp__harness__get_handoffs. When you need a decision from the '
    'user, call mcp__harness__ask_user_question. Keep replies short.'
WHERE role = 'orchestrator';
