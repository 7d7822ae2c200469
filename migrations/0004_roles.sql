-- Least privilege, enforced by PostgreSQL: the executor writes; the ingress reads, enqueues and answers.
-- Roles are cluster-wide, so another database of the same cluster may have made them already.
DO $$
BEGIN
    CREATE ROLE petal_executor LOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;
DO $$
BEGIN
    CREATE ROLE petal_ingress LOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;

GRANT USAGE ON SCHEMA public TO petal_executor, petal_ingress;

-- executor: sole writer of the journal (append only; the trigger refuses the rest)
GRANT SELECT, INSERT ON journal, event_types, contract TO petal_executor;
GRANT SELECT, UPDATE ON journal_head TO petal_executor;
GRANT SELECT ON task_statuses, contract_active TO petal_executor;
GRANT SELECT, INSERT, UPDATE, DELETE ON projects, sessions, tasks,
    chat_queue, stop_queue, thread_control_queue, questions TO petal_executor;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO petal_executor;

-- ingress: reads for views and SSE, INSERT into the three queues, answers questions
GRANT SELECT ON journal, event_types, projects, sessions, tasks, task_statuses, contract, contract_active,
    chat_queue, stop_queue, thread_control_queue, questions TO petal_ingress;
GRANT INSERT (thread_id, text, client_msg_id) ON chat_queue TO petal_ingress;
GRANT INSERT (task_id, reason) ON stop_queue TO petal_ingress;
GRANT INSERT (thread_id, action, args) ON thread_control_queue TO petal_ingress;
GRANT UPDATE (status, answers, response, answered_at) ON questions TO petal_ingress;
