"""Hard gates: which worker tool calls a human must approve (or, in an autonomous thread, are refused).

`classify(tool_name, tool_input, workdir, home)` → a `Verdict`: `allowed` or one of the seed's gate
categories. It is pure (no I/O besides resolving paths: `..`, `~` and symlinks) and table-driven: the
tables below are the rules. Shell commands are parsed with bashlex and every simple command is looked at,
wherever it sits (`&&`, `;`, `|`, subshells, `$(…)`, backticks, functions, loops, heredocs fed to a
shell) and through wrappers (`sudo`, `env`, `nohup`, `time`, `timeout`, `xargs`, `bash -c`, `eval`,
`find -exec` …). What cannot be read — a parse failure, a command name or a write target computed at run
time — is gated as `opaque`. Scripts run by an interpreter (`python x.py`, `./build.sh`, `make`) are not
read: the gate covers the calls the model makes, not the programs those calls start.
README.md ("Gates") states these choices; tests/data/gate_corpus.tsv holds the examples.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import bashlex  # type: ignore[import-untyped]

ALLOWED = "allowed"
OUTSIDE_TREE = "outside_tree"
PRIVILEGE = "privilege_escalation"
NETWORK_CONFIG = "network_config"
SECRETS = "secrets"
DESTRUCTIVE = "destructive"
GIT_BEYOND_BRANCH = "git_beyond_branch"
DEPENDENCY = "dependency"
CROSS_SERVICE = "cross_service"
OPAQUE = "opaque"  # not one of the seed's eight: what the gate cannot read is gated, never guessed allowed

# Most severe first: a call that trips several gates is reported under the first.
SEVERITY = (PRIVILEGE, SECRETS, DESTRUCTIVE, GIT_BEYOND_BRANCH, CROSS_SERVICE, NETWORK_CONFIG, DEPENDENCY,
            OUTSIDE_TREE, OPAQUE)
CATEGORIES = frozenset(SEVERITY)
# The labels the handoff's gate_decisions has always used (policy.gate_of).
LABELS = {
    OUTSIDE_TREE: "outside the project tree",
    PRIVILEGE: "privilege escalation",
    NETWORK_CONFIG: "network config",
    SECRETS: "secrets",
    DESTRUCTIVE: "destructive data op",
    GIT_BEYOND_BRANCH: "git beyond the branch",
    DEPENDENCY: "new dependency",
    CROSS_SERVICE: "cross-service change",
    OPAQUE: "unreadable command",
}

# ---- tools ------------------------------------------------------------------------------------------------
# kind: "read" (read-only, path-bearing: only a secret path gates it), "free" (no effect outside the
# conversation), "edit" (writes its path), "shell". A tool not listed is opaque.
TOOLS: dict[str, str] = {
    "Read": "read", "Glob": "read", "Grep": "read", "LS": "read", "NotebookRead": "read",
    "WebFetch": "free", "WebSearch": "free", "TodoWrite": "free", "Task": "free", "Agent": "free",
    "BashOutput": "free", "KillShell": "free", "KillBash": "free", "ExitPlanMode": "free", "ToolSearch": "free",
    "ListMcpResourcesTool": "free", "ReadMcpResourceTool": "free", "StructuredOutput": "free",
    "Write": "edit", "Edit": "edit", "MultiEdit": "edit", "NotebookEdit": "edit",
    "Bash": "shell",
}
FREE_TOOL_PREFIXES = ("mcp__harness__",)  # the harness's own tools are its business, not a gate's
PATH_KEYS = ("file_path", "notebook_path", "path")

# ---- paths ------------------------------------------------------------------------------------------------
SECRET_NAMES = (  # fnmatch on the file name
    ".env", ".env.*", "*.env", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "*.pem", "*.key", "*.p12",
    "*.pfx", "*.jks", "*.keystore", "*.kdbx", ".netrc", ".pgpass", ".git-credentials", ".npmrc", ".pypirc",
    "credentials", "credentials.json", ".credentials.json", "secrets.*", "*.secret", "*.secrets", ".htpasswd",
    "shadow", "gshadow", "master.key", "known_hosts", "authorized_keys", "sudoers", "environ", ".*_history",
)
NOT_SECRET_NAMES = ("*.pub", ".env.example", ".env.sample", ".env.template", ".env.dist", "*.env.example")
SECRET_DIRS = (".ssh", ".gnupg", ".aws", ".kube", ".azure", ".password-store")  # any path component
SECRET_PATHS = ("*/.docker/config.json", "*/.config/gcloud", "*/.config/gcloud/*", "*/.config/gh/hosts.yml",
                "/etc/ssl/private", "/etc/ssl/private/*", "/proc/*/environ", "/run/secrets", "/run/secrets/*",
                "/var/run/secrets/*")  # fnmatch on the resolved path
SECRET_VARIABLE = re.compile(r"(SECRET|TOKEN|PASSWORD|PASSWD|API_?KEY|PRIVATE_KEY|CREDENTIAL|ACCESS_KEY)", re.I)
DEVICES = ("/dev/sd*", "/dev/hd*", "/dev/vd*", "/dev/xvd*", "/dev/nvme*", "/dev/mmcblk*", "/dev/disk/*",
           "/dev/mapper/*", "/dev/loop*", "/dev/mem", "/dev/kmem", "/dev/port")  # writing one destroys data
HARMLESS_WRITES = ("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/fd/*")
# Writing inside a repository's .git directory (hooks, config, refs) acts beyond a file edit.
GIT_DIR = ".git"


# ---- commands ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CommandRule:
    """One gate a command can trip. With no condition, any use trips it."""
    category: str
    # only when one of the first positional arguments is one of these
    subcommands: frozenset[str] | None = None
    # never when the first positional argument is one of these (read-only uses)
    except_subcommands: frozenset[str] = frozenset()
    # only when one of these flags is given (a short flag also counts inside a cluster: -rf has r and f)
    flags: frozenset[str] | None = None
    # only when the arguments, joined by spaces, match
    args_pattern: re.Pattern[str] | None = None


def _r(category: str, subs: str | None = None, *, unless: str = "", flags: str | None = None,
       args: str | None = None) -> CommandRule:
    return CommandRule(category, frozenset(subs.split()) if subs is not None else None, frozenset(unless.split()),
                       frozenset(flags.split()) if flags is not None else None,
                       re.compile(args, re.I) if args is not None else None)


# inline interpreter code is not read, unless it plainly starts programs
_RUNS_COMMANDS = r"(system|subprocess|popen|exec|spawn|child_process|`|%x)"
_INSTALL = "install i in add isntall ci update upgrade up"
_NOT_LOCAL = r"^(?!.*://(localhost|127\.0\.0\.1|\[::1\])[:/]).*"  # a call to a loopback service stays local
_SQL_DESTRUCTIVE = r"\b(drop\s+(table|database|schema|index|view)|truncate|delete\s+from\s+[\w.\"]+\s*(;|$|\"|'))|flushall|flushdb|dropDatabase"

# Checked for every command: a server bound to all interfaces is network-facing whatever starts it.
ANY_COMMAND: tuple[CommandRule, ...] = (
    _r(NETWORK_CONFIG, args=r"(^|\s)(--host|--bind|--listen|--address|-b|-H|-S)[=\s]?(0\.0\.0\.0|::|\[::\])"),
)
COMMANDS: dict[str, tuple[CommandRule, ...]] = {
    # privilege escalation
    **{n: (_r(PRIVILEGE),) for n in "sudo sudoedit doas pkexec run0 su runuser chroot nsenter setcap capsh visudo passwd "
                                   "chpasswd useradd usermod userdel groupadd groupmod gpasswd newgrp sg".split()},
    "chmod": (_r(PRIVILEGE, args=r"(^|\s)([ugoa]*[+=][rwxXt]*s|[0-7]?[4-7][0-7]{3})(\s|$)"),),
    "chown": (_r(PRIVILEGE, args=r"(^|\s)root([:.]|\s|$)"),),
    "mount": (_r(PRIVILEGE),), "umount": (_r(PRIVILEGE),), "modprobe": (_r(PRIVILEGE),), "insmod": (_r(PRIVILEGE),),
    "sysctl": (_r(PRIVILEGE, flags="-w --write -p --load"),),
    # network-facing config
    **{n: (_r(NETWORK_CONFIG),) for n in "iptables ip6tables iptables-restore nft ufw firewall-cmd netplan "
                                        "ngrok cloudflared tailscale wg wg-quick ifup ifdown".split()},
    "ip": (_r(NETWORK_CONFIG, "add del delete change replace set flush append"),),
    "ifconfig": (_r(NETWORK_CONFIG, args=r"\S+\s+\S"),),
    "route": (_r(NETWORK_CONFIG, "add del delete"),),
    "nmcli": (_r(NETWORK_CONFIG, "modify add delete up down connect disconnect on off"),),
    "nc": (_r(NETWORK_CONFIG, flags="-l --listen"),), "ncat": (_r(NETWORK_CONFIG, flags="-l --listen"),),
    "netcat": (_r(NETWORK_CONFIG, flags="-l --listen"),),
    "socat": (_r(NETWORK_CONFIG, args=r"LISTEN"),),
    "nginx": (_r(NETWORK_CONFIG, flags="-s"),), "caddy": (_r(NETWORK_CONFIG, "run start reload adapt"),),
    "python": (_r(NETWORK_CONFIG, args=r"-m\s+http\.server"), _r(DEPENDENCY, args=r"-m\s+pip\s+(install|download)"),
               _r(OPAQUE, args=r"(^|\s)-c\s.*" + _RUNS_COMMANDS)),
    **{n: (_r(OPAQUE, args=r"(^|\s)(-e|-E|--eval|-p|--print)\s.*" + _RUNS_COMMANDS),) for n in "perl ruby node deno".split()},
    "ssh": (_r(CROSS_SERVICE),), "scp": (_r(CROSS_SERVICE),), "sftp": (_r(CROSS_SERVICE),),
    # secrets
    "printenv": (_r(SECRETS),), "gpg": (_r(SECRETS, flags="--export-secret-keys --export-secret-subkeys -d --decrypt"),),
    "security": (_r(SECRETS, "find-generic-password find-internet-password dump-keychain"),),
    "vault": (_r(SECRETS, "read kv write login token"),), "pass": (_r(SECRETS),),
    "set": (_r(SECRETS, args=r"^$"),), "export": (_r(SECRETS, args=r"^(-p)?$"),),
    "declare": (_r(SECRETS, args=r"^-[a-z]*[xp][a-z]*$"),),
    # destructive data ops
    "rm": (_r(DESTRUCTIVE, flags="-r -R -f --recursive --force"), _r(DESTRUCTIVE, args=r"(^|\s)(\*|\S*/\*)(\s|$)")),
    "shred": (_r(DESTRUCTIVE),), "wipefs": (_r(DESTRUCTIVE),), "mkfs": (_r(DESTRUCTIVE),), "fdisk": (_r(DESTRUCTIVE),),
    "sfdisk": (_r(DESTRUCTIVE),), "parted": (_r(DESTRUCTIVE),), "mkswap": (_r(DESTRUCTIVE),),
    "dd": (_r(DESTRUCTIVE, args=r"(^|\s)of="),), "truncate": (_r(DESTRUCTIVE),),
    "dropdb": (_r(DESTRUCTIVE),), "dropuser": (_r(DESTRUCTIVE),),
    **{n: (_r(DESTRUCTIVE, args=_SQL_DESTRUCTIVE),) for n in "psql mysql mariadb sqlite3 redis-cli mongo mongosh "
                                                            "clickhouse-client cqlsh".split()},
    "find": (_r(DESTRUCTIVE, flags="-delete"),),
    "terraform": (_r(DESTRUCTIVE, "destroy"), _r(CROSS_SERVICE, "apply import taint state")),
    # dependency additions
    "pip": (_r(DEPENDENCY, "install download"),), "pipx": (_r(DEPENDENCY, "install run inject"),),
    "uv": (_r(DEPENDENCY, "add install sync tool"),), "uvx": (_r(DEPENDENCY),),
    "poetry": (_r(DEPENDENCY, "add install update"),), "pipenv": (_r(DEPENDENCY, "install update"),),
    "conda": (_r(DEPENDENCY, _INSTALL + " create"),), "mamba": (_r(DEPENDENCY, _INSTALL + " create"),),
    "npm": (_r(DEPENDENCY, _INSTALL + " exec x"),), "pnpm": (_r(DEPENDENCY, _INSTALL + " dlx"),),
    "yarn": (_r(DEPENDENCY, _INSTALL + " dlx"), _r(DEPENDENCY, args=r"^$")),
    "bun": (_r(DEPENDENCY, _INSTALL + " x"),), "bunx": (_r(DEPENDENCY),), "npx": (_r(DEPENDENCY),),
    "gem": (_r(DEPENDENCY, "install update"),), "bundle": (_r(DEPENDENCY, "add install update"),),
    "cargo": (_r(DEPENDENCY, "add install"),), "go": (_r(DEPENDENCY, "get install"),),
    "composer": (_r(DEPENDENCY, "require install update"),),
    **{n: (_r(DEPENDENCY, "install reinstall add upgrade dist-upgrade full-upgrade"),)
       for n in "apt apt-get aptitude yum dnf apk zypper pacman brew snap flatpak port nix-env".split()},
    "dpkg": (_r(DEPENDENCY, flags="-i --install"),), "rpm": (_r(DEPENDENCY, flags="-i -U --install --upgrade"),),
    # cross-service changes
    "systemctl": (_r(CROSS_SERVICE, unless="status show list-units list-unit-files list-timers is-active "
                                           "is-enabled is-failed cat help --version"),),
    "service": (_r(CROSS_SERVICE, args=r"\S+\s+(start|stop|restart|reload|force-reload|enable|disable)"),),
    "launchctl": (_r(CROSS_SERVICE),), "supervisorctl": (_r(CROSS_SERVICE, "start stop restart reload update"),),
    "pm2": (_r(CROSS_SERVICE, unless="list ls status logs describe show"),),
    **{n: (_r(CROSS_SERVICE, unless="ps images logs inspect version info stats top history search ls config compose"),
           _r(CROSS_SERVICE, "up down rm rmi stop restart run exec build pull push create kill start pause unpause "
                             "scale prune"))
       for n in "docker podman docker-compose nerdctl".split()},
    "kubectl": (_r(SECRETS, args=r"\bget\s+secrets?\b"),
                _r(CROSS_SERVICE, unless="get describe logs explain version api-resources config top")),
    "helm": (_r(CROSS_SERVICE, "install upgrade uninstall delete rollback"),),
    "aws": (_r(CROSS_SERVICE),), "gcloud": (_r(CROSS_SERVICE),), "az": (_r(CROSS_SERVICE),),
    "kill": (_r(CROSS_SERVICE, args=r"(^|\s)-1(\s|$)"),), "pkill": (_r(CROSS_SERVICE),),
    "killall": (_r(CROSS_SERVICE),), "crontab": (_r(CROSS_SERVICE, args=r"^(?!-l$)"),), "at": (_r(CROSS_SERVICE),),
    "curl": (_r(CROSS_SERVICE, args=_NOT_LOCAL + r"(-X\s*|--request[\s=])(POST|PUT|PATCH|DELETE)\b"),
             _r(CROSS_SERVICE, args=_NOT_LOCAL + r"(^|\s)(-d|--data\S*|-F|--form|-T|--upload-file)\s")),
    "rsync": (_r(CROSS_SERVICE, args=r"(^|\s)[\w.@-]+:\S*"),),
}

# Options that take a value before the subcommand, so the value is not read as the subcommand.
OPTION_VALUES: dict[str, frozenset[str]] = {
    "kubectl": frozenset("-n --namespace --context --kubeconfig --cluster --user -s --server -l -o -c".split()),
    "helm": frozenset("-n --namespace --kube-context --kubeconfig".split()),
    "docker": frozenset("-H --host -c --context --config -l --log-level -f --file -p --project-name".split()),
    "podman": frozenset("-H --host -c --context --config -l --log-level".split()),
    "systemctl": frozenset("-H --host -M --machine -p --property -t --type --state -n --lines -o --output".split()),
    "npm": frozenset("--prefix -w --workspace".split()), "pip": frozenset("--python".split()),
    "terraform": frozenset("-chdir".split()), "crontab": frozenset("-u".split()),
}
# Commands that take a shell string as an option's value (trap takes it as its first argument).
SHELL_STRING_OPTION = {"script": "-c", "su": "-c", "flock": "-c", "sg": "-c", "runuser": "-c"}

# Writers: which arguments are written. "all" positional arguments, or "last" (cp-like: the destination,
# or the -t DIR). The written path is checked against the tree; every path-like argument of any command is
# checked for secrets.
WRITERS: dict[str, str] = {
    # ln: both sides, since a link that points out of the tree is a way out of it
    **{n: "all" for n in "rm rmdir touch mkdir chmod chown chgrp truncate shred mv tee unlink mkfifo ln".split()},
    **{n: "last" for n in "cp install rsync scp".split()},
}
IN_PLACE = {"sed": "-i", "perl": "-i"}  # write their file arguments only with this flag
OUTPUT_OPTIONS = {"-o", "-O", "--output", "--output-document", "-C", "--directory", "-d", "--target-directory",
                  "--prefix", "-P", "--directory-prefix"}  # a path value written by curl/wget/tar/unzip/…
SHELLS = frozenset("bash sh zsh dash ksh ash fish busybox-sh".split())
# Prefix commands: run their argument vector as a command. The value lists the options that take a value.
WRAPPERS: dict[str, frozenset[str]] = {
    "sudo": frozenset("-u -g -h -p -C -D -r -t -U -T --user --group --host --prompt --close-from --chdir".split()),
    "doas": frozenset("-u -C".split()), "pkexec": frozenset("--user".split()), "run0": frozenset("-u --user".split()),
    "nohup": frozenset(), "time": frozenset("-f -o --format --output".split()), "command": frozenset(),
    "builtin": frozenset(), "exec": frozenset("-a".split()), "setsid": frozenset(), "unbuffer": frozenset(),
    "stdbuf": frozenset("-i -o -e".split()), "nice": frozenset("-n --adjustment".split()),
    "ionice": frozenset("-c -n -p -t".split()), "chrt": frozenset(), "taskset": frozenset(),
    "timeout": frozenset("-s -k --signal --kill-after".split()), "strace": frozenset("-e -o -p -s -u".split()),
    "ltrace": frozenset("-e -o -p -s -u".split()), "xargs": frozenset("-I -i -n -P -L -l -d -E -e -s -a "
                                                                      "--arg-file --delimiter --max-args "
                                                                      "--max-procs --replace".split()),
    "flock": frozenset("-w -E --timeout --conflict-exit-code".split()), "busybox": frozenset(),
    "caffeinate": frozenset(), "doppler": frozenset(), "chronic": frozenset(), "watch": frozenset("-n -d".split()),
    "env": frozenset("-u -C -S --unset --chdir --split-string".split()),
}
# wrappers whose first positional argument is not the command (timeout DURATION, chrt PRIO, flock FILE …)
WRAPPER_SKIP_FIRST = frozenset("timeout chrt taskset flock".split())
WRAPPERS_GATE = {"sudo": PRIVILEGE, "doas": PRIVILEGE, "pkexec": PRIVILEGE, "run0": PRIVILEGE}

MAX_DEPTH = 8  # nested bash -c / eval / $(…) levels read before the rest counts as opaque


# ---- verdicts ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Finding:
    category: str
    reason: str  # what tripped it, e.g. "sudo", "writes /etc/motd"


@dataclass(frozen=True)
class Verdict:
    category: str  # ALLOWED or the most severe finding's category
    findings: tuple[Finding, ...] = ()

    @property
    def gated(self) -> bool:
        return self.category != ALLOWED

    @property
    def label(self) -> str:
        return LABELS.get(self.category, self.category)

    @property
    def reason(self) -> str:
        return "; ".join(f.reason for f in self.findings if f.category == self.category)


def _verdict(findings: list[Finding]) -> Verdict:
    if not findings:
        return Verdict(ALLOWED)
    seen: dict[tuple[str, str], Finding] = {}
    for f in findings:
        seen.setdefault((f.category, f.reason), f)
    ordered = sorted(seen.values(), key=lambda f: SEVERITY.index(f.category))
    return Verdict(ordered[0].category, tuple(ordered))


def classify(tool_name: str, tool_input: dict[str, Any] | None, workdir: str | os.PathLike[str],
             home: str | os.PathLike[str]) -> Verdict:
    """The gate a tool call falls in, or `allowed`. `workdir` is the task's tree; `home` expands `~`."""
    tool_input = tool_input if isinstance(tool_input, dict) else {}
    paths = _Paths(os.path.realpath(workdir), os.path.realpath(home))
    kind = TOOLS.get(tool_name) or ("free" if tool_name.startswith(FREE_TOOL_PREFIXES) else None)
    if kind is None:
        return _verdict([Finding(OPAQUE, f"the tool {tool_name} is not known to the gate")])
    if kind == "free":
        return Verdict(ALLOWED)
    if kind == "shell":
        command = tool_input.get("command")
        if not isinstance(command, str):
            return _verdict([Finding(OPAQUE, "a Bash call without a command string")])
        return classify_command(command, workdir, home)
    findings: list[Finding] = []
    for key in PATH_KEYS:
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            resolved = paths.resolve(value, paths.root)
            if paths.secret(resolved):
                findings.append(Finding(SECRETS, f"{tool_name} {value}"))
            elif kind == "edit":
                findings += paths.write_findings(value, resolved, tool_name)
    return _verdict(findings)


