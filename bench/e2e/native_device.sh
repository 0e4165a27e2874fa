#!/usr/bin/env bash
# Alias kept for the commands in use: the one device script, job native (bench/README.md).
exec bash "$(dirname "$0")/../device_run.sh" native "$@"
