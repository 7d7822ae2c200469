-- One session, two screens: the user's own interactive Claude Code held by an executor in a pseudo-terminal
-- (`petal-dispatch claude`), followed and steered from the page. Its run is a task of role `terminal` in a
-- thread made for it; once the terminal's process ends, the thread continues the same conversation with
-- --resume. The row says which executor holds the process, who holds its screen now, and whether a message from
-- the page waits on text the user is typing.
INSERT INTO role_profiles (role, description, system_prompt, allowed_tools, use_mcp) VALUES
    ('terminal', 'the user''s own interactive Claude Code, held in a pseudo-terminal by an executor', '', '{}', true)
ON CONFLICT (role) DO NOTHING;

-- whether a role's end is its thread's turn boundary (retried, escalated, told to the thread): data, not a
-- category; a terminal's end is the user's, never re-run
ALTER TABLE role_profiles ADD COLUMN turn_of_thread boolean NOT NULL DEFAULT true;
UPDATE role_profiles SET turn_of_thread = false WHERE role = 'terminal';

CREATE TABLE terminal_sessions (
    task_id        uuid PRIMARY KEY REFERENCES tasks (id),
    thread_id      uuid NOT NULL REFERENCES sessions (id),
    executor_name  text NOT NULL,
    cli_session_id text NOT NULL,
    cwd            text NOT NULL,
    sandboxed      boolean NOT NULL,
    -- the terminal showing it now (its tty, as the wrapper named it); NULL: detached, running on its own
    held_by        text CHECK (length(held_by) BETWEEN 1 AND 200),
    -- a message from the page waits while the terminal's input line holds the user's typing
    input_waiting  boolean NOT NULL DEFAULT false,
    started_at     timestamptz NOT NULL DEFAULT now(),
    ended_at       timestamptz,
    exit_code      integer,
    end_reason     text
);
-- one live terminal a thread
CREATE UNIQUE INDEX terminal_sessions_live_idx ON terminal_sessions (thread_id) WHERE ended_at IS NULL;
GRANT SELECT, INSERT, UPDATE ON terminal_sessions TO petal_executor;
GRANT SELECT ON terminal_sessions TO petal_ingress;

ALTER TABLE thread_control_queue DROP CONSTRAINT thread_control_queue_action_check;
ALTER TABLE thread_control_queue ADD CONSTRAINT thread_control_queue_action_check
    CHECK (action IN ('create', 'rename', 'set_mode', 'archive', 'retry', 'review', 'end_terminal'));

INSERT INTO event_types (name, tier, description) VALUES
    ('terminal.started',  'raw', 'a terminal''s interactive Claude Code started under the executor (its directory, '
                                 'arguments, conversation, sandboxed or not)'),
    ('terminal.entry',    'raw', 'an entry the terminal''s CLI wrote to its conversation (its text, tool calls and '
                                 'results)'),
    ('terminal.attached', 'raw', 'a terminal took the session''s screen'),
    ('terminal.detached', 'raw', 'the session''s terminal went away; the session runs on under the executor'),
    ('terminal.input_waiting', 'raw', 'a message from the page waits while the terminal''s input line holds text'),
    ('terminal.typed',    'raw', 'a message from the page was typed into the session at its prompt'),
    ('terminal.ended',    'raw', 'the terminal''s CLI exited (its exit code, and who ended it)')
ON CONFLICT (name) DO NOTHING;
