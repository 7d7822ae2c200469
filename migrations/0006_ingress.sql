-- What the ingress reads for its views and SSE resume.
GRANT SELECT ON journal_head TO petal_ingress;
CREATE INDEX journal_tier_seq_idx ON journal (tier, seq);
CREATE INDEX journal_project_seq_idx ON journal (project_id, seq);
CREATE INDEX questions_task_idx ON questions (task_id);
CREATE INDEX tasks_parent_idx ON tasks (parent_task_id);
