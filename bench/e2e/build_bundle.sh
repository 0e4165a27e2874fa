#!/usr/bin/env bash
# Alias kept for the command in use: the one bundle script (bench/README.md). Its argument, if
# any, is where to write the bundle.
exec bash "$(dirname "$0")/../bundle.sh" "$@"