def classify_command(command: str, workdir: str | os.PathLike[str], home: str | os.PathLike[str]) -> Verdict:
    """The gate a shell command falls in, or `allowed`."""
    shell = _Shell(_Paths(os.path.realpath(workdir), os.path.realpath(home)))
    shell.script(command, 0)
    return _verdict(shell.findings)


# ---- paths ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Paths:
    root: str
    home: str

    def expand_tilde(self, path: str) -> str:
        if path == "~" or path.startswith("~/"):
            return self.home + path[1:]
        if path.startswith("~"):  # ~user: another account's home, outside the tree either way
            user, _, rest = path[1:].partition("/")
            return os.path.join("/root" if user == "root" else f"/home/{user}", rest)
        return path

    def resolve(self, path: str, cwd: str) -> str:
        # realpath follows the symlinks that exist and folds "..": a link inside the tree that points out
        # of it resolves outside.
        return os.path.realpath(os.path.join(cwd, self.expand_tilde(path)))

    def inside(self, resolved: str) -> bool:
        return resolved == self.root or resolved.startswith(self.root.rstrip("/") + "/")

    @staticmethod
    def secret(resolved: str) -> bool:
        name = os.path.basename(resolved)
        if any(fnmatch.fnmatchcase(name, p) for p in NOT_SECRET_NAMES):
            return False
        if any(fnmatch.fnmatchcase(name, p) for p in SECRET_NAMES):
            return True
        parts = resolved.split("/")
        return any(d in parts for d in SECRET_DIRS) or any(fnmatch.fnmatchcase(resolved, p) for p in SECRET_PATHS)

    def write_findings(self, shown: str, resolved: str, what: str) -> list[Finding]:
        if any(fnmatch.fnmatchcase(resolved, p) for p in HARMLESS_WRITES):
            return []
        if any(fnmatch.fnmatchcase(resolved, p) for p in DEVICES):
            return [Finding(DESTRUCTIVE, f"{what} writes the device {shown}")]
        if not self.inside(resolved):
            return [Finding(OUTSIDE_TREE, f"{what} writes {shown}")]
        relative = os.path.relpath(resolved, self.root)
        if GIT_DIR in relative.split("/")[:-1]:
            return [Finding(GIT_BEYOND_BRANCH, f"{what} writes {relative}")]
        return []


