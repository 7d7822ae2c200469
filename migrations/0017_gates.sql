-- Hard gates: standing rules ("always allow `npm test` in this project") and the gate.decided event.
-- Not used by code yet: the permission path (issue 18) reads and writes them once it is wired.

-- A standing rule covers later identical calls within its scope (a thread = its orchestrator session,
-- a project, or one task) until revoked. `pattern` is an exact command or path, or a command prefix
-- ending in ':*' that only covers a single simple command (executor/gates/classify.py rule_covers).
CREATE TABLE gate_rules (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    scope       text NOT NULL CHECK (scope IN ('thread', 'project', 'task')),
    session_id  uuid REFERENCES sessions (id),
    project_id  uuid REFERENCES projects (id),
    task_id     uuid REFERENCES tasks (id),
    tool_name   text NOT NULL CHECK (length(tool_name) BETWEEN 1 AND 200),
    pattern     text NOT NULL CHECK (length(pattern) BETWEEN 1 AND 4000),
    decision    text NOT NULL CHECK (decision IN ('allow', 'deny')),
    category    text,  -- the gate the call fell in when the rule was made
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    revoked_by  text,
    -- exactly the scope's own key is set
    CHECK ((scope = 'thread') = (session_id IS NOT NULL)),
    CHECK ((scope = 'project') = (project_id IS NOT NULL)),
    CHECK ((scope = 'task') = (task_id IS NOT NULL)),
    CHECK ((revoked_at IS NULL) = (revoked_by IS NULL))
);
CREATE INDEX gate_rules_live_idx ON gate_rules (tool_name, scope) WHERE revoked_at IS NULL;

INSERT INTO event_types (name, tier, description) VALUES
    ('gate.decided', 'derived', 'a gated tool call was decided: category, tool, summary, decision, decided_by (user, rule or autonomous policy), wait time')
ON CONFLICT (name) DO NOTHING;

GRANT SELECT, INSERT, UPDATE ON gate_rules TO petal_executor;
-- the page lists the rules and revokes them; rules are made by the harness from an approval's answer
GRANT SELECT ON gate_rules TO petal_ingress;
GRANT UPDATE (revoked_at, revoked_by) ON gate_rules TO petal_ingress;
