-- Worker isolation: whether each executor sandboxes its spawns (the page warns when one does not), and the
-- hosts a project's workers may reach besides the operator's allowlist (PETAL_SANDBOX_ALLOW).

-- 'bwrap': every spawn sandboxed; 'off': the operator's explicit PETAL_SANDBOX=off
ALTER TABLE executors ADD COLUMN sandbox text NOT NULL DEFAULT 'bwrap' CHECK (sandbox IN ('bwrap', 'off'));

-- host, host:port or *.domain entries; each one checked by the executor before it is stored
ALTER TABLE projects ADD COLUMN sandbox_allow text[] NOT NULL DEFAULT '{}'
    CHECK (cardinality(sandbox_allow) <= 100);