# ---- the shell walker -------------------------------------------------------------------------------------
_PARAM = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])([^}]*)\}|\$([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])")
_PATHLIKE = re.compile(r"^(/|~|\.\.?(/|$))|/")
_TIME_KEYWORD = re.compile(r"(^|[;&|({!]\s*|\n\s*)time(?=\s)")
_EXPANDS = re.compile(r"[*?]|\[[^\]]+\]|\{[^}]*,[^}]*\}")
UNKNOWN = None  # a word whose value is only known at run time


@dataclass
class _Shell:
    paths: _Paths
    findings: list[Finding] = field(default_factory=list)
    cwd: str | None = None  # None: changed to a place known only at run time
    env: dict[str, str | None] = field(default_factory=dict)
    ifs_changed: bool = False

    def __post_init__(self) -> None:
        self.cwd = self.paths.root
        self.env = {"HOME": self.paths.home, "PWD": self.paths.root}

    def add(self, category: str, reason: str) -> None:
        self.findings.append(Finding(category, reason))

    def script(self, text: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            self.add(OPAQUE, "commands nested too deep to read")
            return
        if not text.strip():
            return
        try:
            trees = bashlex.parse(text)
        except NotImplementedError as exc:
            if "time command" not in str(exc):
                self.add(OPAQUE, f"the shell parser cannot read it ({type(exc).__name__})")
                return
            # bashlex lacks the `time` keyword; `\time` is the same command as a plain word, which it reads
            rewritten = _TIME_KEYWORD.sub(r"\1\\time", text)
            if rewritten == text:
                self.add(OPAQUE, "the shell parser cannot read a `time` here")
            else:
                self.script(rewritten, depth)
            return
        except Exception as exc:  # bashlex raises ParsingError, NotImplementedError (case, $((…)), [[ …]]) …
            self.add(OPAQUE, f"the shell parser cannot read it ({type(exc).__name__})")
            return
        for tree in trees:
            self.node(tree, depth)

    # -- nodes
    def node(self, n: Any, depth: int, stdin_from: list[str] | None = None) -> None:
        kind = n.kind
        if kind == "command":
            self.command(n, depth, stdin_from)
        elif kind == "pipeline":
            upstream: list[str] = []
            for part in n.parts:
                if part.kind in ("pipe", "reservedword"):
                    continue
                self.node(part, depth, upstream)
                first = [w.word for w in part.parts if w.kind == "word"][:1] if part.kind == "command" else []
                upstream = upstream + (first or ["(compound)"])
        elif kind == "list":
            for part in n.parts:
                if part.kind != "operator":
                    self.node(part, depth)
        elif kind == "compound":
            subshell = bool(n.list) and getattr(n.list[0], "word", None) == "("
            saved = (self.cwd, dict(self.env))
            for part in n.list:
                self.node(part, depth)
            if subshell:
                self.cwd, self.env = saved[0], saved[1]
            for r in getattr(n, "redirects", []) or []:
                self.redirect(r, depth)
        elif kind == "for":
            self.for_loop(n, depth)
        elif kind in ("if", "while", "until", "function"):
            for part in n.parts:
                if part.kind not in ("reservedword", "word"):
                    self.node(part, depth)
                elif part.kind == "word" and kind != "function":
                    self.word(part, depth)
        elif kind in ("reservedword", "operator", "pipe"):
            return
        else:
            self.add(OPAQUE, f"an unexpected shell construct ({kind})")

    def for_loop(self, n: Any, depth: int) -> None:
        parts = list(n.parts)
        var = parts[1].word if len(parts) > 1 and parts[1].kind == "word" else None
        items: list[str | None] = []
        body = [p for p in parts if p.kind not in ("reservedword", "word")]
        if len(parts) > 2 and getattr(parts[2], "word", None) == "in":
            for p in parts[3:]:
                if p.kind == "word":
                    items.append(self.word(p, depth))
                elif getattr(p, "word", None) in (";", "do", "\n"):
                    break
        for value in (items[:16] or [UNKNOWN]):  # bind the variable to each item in turn
            if var:
                self.env[var] = value
            for b in body:
                self.node(b, depth)

    def word(self, w: Any, depth: int) -> str | None:
        """A word's value with the variables we know substituted; walks its $(…) / `…` / <(…) commands."""
        value: str | None = w.word
        has_param = False
        for part in getattr(w, "parts", []) or []:
            if part.kind in ("commandsubstitution", "processsubstitution"):
                saved = (self.cwd, dict(self.env))
                self.node(part.command, depth + 1)
                self.cwd, self.env = saved
                value = UNKNOWN
            elif part.kind == "parameter":
                has_param = True
                name = re.match(r"[A-Za-z_][A-Za-z0-9_]*", part.value or "")
                if name and SECRET_VARIABLE.search(name.group(0)):
                    self.add(SECRETS, f"reads ${name.group(0)}")
        if value is not UNKNOWN and has_param:
            value = None if self.ifs_changed else self.substitute(value)
        if value is not UNKNOWN and value.startswith("~"):
            value = self.paths.expand_tilde(value)
        return value

    def substitute(self, text: str) -> str | None:
        unknown = False

        def one(m: re.Match[str]) -> str:
            nonlocal unknown
            name, rest = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), "")
            value = self.cwd if name == "PWD" else self.env.get(name)
            if value is None and rest.startswith((":-", "-")):
                return rest.split("-", 1)[1]
            if value is None:
                unknown = True
                return ""
            return value
        result = _PARAM.sub(one, text)
        return None if unknown else result

    def redirect(self, r: Any, depth: int) -> None:
        target = r.output if not isinstance(r.output, int) else None
        heredoc = getattr(r, "heredoc", None)
        if target is None or r.type in (">&", "<&") and target.word.isdigit():
            return
        if r.type in ("<<", "<<-", "<<<") or heredoc is not None:  # data, not a file (a here-string's
            self.word(target, depth)                                 # $(…) still runs)
            return
        self.path(self.word(target, depth), target.word, depth, write=r.type != "<", what="redirect")

    def path(self, value: str | None, shown: str, depth: int, *, write: bool, what: str) -> None:
        if value is UNKNOWN or (self.cwd is None and not value.startswith("/")):
            if write:
                self.add(OPAQUE, f"{what} writes a path known only at run time ({shown})")
            return
        if "://" in value:
            return
        resolved = self.paths.resolve(value, self.cwd or "/")
        if self.paths.secret(resolved):
            self.add(SECRETS, f"{what} touches {shown}")
        elif write:
            self.findings.extend(self.paths.write_findings(shown, resolved, what))

    # -- simple commands
    def command(self, n: Any, depth: int, upstream: list[str] | None) -> None:
        words: list[str | None] = []
        shown: list[str] = []
        heredoc: str | None = None
        for part in n.parts:
            if part.kind == "word":
                value = self.word(part, depth)
                if value is not None and any(p.kind == "parameter" for p in getattr(part, "parts", []) or []):
                    # an unquoted expansion is split into words: C="sudo ls"; $C runs sudo
                    split = value.split() or [""]
                    words += split
                    shown += [part.word] * len(split)
                else:
                    words.append(value)
                    shown.append(part.word)
            elif part.kind == "assignment":
                name, _, raw = part.word.partition("=")
                val = self.word(part, depth)
                if not any(p.kind == "word" for p in n.parts):  # X=… alone sets the shell's variable
                    self.env[name] = None if val is None else val.partition("=")[2]
                    if name == "IFS":  # word splitting is no longer what we assume: expansions are unknown
                        self.ifs_changed = True
            elif part.kind == "redirect":
                self.redirect(part, depth)
                if getattr(part, "heredoc", None) is not None:
                    heredoc = part.heredoc.value.rsplit("\n", 1)[0] if "\n" in part.heredoc.value else ""
        if words:
            self.argv(words, shown, depth, upstream or [], heredoc)

    def argv(self, words: list[str | None], shown: list[str], depth: int, upstream: list[str],
             heredoc: str | None = None) -> None:
        if not words:
            return
        first = words[0]
        if first is UNKNOWN:
            self.add(OPAQUE, f"the command name is computed at run time ({shown[0]})")
            return
        if _EXPANDS.search(first):  # {sudo,ls} or /usr/bin/su?o: the name the shell runs is not this word
            self.add(OPAQUE, f"the command name is expanded at run time ({shown[0]})")
            return
        name = _name(first)
        args = words[1:]
        args_shown = shown[1:]
        joined = " ".join(a if a is not None else "$?" for a in args)
        reason = " ".join(shown)[:120]

        for rule in (*COMMANDS.get(name, ()), *ANY_COMMAND):
            if _matches(rule, name, args, joined):
                self.add(rule.category, reason)
        if name in WRAPPERS:
            self.wrapper(name, args, args_shown, depth, upstream, reason)
            return
        if name in SHELLS:
            self.shell(name, args, depth, upstream, heredoc, reason)
            return
        if name == "eval":
            if any(a is UNKNOWN for a in args):
                self.add(OPAQUE, f"eval of a value known only at run time ({reason})")
            else:
                self.script(" ".join(a for a in args if a is not None), depth + 1)
            return
        if name == "git":
            self.git(args, args_shown, depth, reason)
            return
        option = SHELL_STRING_OPTION.get(name)
        if (option in args and args.index(option) + 1 < len(args)) or (name == "trap" and args):
            code = args[0] if name == "trap" else args[args.index(option) + 1]  # type: ignore[arg-type]
            if code is UNKNOWN:
                self.add(OPAQUE, f"runs a shell string known only at run time ({reason})")
            else:
                self.script(code, depth + 1)
        if name in ("cd", "pushd", "popd"):
            self.cd(name, args, depth)
            return
        if name == "alias":  # the snapshot shell may expand aliases: read what each one would run
            for a in args:
                if a is not None and "=" in a:
                    self.script(a.partition("=")[2], depth + 1)
            return
        if name in ("export", "declare", "typeset", "local", "readonly"):
            for a in args:
                if a is not None and "=" in a and not a.startswith("-"):
                    key, _, val = a.partition("=")
                    self.env[key] = val
            if name != "export":
                return
        if name == "find":
            self.find(args, args_shown, depth)
        if name == "env" and not any(a is not None and not a.startswith("-") and "=" not in a for a in args):
            self.add(SECRETS, "env prints the environment")
        self.arguments(name, args, args_shown, depth)

    def arguments(self, name: str, args: list[str | None], shown: list[str], depth: int) -> None:
        mode = WRITERS.get(name)
        in_place = IN_PLACE.get(name)
        if in_place and any(a is not None and a.startswith(in_place) for a in args):
            mode = "all"
        positional = [(a, s) for a, s in zip(args, shown) if a is None or not a.startswith("-")]
        written: set[int] = set()
        if mode == "all":
            written = set(range(len(positional)))
        elif mode == "last" and positional:
            written = {len(positional) - 1}
        for i, (a, s) in enumerate(positional):
            if i in written:
                self.path(a, s, depth, write=True, what=name)
            elif a is not None and (_PATHLIKE.search(a) or _Paths.secret(a)):
                self.path(a, s, depth, write=False, what=name)
        # option values: -t DIR for cp-likes, -o FILE, --output=FILE, -C DIR for tar …
        for i, a in enumerate(args):
            if a is None:
                continue
            opt, eq, val = a.partition("=")
            if eq and opt.startswith("-"):
                self.path(val, shown[i], depth, write=opt in OUTPUT_OPTIONS | {"--target-directory", "of"}, what=name)
            elif a.startswith("of=") and name == "dd":
                self.path(a[3:], shown[i], depth, write=True, what=name)
            elif (a in OUTPUT_OPTIONS or (a == "-t" and mode)) and i + 1 < len(args):
                self.path(args[i + 1], shown[i + 1], depth, write=True, what=name)

    def wrapper(self, name: str, args: list[str | None], shown: list[str], depth: int, upstream: list[str],
                reason: str) -> None:
        if name in WRAPPERS_GATE:
            self.add(WRAPPERS_GATE[name], reason)
        takes_value = WRAPPERS[name]
        i = 0
        skipped_first = name not in WRAPPER_SKIP_FIRST
        while i < len(args):
            a = args[i]
            if a is None:
                break
            if a == "--":
                i += 1
                break
            if name == "env" and "=" in a and not a.startswith("-"):
                i += 1
                continue
            if name == "env" and a.startswith(("-S", "--split-string")):
                rest = a[2:] if a.startswith("-S") and len(a) > 2 else (args[i + 1] if i + 1 < len(args) else "")
                self.script(rest or "", depth + 1)
                return
            if name == "env" and a in ("-C", "--chdir") and i + 1 < len(args):
                self.cd("cd", args[i + 1:i + 2], depth)
            if a.startswith("-") and a != "-":
                i += 2 if a in takes_value else 1
                continue
            if not skipped_first:
                skipped_first = True
                i += 1
                continue
            break
        rest, rest_shown = args[i:], shown[i:]
        if name == "watch" and rest:
            if any(r is UNKNOWN for r in rest):
                self.add(OPAQUE, f"watch of a command known only at run time ({reason})")
            else:
                self.script(" ".join(r for r in rest if r is not None), depth + 1)
            return
        if name == "command" and args and args[0] in ("-v", "-V"):
            return
        if rest:
            self.argv(rest, rest_shown, depth, upstream)
        elif name == "env":
            self.add(SECRETS, "env prints the environment")

    def shell(self, name: str, args: list[str | None], depth: int, upstream: list[str], heredoc: str | None,
              reason: str) -> None:
        skip_next = False
        for i, a in enumerate(args):
            if a is None:
                self.add(OPAQUE, f"a shell runs something known only at run time ({reason})")
                return
            if a in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
                skip_next = True
                continue
            if skip_next:
                skip_next = False
                continue
            if a.startswith("-") and not a.startswith("--") and "c" in a[1:]:
                code = args[i + 1] if i + 1 < len(args) else ""
                if code is UNKNOWN:
                    self.add(OPAQUE, f"a shell runs something known only at run time ({reason})")
                else:
                    self.script(code, depth + 1)
                return
            if not a.startswith("-"):
                self.path(a, a, depth, write=False, what=name)  # a script file: not read, only its path
                return
        if heredoc is not None:
            self.script(heredoc, depth + 1)
        elif any(_name(u) in ("curl", "wget", "fetch") for u in upstream):
            self.add(DEPENDENCY, f"runs downloaded code ({reason})")
        elif upstream:
            self.add(OPAQUE, f"a shell runs what a pipe feeds it ({reason})")

    def git(self, args: list[str | None], shown: list[str], depth: int, reason: str) -> None:
        i = 0
        while i < len(args):  # global options before the subcommand
            a = args[i]
            if a in ("-C", "--git-dir", "--work-tree") and i + 1 < len(args):
                self.path(args[i + 1], shown[i + 1], depth, write=True, what="git")
                i += 2
            elif a == "-c" and i + 1 < len(args):
                self.git_config(args[i + 1], depth, reason)
                i += 2
            elif a is not None and a.startswith(("--git-dir=", "--work-tree=")):
                self.path(a.partition("=")[2], shown[i], depth, write=True, what="git")
                i += 1
            elif a is not None and a.startswith("-"):
                i += 1
            else:
                break
        if i >= len(args):
            return
        sub, rest = args[i], args[i + 1:]
        if sub is UNKNOWN:
            self.add(OPAQUE, f"a git subcommand known only at run time ({reason})")
            return
        flags = {a for a in rest if a is not None and a.startswith("-")}
        positional = [a for a in rest if a is None or not a.startswith("-")]
        category = GIT_RULES.get(sub)
        if callable(category):
            category = category(flags, positional)
        if category:
            self.add(category, reason)
        if sub == "config" and len(positional) >= 2 and positional[0] is not None:
            self.git_config(f"{positional[0]}={positional[1]}", depth, reason, stored=True)
        if sub == "clone" and len(positional) >= 2:
            self.path(positional[1], positional[1] or "?", depth, write=True, what="git clone")
        elif sub == "config" and flags & {"--global", "--system"}:
            self.add(OUTSIDE_TREE, reason)
        else:
            for a, s in zip(rest, shown[i + 1:]):
                if a is not None and not a.startswith("-") and _PATHLIKE.search(a) and ":" not in a:
                    self.path(a, s, depth, write=False, what="git")

    def git_config(self, setting: str | None, depth: int, reason: str, *, stored: bool = False) -> None:
        """`git -c key=value` (this call) / `git config key value` (stored): some keys make git run commands."""
        if setting is UNKNOWN:
            self.add(OPAQUE, f"a git setting known only at run time ({reason})")
            return
        key, _, value = setting.partition("=")
        if key.lower().startswith("alias.") and value.startswith("!"):
            self.script(value[1:], depth + 1)
        if GIT_COMMAND_KEYS.match(key):
            self.add(GIT_BEYOND_BRANCH if stored else OPAQUE, f"git setting {key} ({reason})")

    def cd(self, name: str, args: list[str | None], depth: int) -> None:
        targets = [a for a in args if a is None or not a.startswith("-")]
        if name == "popd" or (targets and targets[0] in ("-",)):
            self.cwd = None
            return
        target = targets[0] if targets else self.paths.home
        if target is UNKNOWN:
            self.cwd = None
            return
        if self.cwd is None and not target.startswith("/"):
            return
        self.cwd = self.paths.resolve(target, self.cwd or "/")
        self.env["PWD"] = self.cwd

    def find(self, args: list[str | None], shown: list[str], depth: int) -> None:
        # {} stands for a file found under the first start path, so `find / -exec rm {} ;` writes outside
        start = next((a for a in args if a is None or not a.startswith(("-", "(", "!"))), ".")
        found = UNKNOWN if start is UNKNOWN else os.path.join(start, "found")
        i = 0
        while i < len(args):
            if args[i] in ("-exec", "-execdir", "-ok", "-okdir"):
                end = next((j for j in range(i + 1, len(args)) if args[j] in (";", "+", "\\;")), len(args))
                inner = [a if a != "{}" else found for a in args[i + 1:end]]
                self.argv(inner, [s for s in shown[i + 1:end]], depth + 1, [])
                i = end + 1
            else:
                i += 1


