-- What the supervisor needs: role profiles as data, the task's directory and tools, a wake-up on dispatch.

-- How a role is run is data: a new role is an INSERT, never a code change.
CREATE TABLE role_profiles (
    role          text PRIMARY KEY,
    description   text NOT NULL DEFAULT '',
    system_prompt text NOT NULL DEFAULT '',
    allowed_tools text[] NOT NULL DEFAULT '{}',
    -- whether its runs get the harness MCP server
    use_mcp       boolean NOT NULL DEFAULT true,
    created_at    timestamptz NOT NULL DEFAULT now()
);

INSERT INTO role_profiles (role, description, system_prompt, allowed_tools, use_mcp) VALUES
    ('worker', 'a headless worker that does one brief',
     'You are a worker run by petal-dispatch. Do the brief you are given, in the current directory. '
     'When you finish, say plainly what you did, what state the work is in, what you ruled out and why, '
     'and what the next step is.',
     '{Bash,Read,Edit,Write,Glob,Grep}', true),
    ('orchestrator', 'the conversation that plans and dispatches workers', '', '{}', true),
    ('extractor', 'derives a structured handoff from a finished worker', '', '{}', false);

ALTER TABLE tasks
    ADD COLUMN workdir text,
    ADD COLUMN allowed_tools text[],
    ADD COLUMN stop_requested_at timestamptz;

CREATE FUNCTION tasks_notify_pending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'pending' THEN
        PERFORM pg_notify('task_pending', NEW.id::text);
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER tasks_notify_pending AFTER INSERT ON tasks
    FOR EACH ROW EXECUTE FUNCTION tasks_notify_pending();

-- Task state changes reach the ingress's views without polling (an id, never a body).
CREATE FUNCTION tasks_notify_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status OR NEW.activity IS DISTINCT FROM OLD.activity THEN
        PERFORM pg_notify('task_changed', NEW.id::text);
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER tasks_notify_changed AFTER UPDATE ON tasks
    FOR EACH ROW EXECUTE FUNCTION tasks_notify_changed();

GRANT SELECT, INSERT, UPDATE ON role_profiles TO petal_executor;
GRANT SELECT ON role_profiles TO petal_ingress;

-- services check that the schema is current before they start
GRANT SELECT ON schema_migrations TO petal_executor, petal_ingress;
