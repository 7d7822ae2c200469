-- The permission path is wired (issue 18): every Bash/edit call of a spawn that has the harness MCP goes
-- through the harness's permission tool. No role pre-allows those tools any more: a pre-allowed call would
-- skip the CLI's own asking should the hook ever fail (docs/claude-cli.md "Permission path"). Read-only
-- tools stay allowed: they need no round trip.
UPDATE role_profiles
SET allowed_tools = ARRAY(SELECT t FROM unnest(allowed_tools) AS t
                          WHERE split_part(t, '(', 1) NOT IN ('Bash', 'Write', 'Edit', 'MultiEdit', 'NotebookEdit'))
WHERE role IN ('worker', 'orchestrator');

INSERT INTO event_types (name, tier, description) VALUES
    ('gate.rule_added', 'derived', 'a standing gate rule was made from an approval card''s answer')
ON CONFLICT (name) DO NOTHING;

-- "Always allow `npm test` in this thread/project", asked for from the page or the API: the ingress only
-- queues the request; the executor validates it, makes the gate_rules row and journals it.
CREATE TABLE gate_rule_queue (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    scope        text NOT NULL CHECK (scope IN ('thread', 'project')),
    thread_id    uuid,
    project_id   uuid,
    tool_name    text NOT NULL CHECK (length(tool_name) BETWEEN 1 AND 200),
    pattern      text NOT NULL CHECK (length(pattern) BETWEEN 1 AND 4000),
    requested_by text NOT NULL,
    status       text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'claimed', 'done', 'failed')),
    error        text,
    rule_id      uuid REFERENCES gate_rules (id),
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    CHECK ((scope = 'thread') = (thread_id IS NOT NULL)),
    CHECK ((scope = 'project') = (project_id IS NOT NULL))
);
CREATE INDEX gate_rule_queue_pending_idx ON gate_rule_queue (created_at) WHERE status = 'pending';

CREATE TRIGGER gate_rule_queue_notify AFTER INSERT ON gate_rule_queue
    FOR EACH ROW EXECUTE FUNCTION notify_row_id('gate_rule_queue');

GRANT SELECT, INSERT ON gate_rule_queue TO petal_ingress;
GRANT SELECT, UPDATE ON gate_rule_queue TO petal_executor;