def _git_checkout(flags: set[str], positional: list[str | None]) -> str | None:
    # `git checkout -- paths` restores files; anything else moves to another branch or commit
    return None if "--" in positional or "--" in flags else GIT_BEYOND_BRANCH


def _git_branch(flags: set[str], positional: list[str | None]) -> str | None:
    listing = {"-a", "-r", "-l", "--list", "-v", "-vv", "--all", "--remotes", "--show-current", "--contains",
               "--merged", "--no-merged"}
    return None if not positional or flags & listing else GIT_BEYOND_BRANCH


def _git_reset(flags: set[str], positional: list[str | None]) -> str | None:
    return DESTRUCTIVE if "--hard" in flags or "--merge" in flags or "--keep" in flags else None


def _git_listing_or(category: str) -> Any:
    def rule(flags: set[str], positional: list[str | None]) -> str | None:
        return category if positional or flags - {"-l", "--list", "-n", "-v", "--verbose"} else None
    return rule


GIT_RULES: dict[str, Any] = {
    "push": GIT_BEYOND_BRANCH, "pull": GIT_BEYOND_BRANCH, "merge": GIT_BEYOND_BRANCH, "rebase": GIT_BEYOND_BRANCH,
    "switch": GIT_BEYOND_BRANCH, "checkout": _git_checkout, "branch": _git_branch,
    "tag": _git_listing_or(GIT_BEYOND_BRANCH), "remote": _git_listing_or(GIT_BEYOND_BRANCH),
    "worktree": _git_listing_or(GIT_BEYOND_BRANCH), "update-ref": GIT_BEYOND_BRANCH,
    "filter-branch": GIT_BEYOND_BRANCH, "filter-repo": GIT_BEYOND_BRANCH, "replace": GIT_BEYOND_BRANCH,
    "symbolic-ref": GIT_BEYOND_BRANCH, "send-email": GIT_BEYOND_BRANCH, "submodule": DEPENDENCY,
    "reset": _git_reset, "clean": lambda flags, pos: DESTRUCTIVE if any("f" in f for f in flags if not
                                                                        f.startswith("--")) or "--force" in flags
    else None,
    "stash": lambda flags, pos: DESTRUCTIVE if pos and pos[0] in ("drop", "clear") else None,
    "gc": lambda flags, pos: DESTRUCTIVE if any(f.startswith("--prune") for f in flags) else None,
    "reflog": lambda flags, pos: DESTRUCTIVE if pos and pos[0] in ("expire", "delete") else None,
    "credential": SECRETS,
}


