-- Budgets that ask: a routine run whose process the CLI stopped at the run's USD cap, or whose next process would
-- start with the cap spent, pauses (no process held; the run does not end) and asks the user: raise this run's cap
-- by $X, or stop here. The ask is an escalation of kind 'budget' (acted on once by the settler, like any other);
-- raising adds to the run's usd_raised and runs the stopped task again; stopping, or no answer by the deadline
-- of an unattended (autonomous) run, ends the run with the reason.
ALTER TABLE escalations
    ADD COLUMN kind      text NOT NULL DEFAULT 'policy' CHECK (kind IN ('policy', 'budget')),
    ADD COLUMN run_id    uuid REFERENCES routine_runs (id),
    ADD COLUMN raise_usd numeric(12, 4) CHECK (raise_usd > 0),
    ADD COLUMN deadline  timestamptz,  -- an unattended run's: past it, the question closes unanswered
    ADD COLUMN reason    text,  -- a budget ask that ended its run: why (the run's reason)
    ADD CONSTRAINT escalations_budget_run CHECK (kind <> 'budget' OR (run_id IS NOT NULL AND raise_usd IS NOT NULL));
CREATE INDEX escalations_deadline_idx ON escalations (deadline) WHERE status = 'open' AND deadline IS NOT NULL;
CREATE INDEX escalations_run_idx ON escalations (run_id) WHERE run_id IS NOT NULL;

-- what the user added to the run's USD per run, answering its budget asks
ALTER TABLE routine_runs ADD COLUMN usd_raised numeric(12, 4) NOT NULL DEFAULT 0 CHECK (usd_raised >= 0);

INSERT INTO event_types (name, tier, description) VALUES
    ('budget.asked', 'derived', 'a routine run reached its USD cap and asks the user: raise it by raise_usd, or stop '
                                '(spent, cap, the stopped task, the deadline of an unattended run)'),
    ('budget.resolved', 'derived', 'a budget ask was answered: raised (the stopped task runs again), stopped, or '
                                   'expired (no answer by its deadline); the run''s new cap or its reason')
ON CONFLICT (name) DO NOTHING;
