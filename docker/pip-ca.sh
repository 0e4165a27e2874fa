#!/bin/sh
# Run pip, trusting extra CA certificates given at build time (for TLS-intercepting proxies).
#
# The Dockerfile copies docker/build-ca/ plus the git-ignored .ca/ folder of the build context to
# /tmp/build-ca/. Any *.crt or *.pem found there is appended to pip's own CA bundle, so public
# PyPI stays trusted and the proxy's CA is trusted too. Nothing is written outside /tmp, and
# only build stages that are never shipped call this script, so no CA reaches a final image.
# When pip fails on a certificate anyway, the last line says what to do about it (pip's own
# error names neither the proxy nor the fix).
# Usage: pip-ca.sh PYTHON [pip arguments...]
set -eu
python="$1"
shift
ca_dir=${PIP_CA_DIR:-/tmp/build-ca}  # overridable for the tests only
extra=$(find "$ca_dir" -maxdepth 1 -type f \( -name '*.crt' -o -name '*.pem' \) 2>/dev/null | sort)
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
# pip's output goes to the build log as it comes, and into a file to look for a TLS failure.
out=$(mktemp /tmp/pip-ca-out.XXXXXX)
status=0
{ "$python" -m pip "$@" 2>&1 || echo "$?" >"$out.status"; } | tee "$out"
if [ -f "$out.status" ]; then
    status=$(cat "$out.status")
    if grep -q -e CERTIFICATE_VERIFY_FAILED -e 'SSLError' -e 'SSL: ' "$out"; then
        if [ -n "$extra" ]; then
            hint="the CA file(s) in .ca/ did not make PyPI's certificate verify: is it the proxy's root CA, in PEM?"
        else
            hint="behind a TLS-intercepting proxy? put its CA certificate (PEM, *.crt or *.pem) into .ca/ in the repository and build again"
        fi
        echo "pip-ca.sh: error: pip could not verify a TLS certificate (CERTIFICATE_VERIFY_FAILED); $hint (docs/deploy.md, 'Trusting a TLS-intercepting proxy')" >&2
    fi
fi
rm -f "$out" "$out.status"
exit "$status"
