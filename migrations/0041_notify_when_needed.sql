-- Notifications only when needed (executor/notify/notifier.py): nothing while a page is in front of the user on
-- any device (presence now says whether the page is visible, not only which thread it shows), finished runs
-- folded into a periodic digest, quiet hours, and threads the user muted. What the notifier holds back is still
-- recorded, with why.
ALTER TABLE client_presence ADD COLUMN visible boolean NOT NULL DEFAULT false;

-- A thread the user asked not to be notified about (the ingress writes it: a preference, like a subscription).
CREATE TABLE notify_mutes (
    thread_id uuid PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    muted_by  text NOT NULL CHECK (length(muted_by) BETWEEN 1 AND 200),
    muted_at  timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT ON notify_mutes TO petal_executor;
GRANT SELECT, INSERT, DELETE ON notify_mutes TO petal_ingress;

-- deferred: waiting for the next digest; page_visible, quiet, muted: held back, and why
ALTER TABLE notifications DROP CONSTRAINT notifications_outcome_check;
ALTER TABLE notifications ADD CONSTRAINT notifications_outcome_check CHECK (outcome IN (
    'sent', 'digested', 'rate_limited', 'no_channel', 'failed', 'deferred', 'page_visible', 'quiet', 'muted'));
CREATE INDEX notifications_deferred_idx ON notifications (created_at) WHERE outcome = 'deferred';

-- what will notify, as the executor is configured (the page's notification settings show it)
ALTER TABLE push_config ADD COLUMN policy jsonb NOT NULL DEFAULT '{}';