# git settings that run commands or redirect where git reads and writes
GIT_COMMAND_KEYS = re.compile(r"(?i)^(alias\.|core\.(hookspath|sshcommand|fsmonitor|pager|editor|askpass|gitproxy)$|"
                              r"credential\.|url\.|remote\.|include\.|includeif\.|filter\.|"
                              r"diff\..*\.(textconv|command)$|merge\..*\.driver$|sequence\.editor$|gpg\.program$)")


def _name(word: str) -> str:
    """A command's name as the table knows it: /usr/bin/sudo → sudo, python3.11 → python, mkfs.ext4 → mkfs."""
    name = word.rsplit("/", 1)[-1].lstrip("\\")
    if name in COMMANDS or name in WRAPPERS or name in SHELLS or name in WRITERS:
        return name
    base = re.sub(r"[\d.]+$", "", name)
    if base and base in COMMANDS:
        return base
    head = name.split(".", 1)[0]
    return head if head in COMMANDS else name


def _positional(name: str, args: list[str | None]) -> list[str | None]:
    """The arguments that are not options nor an option's value (`kubectl -n prod get` → [get])."""
    takes_value = OPTION_VALUES.get(name, frozenset())
    positional: list[str | None] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a is not None and a.startswith("-"):
            skip = a in takes_value
        else:
            positional.append(a)
    return positional


