-- Projects on real repositories: a queue the ingress writes (create a project, merge or discard a worker's
-- branch), each worker of a project in its own git worktree on its own branch, and what it changed.

ALTER TABLE projects
    -- a repository file the plan was read from (relative to workdir), when it was not pasted
    ADD COLUMN plan_path text;

-- A worker of a project runs in a worktree of its own (a role's behaviour is data, not a category in code).
ALTER TABLE role_profiles ADD COLUMN isolated_worktree boolean NOT NULL DEFAULT false;
UPDATE role_profiles SET isolated_worktree = true WHERE role = 'worker';

ALTER TABLE tasks
    ADD COLUMN worktree            text,
    ADD COLUMN branch              text,
    -- the project's branch and commit the worktree was made from (what its diff is taken against)
    ADD COLUMN base_branch         text,
    ADD COLUMN base_commit         text,
    ADD COLUMN changes_recorded_at timestamptz,
    -- what the user did with the branch: NULL while it waits for review, then merged or discarded
    ADD COLUMN review              text CHECK (review IN ('merged', 'discarded'));
CREATE INDEX tasks_project_idx ON tasks (project_id, created_at);

CREATE TABLE project_queue (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    action     text NOT NULL CHECK (action IN ('create', 'merge', 'discard')),
    -- merge and discard name the worker task whose branch they act on
    task_id    uuid,
    args       jsonb NOT NULL DEFAULT '{}'::jsonb,
    status     text NOT NULL DEFAULT 'pending'
               CHECK (status IN ('pending', 'claimed', 'done', 'failed')),
    error      text,
    result     jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    claimed_at timestamptz,
    done_at    timestamptz
);
CREATE INDEX project_queue_pending_idx ON project_queue (created_at) WHERE status IN ('pending', 'claimed');
CREATE TRIGGER project_queue_notify AFTER INSERT ON project_queue
    FOR EACH ROW EXECUTE FUNCTION notify_row_id('project_queue');

GRANT SELECT, INSERT, UPDATE ON project_queue TO petal_executor;
GRANT SELECT ON project_queue TO petal_ingress;
GRANT INSERT (action, task_id, args) ON project_queue TO petal_ingress;

INSERT INTO event_types (name, tier, description) VALUES
    ('project.created',       'raw', 'a project was registered on a git repository'),
    ('project.refused',       'raw', 'a project request was refused (the reason says why); nothing was created'),
    ('task.worktree_created', 'raw', 'a worker of a project got its own git worktree and branch'),
    ('task.worktree_removed', 'raw', 'a worker''s worktree was removed after its changes were recorded'),
    ('task.changes',          'derived', 'what a worker changed, recorded by code after its exit: commits, files, diffstat, the diff (bounded)'),
    ('task.merged',           'raw', 'the user merged a worker''s branch into the project''s branch'),
    ('task.merge_failed',     'raw', 'a merge was refused or conflicted; the repository was left as it was'),
    ('task.discarded',        'raw', 'the user discarded a worker''s branch')
ON CONFLICT (name) DO NOTHING;
