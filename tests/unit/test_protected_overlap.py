"""How a tree a worker writes meets what no worker may write (shared/protected.py), and the error tree callers catch
(shared/errors.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared import errors
from shared.protected import overlap

pytestmark = pytest.mark.unit

PROTECTED = (("the service's checkout", Path("/srv/petal")), ("the data directory", Path("/var/lib/petal")))


def test_the_first_protected_path_met_is_the_one_named() -> None:
    # the root contains both: the first listed is said
    assert overlap(Path("/"), PROTECTED) == "contains the service's checkout (/srv/petal)"
    assert overlap(Path("/var"), PROTECTED) == "contains the data directory (/var/lib/petal)"


def test_a_path_beside_a_protected_one_does_not_meet_it() -> None:
    for beside in ("/srv/petal-work", "/srv/other", "/var/lib/petalx", "/var/lib/petal2/x"):
        assert overlap(Path(beside), PROTECTED) is None, beside


def test_the_home_is_protected_only_when_given_and_only_against_containing_it() -> None:
    home = Path("/home/u")
    assert overlap(Path("/home/u"), (), home=home) == "contains this user's home (/home/u), its dotfiles included"
    assert overlap(Path("/"), (), home=home) is not None
    assert overlap(Path("/home/u"), ()) is None  # no home given: nothing said of it
    assert overlap(Path("/home/u/projects/x"), (), home=home) is None  # inside the home is where projects lie
    assert overlap(Path("/home/other"), (), home=home) is None


def test_a_protected_path_wins_over_the_home() -> None:
    protected = (("the venv", Path("/home/u/.venv")),)
    assert overlap(Path("/home/u"), protected, home=Path("/home/u")) == "contains the venv (/home/u/.venv)"


def test_the_error_tree_lets_callers_catch_by_what_happened() -> None:
    unknown = errors.UnknownEventType([("task.odd", "raw"), ("x.y", "derived")])
    assert isinstance(unknown, errors.JournalRefused) and isinstance(unknown, errors.JournalWriteError)
    assert unknown.pairs == [("task.odd", "raw"), ("x.y", "derived")]
    assert "'task.odd' (tier raw), 'x.y' (tier derived)" in str(unknown) and "INSERT INTO event_types" in str(unknown)
    refused = errors.Missing("no such thread", constraint="tasks_session_id_fkey")
    assert isinstance(refused, errors.DatabaseRefused) and refused.constraint == "tasks_session_id_fkey"
    assert errors.Conflict("dup").constraint is None
    # an outage and a contention are not refusals: a caller retrying refusals would loop on them
    for state in (errors.DatabaseUnavailable("away"), errors.Contended("deadlock")):
        assert isinstance(state, errors.PetalError) and not isinstance(state, errors.DatabaseRefused)
