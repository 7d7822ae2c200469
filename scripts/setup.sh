#!/usr/bin/env bash
# From a fresh clone on Debian or Ubuntu to a working install in one command:
#
#     bash scripts/setup.sh            # set up, then print how to start for real
#     bash scripts/setup.sh --demo     # set up, then `petal-dispatch up --demo` (further arguments go to `up`)
#
# It installs only what is missing, so a second run installs nothing: the system packages (bubblewrap and socat
# for the worker sandbox, Node.js/npm while the pinned Claude Code CLI is not installed yet, python3.X-venv when
# `venv` lacks ensurepip) in one apt-get line — as root, through sudo, or it stops with the line to run;
# .venv in this checkout with the package installed editable; the pinned CLI (`petal-dispatch install-claude`,
# into ~/.cache/petal-dispatch). Then it checks that bubblewrap can make a user namespace.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VENV=$ROOT/.venv
STAMP=$VENV/.petal-setup  # what the package was last installed from: the checkout's path and pyproject.toml

demo=0
if [ "${1:-}" = "--demo" ]; then
    demo=1
    shift
elif [ $# -gt 0 ]; then
    echo "usage: bash scripts/setup.sh [--demo [arguments for petal-dispatch up]]" >&2
    exit 2
fi

ok() { printf '  ✓ %s\n' "$*"; }
doing() { printf '  → %s\n' "$*"; }
die() { printf 'setup: %s\n' "$*" >&2; exit 1; }

# ---- Python 3.11+ ---------------------------------------------------------------------------------------
py=""
for candidate in "${PYTHON:-}" python3 python3.13 python3.12 python3.11; do
    if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 \
            && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        py=$(command -v "$candidate")
        break
    fi
done
if [ -z "$py" ]; then
    found=$(python3 --version 2>&1 || echo "no python3")
    die "needs Python 3.11 or newer (found: $found). On Ubuntu 22.04: apt-get install python3.11 python3.11-venv;
then run this again (or PYTHON=/path/to/python3.11 bash scripts/setup.sh)."
fi
pyver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
ok "Python $pyver ($py)"

# ---- the system packages: what is missing, then one apt-get line ---------------------------------------
packages=()
if [ ! -x "$VENV/bin/python" ] && ! "$py" -c 'import ensurepip' 2>/dev/null; then
    packages+=("python$pyver-venv")  # Debian's python3 makes no venv without it
fi
command -v bwrap >/dev/null 2>&1 || packages+=(bubblewrap)
command -v socat >/dev/null 2>&1 || packages+=(socat)

# the pinned CLI already in the cache (the same lookup as install-claude's; the checkout's module, stdlib only)
cli_cached() {
    "$py" -I -c 'import sys; sys.path.insert(0, sys.argv[1])
from petal_dispatch.cli_install import installed_bin
sys.exit(installed_bin() is None)' "$ROOT" 2>/dev/null
}
# NodeSource's nodejs package (its version says "nodesource") ships npm itself; Debian's npm package conflicts
# with it, so apt must never be asked for npm beside it. $1: the Installed or the Candidate version.
nodesource() {
    apt-cache policy nodejs 2>/dev/null | awk -v which="$1:" '$1 == which { print $2 }' | grep -q nodesource
}
need_node=0
if ! cli_cached; then
    need_node=1
    if command -v npm >/dev/null 2>&1; then
        :
    elif command -v node >/dev/null 2>&1; then
        if nodesource Installed; then
            die "Node.js here is NodeSource's ($(node --version)), whose nodejs package ships npm, yet npm is
not on the PATH. Do not install Debian's npm package beside it (the two conflict): reinstall NodeSource's with
  apt-get install --reinstall nodejs
then run this again."
        elif dpkg -s nodejs >/dev/null 2>&1 && ! dpkg -s npm >/dev/null 2>&1; then
            packages+=(npm)  # Debian's or Ubuntu's nodejs, whose npm is a package of its own
        else
            die "node is $(command -v node) ($(node --version)) but npm is not on the PATH: install npm with that
Node.js (its distribution ships it), then run this again."
        fi
    elif nodesource Candidate; then
        packages+=(nodejs)  # NodeSource's repository is configured: its nodejs brings npm
    else
        packages+=(nodejs npm)
    fi
fi

if [ ${#packages[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || die "needs ${packages[*]} and there is no apt-get here: install them with
this system's package manager, then run this again."
    # root runs apt-get itself; a user through sudo, when sudo works without a password or can ask for one
    prefix="" how="as root" reason=""
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null 2>&1; then
            reason="not root, and there is no sudo"
        elif sudo -n true 2>/dev/null; then
            prefix="sudo -n " how="through sudo"
        elif [ -t 0 ]; then
            prefix="sudo " how="through sudo (it asks for your password)"
        else
            reason="not root, and sudo needs a password with no terminal to ask on"
        fi
    fi
    if [ -z "$reason" ]; then
        doing "installing ${packages[*]} ($how)"
        # shellcheck disable=SC2086  # $prefix is empty or "sudo [-n]": words on purpose
        if ! { $prefix apt-get update -qq \
                && $prefix env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}"; }; then
            reason="apt-get failed (above)"
        fi
    fi
    if [ -n "$reason" ]; then
        sudo=""
        if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo "; fi
        who=""
        if [ "$(id -u)" -ne 0 ] && [ -z "$sudo" ]; then who=" as root"; fi
        printf 'setup: needs %s from apt and could not install them (%s). Run this%s, then this script again:\n' \
            "${packages[*]}" "$reason" "$who" >&2
        printf '%sapt-get update && %sapt-get install -y %s\n' "$sudo" "$sudo" "${packages[*]}" >&2
        exit 1
    fi
fi
ok "bubblewrap $(bwrap --version | awk '{print $2}'), socat"
if [ "$need_node" -eq 1 ]; then
    command -v npm >/dev/null 2>&1 || die "npm is still not on the PATH after installing ${packages[*]}"
    # the CLI runs on Node.js 18 or newer; an older release's apt has an older one
    major=$(node --version | sed 's/^v\([0-9]*\).*/\1/')
    if [ "$major" -lt 18 ]; then
        die "the Claude Code CLI needs Node.js 18 or newer, and this one is $(node --version). Install a newer one
(NodeSource's packages: https://github.com/nodesource/distributions), then run this again."
    fi
fi

# ---- .venv with this checkout installed ------------------------------------------------------------------
if [ ! -e "$VENV" ]; then
    doing "making .venv ($py -m venv)"
    "$py" -m venv "$VENV"
fi
"$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
    || die "$VENV is not a working Python 3.11+ venv: remove it (rm -rf .venv) and run this again"
want="$ROOT $(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ -x "$VENV/bin/petal-dispatch" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
    ok "petal-dispatch installed in .venv"
else
    doing "installing petal-dispatch into .venv (pip install -e .)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e .
    printf '%s\n' "$want" >"$STAMP"
fi

# ---- the pinned Claude Code CLI --------------------------------------------------------------------------
cli_cached || doing "installing the pinned Claude Code CLI (npm, into ~/.cache/petal-dispatch)"
claude=$("$VENV/bin/petal-dispatch" install-claude | tail -n 1)
ok "Claude Code CLI $("$claude" --version 2>/dev/null | awk 'NR == 1 { print $1 }') ($claude)"
# the README's `claude auth login` after `. .venv/bin/activate`: with no claude of one's own on the PATH, the pinned
# CLI is linked into the venv's bin (a claude elsewhere on the PATH is left to win)
on_path=$(command -v claude 2>/dev/null || true)
if [ -z "$on_path" ] || [ "$on_path" = "$VENV/bin/claude" ]; then
    if [ "$(readlink "$VENV/bin/claude" 2>/dev/null)" != "$claude" ]; then
        doing "linking the pinned CLI as .venv/bin/claude"
        ln -sfn "$claude" "$VENV/bin/claude"
    fi
    ok "claude in .venv/bin (the pinned CLI)"
fi

# ---- user namespaces: every worker runs in a bubblewrap sandbox of its own ------------------------------
if ! err=$(bwrap --unshare-user --ro-bind / / true 2>&1); then
    fix="sysctl -w user.max_user_namespaces=15000"
    if [ "$(cat /proc/sys/kernel/apparmor_restrict_unprivileged_userns 2>/dev/null)" = 1 ]; then
        fix="sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"  # Ubuntu 23.10 and later
    elif [ "$(cat /proc/sys/kernel/unprivileged_userns_clone 2>/dev/null)" = 0 ]; then
        fix="sysctl -w kernel.unprivileged_userns_clone=1"  # Debian's own switch
    fi
    printf 'setup: bubblewrap cannot make a user namespace here (%s), and every worker runs in one.\n' "$err" >&2
    printf 'As root, allow them (and to keep it across reboots, put the setting in /etc/sysctl.d/60-userns.conf):\n' >&2
    printf '%s\n' "$fix" >&2
    printf 'In a container, the container must allow them instead (e.g. docker run --security-opt seccomp=unconfined).\n' >&2
    exit 1
fi
ok "user namespaces for the worker sandbox"

if [ "$demo" -eq 1 ]; then
    exec "$VENV/bin/petal-dispatch" up --demo "$@"
fi
printf '\nSet up. The demo: bash scripts/setup.sh --demo\n'
printf 'For real, log in to Claude once (%s auth login; the README says more), then:\n' "$claude"
printf '  . .venv/bin/activate\n  OPEN_MODE=1 petal-dispatch up\n'