def _matches(rule: CommandRule, name: str, args: list[str | None], joined: str) -> bool:
    positional = _positional(name, args)
    if rule.subcommands is not None and not any(p in rule.subcommands for p in positional[:3]):
        return False
    if rule.except_subcommands and positional and positional[0] in rule.except_subcommands:
        return False
    if rule.except_subcommands and not positional and not args:
        return False
    if rule.flags is not None and not any(_has_flag(a, rule.flags) for a in args if a is not None):
        return False
    if rule.args_pattern is not None and not rule.args_pattern.search(joined):
        return False
    return True


def _has_flag(arg: str, flags: frozenset[str]) -> bool:
    if arg in flags or arg.partition("=")[0] in flags:
        return True
    if arg.startswith("-") and not arg.startswith("--") and len(arg) > 2:  # a cluster: -rf
        return any(f"-{c}" in flags for c in arg[1:])
    return False


# ---- decisions --------------------------------------------------------------------------------------------
Mode = Literal["interactive", "autonomous"]
Decision = Literal["allow", "deny", "ask"]


def decide(verdict: Verdict, mode: Mode, *, standing_rule: bool = False) -> Decision:
    """What the permission path does with a classified call: allowed calls and calls a standing rule covers
    run; a gated call is asked about in an interactive thread and refused in an autonomous one."""
    if not verdict.gated or standing_rule:
        return "allow"
    return "ask" if mode == "interactive" else "deny"


