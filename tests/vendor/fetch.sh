#!/usr/bin/env bash
# Re-creates the vendored test-only browser library from npm (injected into pages by the browser tests,
# never served by the ingress). Checks the file against the recorded sha256.
#   axe-core  4.14.1  accessibility rules engine (MPL-2.0)   axe.min.js
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent axe-core@4.14.1 >/dev/null)
tar xzf "$tmp/axe-core-4.14.1.tgz" -C "$tmp" package/axe.min.js package/LICENSE
mv "$tmp/package/axe.min.js" axe.min.js
mv "$tmp/package/LICENSE" axe-core.LICENSE
sha256sum -c <<'SUMS'
29348999450cdf2849a8e70b7912fc2da85a849da39c0d0d5394f51d4a9ed95c  axe.min.js
SUMS
