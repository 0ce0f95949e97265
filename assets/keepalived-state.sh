#!/usr/bin/env bash
# keepalived's notify script on a door node: writes the VRRP instance's new state (MASTER,
# BACKUP, FAULT, STOP) to STATE_FILE, so that `kimipd status` reads it over SSH with a `cat`
# (keepalived has no query interface; its SIGUSR1 dump goes to the container's own /tmp).
# The file is written whole and renamed, so a reader never sees half of it. A keepalived that
# dies leaves the last state behind: status trusts the file only while the container runs.
#
# usage (keepalived appends the last four): keepalived-state.sh STATE_FILE TYPE NAME STATE PRIORITY
set -euo pipefail

if (($# < 4)); then
  echo "keepalived-state.sh: STATE_FILE TYPE NAME STATE [PRIORITY] expected, got: $*" >&2
  exit 2
fi
state_file=$1 state=$4
printf '%s\n' "${state}" > "${state_file}.new"
mv -f "${state_file}.new" "${state_file}"