def deny_message(verdict: Verdict, *, why: str | None = None) -> str:
    """The text the model reads when a gated call is refused."""
    detail = f" ({verdict.reason})" if verdict.reason else ""
    reason = why or "this thread runs autonomously, and such calls need a person's approval"
    return (f"Refused at the hard gate '{verdict.label}'{detail}: {reason}. Stay within the task's scope: do "
            "not retry this call or work around it; finish what you can and say in your report what needs "
            "approval.")


def rule_covers(pattern: str, rule_tool: str, tool_name: str, tool_input: dict[str, Any] | None) -> bool:
    """Whether a standing rule (gate_rules row) covers a call. A Bash rule is the exact command, or a prefix
    ending in ':*' that covers only one simple command starting with those words — so `npm test:*` never
    covers `npm test && sudo …` or `npm test $(…)`. Other tools' rules are the exact path."""
    if rule_tool != tool_name or not isinstance(tool_input, dict):
        return False
    if tool_name != "Bash":
        return any(tool_input.get(k) == pattern for k in PATH_KEYS)
    command = tool_input.get("command")
    if not isinstance(command, str):
        return False
    if not pattern.endswith(":*"):
        return command.strip() == pattern.strip()
    words = _simple_words(command)
    prefix = _simple_words(pattern[:-2])
    return bool(words and prefix) and words[:len(prefix)] == prefix  # type: ignore[index]


