#!/usr/bin/env bash
# Alias kept for the commands in use: the one device script, job e2e (bench/README.md).
exec bash "$(dirname "$0")/../device_run.sh" e2e "$@"
