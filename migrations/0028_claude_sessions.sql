-- The CLI's own stored conversations (`<config dir>/projects/<cwd slug>/<id>.jsonl`) on each executor of the
-- fleet: the executor that holds the files publishes what it found (executor/sessions/), the ingress lists it
-- (GET /api/claude-sessions) and never reads a file itself.
CREATE TABLE claude_sessions (
    executor          text NOT NULL,
    session_id        text NOT NULL,
    config_dir        text NOT NULL,
    path              text NOT NULL,
    cwd               text,
    title             text,                   -- the first prompt
    git_branch        text,
    last_activity     timestamptz,            -- the newest line's timestamp (else the file's mtime)
    message_count     integer NOT NULL DEFAULT 0,
    size_bytes        bigint NOT NULL DEFAULT 0,
    live_pid          integer,                -- a process (a terminal) using it now, as last seen
    readable          boolean NOT NULL DEFAULT true,
    unreadable_reason text,
    adoptable         boolean NOT NULL DEFAULT false,  -- its directory lies under the executor's project roots
    indexed_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (executor, session_id)
);
CREATE INDEX claude_sessions_activity_idx ON claude_sessions (last_activity DESC NULLS LAST, session_id);

-- A thread that continues a CLI conversation: which one, where its turns run, and how much of its file the
-- journal has (the terminal may go on with it between the phone's turns). Every thread also keeps the CLI
-- conversation its turns speak in and where, for the command that continues it in a terminal.
ALTER TABLE sessions
    ADD COLUMN adopted_session_id text,    -- the CLI conversation the thread was made from
    ADD COLUMN cli_session_id     text,    -- the CLI conversation its turns resume
    ADD COLUMN cli_config_dir     text,    -- the CLI's config directory for it (NULL: the executor's own)
    ADD COLUMN resume_command     text,    -- the shell command that continues it in a terminal
    ADD COLUMN cli_workdir        text,    -- the directory its turns run in
    ADD COLUMN cli_fork_from      text,    -- its first turn forks this conversation (a live process held it)
    ADD COLUMN cli_import_offset  bigint;  -- bytes of the conversation's file the journal has (NULL: none yet)
CREATE INDEX sessions_adopted_idx ON sessions (adopted_session_id) WHERE adopted_session_id IS NOT NULL;
CREATE INDEX sessions_cli_session_idx ON sessions (cli_session_id) WHERE cli_session_id IS NOT NULL;

GRANT SELECT, INSERT, UPDATE, DELETE ON claude_sessions TO petal_executor;
GRANT SELECT ON claude_sessions TO petal_ingress;

INSERT INTO event_types (name, tier, description) VALUES
    ('thread.adopted', 'raw', 'a thread was made from a CLI conversation stored on an executor (forked if a live process held it)'),
    ('thread.imported', 'raw', 'messages of a CLI conversation written outside petal were imported into its thread')
ON CONFLICT (name) DO NOTHING;
