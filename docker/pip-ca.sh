#!/bin/sh
# Run pip, trusting extra CA certificates given at build time (for TLS-intercepting proxies).
#
# The Dockerfile copies docker/build-ca/ plus the git-ignored .ca/ folder of the build context to
# /tmp/build-ca/. Any *.crt or *.pem found there is appended to pip's own CA bundle, so public
# PyPI stays trusted and the proxy's CA is trusted too. Nothing is written outside /tmp, and
# only build stages that are never shipped call this script, so no CA reaches a final image.
# Usage: pip-ca.sh PYTHON [pip arguments...]
set -eu
python="$1"
shift
extra=$(find /tmp/build-ca -maxdepth 1 -type f \( -name '*.crt' -o -name '*.pem' \) 2>/dev/null | sort)
if [ -n "$extra" ]; then
    bundle=/tmp/build-ca-bundle.pem
    base=$("$python" -c 'import pip._vendor.certifi as c; print(c.where())' 2>/dev/null || true)
    : >"$bundle"
    if [ -n "$base" ] && [ -f "$base" ]; then cat "$base" >>"$bundle"; fi
    # shellcheck disable=SC2086  # one path per line, none with spaces (we chose the names)
    cat $extra >>"$bundle"
    export PIP_CERT="$bundle"
    echo "pip-ca.sh: trusting $(echo "$extra" | wc -l) extra CA file(s) from the build context" >&2
fi
exec "$python" -m pip "$@"
