-- After a failover to a standby that lacked commits the old primary acknowledged (asynchronous replication),
-- the executor raises the journal head past the seqs it saw and records the gap (shared/failover.py).
INSERT INTO event_types (name, tier, description) VALUES
    ('journal.seqs_lost', 'raw', 'a failover lost journal seqs the old primary had committed: the range, never reused')
ON CONFLICT (name) DO NOTHING;
