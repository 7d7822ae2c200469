"""The hard gates' rules, as data: categories, tools, secret paths, commands and their gated uses.

The classifier (classify.py, shell.py, paths.py, matching.py) reads commands and paths and applies these tables;
a rule change is an edit here, with a line in tests/data/gate_corpus.tsv saying what it catches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

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
# The CLI reads its project settings from the tree's .claude directory: a permission list there pre-allows
# calls, and a hook there runs any command the next time a tool is called. Writing it is granting oneself
# rights.
AGENT_CONFIG_DIR = ".claude"


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
RUNS_COMMANDS = r"(system|subprocess|popen|exec|spawn|child_process|`|%x)"
INTERPRETERS = frozenset("python perl ruby node deno php".split())
_INSTALL = "install i in add isntall ci update upgrade up"
# A state-changing HTTP call is a cross-service change whatever its host: loopback is no exception, since the
# ingress, the harness and anything else the machine serves listen there (a POST to the ingress can answer
# the user's questions). A plain GET stays allowed, to any host.
_METHODS = r"(POST|PUT|PATCH|DELETE)\b"
_SQL_DESTRUCTIVE = (r"\b(drop\s+(table|database|schema|index|view)|truncate|delete\s+from\s+[\w.\"]+\s*(;|$|\"|'))"
                    r"|flushall|flushdb|dropDatabase")

# Checked for every command: a server bound to all interfaces is network-facing whatever starts it.
ANY_COMMAND: tuple[CommandRule, ...] = (
    _r(NETWORK_CONFIG, args=r"(^|\s)(--host|--bind|--listen|--address|-b|-H|-S)[=\s]?(0\.0\.0\.0|::|\[::\])"),
)
COMMANDS: dict[str, tuple[CommandRule, ...]] = {
    # privilege escalation
    **{n: (_r(PRIVILEGE),) for n in "sudo sudoedit doas pkexec run0 su runuser chroot nsenter setcap capsh visudo "
                                   "passwd "
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
               _r(OPAQUE, args=r"(^|\s)-c\s.*" + RUNS_COMMANDS)),
    **{n: (_r(OPAQUE, args=r"(^|\s)(-e|-E|--eval|-p|--print)\s.*" + RUNS_COMMANDS),)
       for n in "perl ruby node deno".split()},
    "ssh": (_r(CROSS_SERVICE),), "scp": (_r(CROSS_SERVICE),), "sftp": (_r(CROSS_SERVICE),),
    # secrets
    "printenv": (_r(SECRETS),),
    "gpg": (_r(SECRETS, flags="--export-secret-keys --export-secret-subkeys -d --decrypt"),),
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
    # -X POST, -XPOST, -sX POST, --request=POST; a body (-d/-F/-T, also in a cluster or with the value attached:
    # -sd@f, -d{…}; --data*, --form*, --upload-file, --json)
    "curl": (_r(CROSS_SERVICE, args=r"(^|\s)(-(?-i:[a-zA-Z]*X)\s*|--request[\s=])" + _METHODS),
             _r(CROSS_SERVICE, args=r"(^|\s)(-(?-i:[a-zA-Z]*[dFT])|--(data|form|json|upload-file)(-[\w-]+)?(\s|=|$))")),
    "wget": (_r(CROSS_SERVICE, args=r"(^|\s)--(post|body)-(data|file)(\s|=|$)"),
             _r(CROSS_SERVICE, args=r"(^|\s)--method[\s=]" + _METHODS)),
    # HTTPie and xh: an explicit method, a form/raw body, or a data item (name=value, name:=json, name@file;
    # name==value is a query parameter, Name:value a header) which makes the request a POST
    **{n: (_r(CROSS_SERVICE, args=r"(^|\s)" + _METHODS + r"(\s|$)"),
           _r(CROSS_SERVICE, args=r"(^|\s)(-(?-i:[a-zA-Z]*f)|--form|--multipart|--raw)(\s|=|$)"),
           _r(CROSS_SERVICE, args=r"\s[^\s=:@/?-][^\s=:@/?]*(=(?!=)|:=|@)"))
       for n in "http https xh xhs".split()},
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
    "ltrace": frozenset("-e -o -p -s -u".split()),
    "parallel": frozenset("-j -S -a --jobs --sshlogin --arg-file".split()),
    "xargs": frozenset("-I -i -n -P -L -l -d -E -e -s -a "
                                                                      "--arg-file --delimiter --max-args "
                                                                      "--max-procs --replace".split()),
    "flock": frozenset("-w -E --timeout --conflict-exit-code".split()), "busybox": frozenset(),
    "caffeinate": frozenset(), "doppler": frozenset(), "chronic": frozenset(), "watch": frozenset("-n -d".split()),
    "env": frozenset("-u -C -S --unset --chdir --split-string".split()),
}
# wrappers whose first positional argument is not the command (timeout DURATION, chrt PRIO, flock FILE …)
WRAPPER_SKIP_FIRST = frozenset("timeout chrt taskset flock".split())
WRAPPERS_GATE = {"sudo": PRIVILEGE, "doas": PRIVILEGE, "pkexec": PRIVILEGE, "run0": PRIVILEGE}


# ---- git: subcommand → category, or a function of its flags and positional arguments -------------------
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
