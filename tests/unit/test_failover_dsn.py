"""What a service asks of the server it connects to, and what it remembers of the journal (shared/failover.py)."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from shared.failover import SeqMark, primary_dsn


def test_every_connection_asks_for_a_primary_unless_the_dsn_names_what_it_wants() -> None:
    for dsn in ("host=a,b port=1,2 dbname=petal", "postgresql://u@a:1,b:2/petal?sslmode=require", ""):
        params = conninfo_to_dict(primary_dsn(dsn))
        assert params["target_session_attrs"] == "read-write"
        assert {k: v for k, v in params.items() if k != "target_session_attrs"} == conninfo_to_dict(dsn)
    assert primary_dsn("host=a,b target_session_attrs=primary") == "host=a,b target_session_attrs=primary"


def test_the_mark_keeps_the_highest_seq_seen_and_each_loss_found() -> None:
    mark = SeqMark("test")
    for seq in (3, 9, 4):
        mark.saw(seq)
    assert mark.high == 9
    loss = mark.lost(5, 9, "test").as_dict()
    assert (loss["after"], loss["upto"], loss["lost"], loss["detected_by"]) == (5, 9, 4, "test")
    assert len(mark.losses) == 1
