-- Pushing a worker's branch: a project may name a push remote (an https:// or http:// URL, or the absolute path of
-- a repository), given by the user when the project is registered or later (an `update` request). It is data the
-- user gave, never read from the repository's config at push time. `push` pushes exactly the reviewed commit (the
-- head_commit of the worker's recorded changes) to refs/heads/<branch> on it, in a sandbox whose only way out is
-- that remote. The existing grants cover the new column (the executor writes projects, the ingress reads them).
ALTER TABLE projects ADD COLUMN push_remote text CHECK (length(push_remote) BETWEEN 1 AND 2000);

ALTER TABLE project_queue DROP CONSTRAINT project_queue_action_check;
ALTER TABLE project_queue ADD CONSTRAINT project_queue_action_check
    CHECK (action IN ('create', 'update', 'merge', 'discard', 'push'));

INSERT INTO event_types (name, tier, description) VALUES
    ('project.updated',  'raw', 'a project''s settings were changed by the user (its push remote: before and after)'),
    ('task.pushed',      'raw', 'the user pushed a worker''s reviewed commit to the project''s push remote (remote, '
                                'branch, commit)'),
    ('task.push_failed', 'raw', 'a push was refused or git failed (the reason, git''s last lines); the remote''s '
                                'branch was not set')
ON CONFLICT (name) DO NOTHING;