def _simple_words(command: str) -> list[str] | None:
    """The words of a single simple command with nothing expanded or redirected, else None."""
    try:
        trees = bashlex.parse(command)
    except Exception:
        return None
    if len(trees) != 1 or trees[0].kind != "command":
        return None
    parts = trees[0].parts
    if any(p.kind != "word" or getattr(p, "parts", None) for p in parts):
        return None
    return [p.word for p in parts]


# ---- the permission prompt tool's answer (docs/claude-cli.md: one text block holding this JSON) ----------
def summary(tool_name: str, tool_input: dict[str, Any] | None, limit: int = 300) -> str:
    """What an approval card and the journal show of a call: the command, or the path, else the input."""
    tool_input = tool_input if isinstance(tool_input, dict) else {}
    if isinstance(tool_input.get("command"), str):
        text = tool_input["command"]
    else:
        text = next((v for k in PATH_KEYS if isinstance(v := tool_input.get(k), str)), None) or json.dumps(
            tool_input, ensure_ascii=False, sort_keys=True)
    return f"{tool_name}: {text}"[:limit]


def permission_result(decision: Literal["allow", "deny"], tool_input: dict[str, Any], message: str = "") -> str:
    """The text the permission prompt tool returns. Allow passes the input back unchanged (the CLI runs
    `updatedInput`); deny's message is exactly what the model reads."""
    if decision == "allow":
        return json.dumps({"behavior": "allow", "updatedInput": tool_input})
    return json.dumps({"behavior": "deny", "message": message or "Refused at a hard gate."})
