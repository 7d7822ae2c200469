#!/usr/bin/env bash
# Re-creates the vendored browser libraries from npm, byte for byte (the served files are committed;
# nothing is built at run time). Checks each file against the recorded sha256.
#   marked     18.2.1  markdown → HTML           lib/marked.esm.js
#   dompurify  3.5.0   HTML sanitizer             dist/purify.es.mjs
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent marked@18.2.1 dompurify@3.5.0 >/dev/null)
tar xzf "$tmp/marked-18.2.1.tgz" -C "$tmp" package/lib/marked.esm.js && mv "$tmp/package/lib/marked.esm.js" marked.esm.js
tar xzf "$tmp/dompurify-3.5.0.tgz" -C "$tmp" package/dist/purify.es.mjs && mv "$tmp/package/dist/purify.es.mjs" purify.es.mjs
sed -i '/sourceMappingURL/d' marked.esm.js purify.es.mjs  # the maps are not served
sha256sum -c <<'SUMS'
c622dc6824a1c92c2d10ea9ede2fc872e46128afcc34b298e6ddee6f387ace8e  marked.esm.js
7d86ceda137fff72b0726a35241e92b6edb5610349d04992b625e48ee9871244  purify.es.mjs
SUMS
