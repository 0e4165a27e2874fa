#!/usr/bin/env bash
# Alias kept for the commands in use: the one device script, job fp8-decode (bench/README.md).
exec bash "$(dirname "$0")/device_run.sh" fp8-decode "$@"
