#!/usr/bin/env bash
# The door's virtual IP on one door node: keepalived, and beside it the check loop that tells it
# whether this node's door answers. Both run in this one container (its PID 1 is this script),
# so that if either stops the other is stopped and the container exits: a dead loop would leave
# the track file as it was and keepalived holding the address for a door that is gone
# (docs/vrrp-trial.md, "A dead loop leaves the file as it was").
#
# The loop asks the door's /health (HAProxy's monitor-uri on the exporter's port) every
# INTERVAL seconds over bash's /dev/tcp (no process per check: 0.5 % of a core at 0.1 s in the
# trial, curl 8 %) and writes 0 (it answered 200) or 1 to the track file at every tick, not
# only on a change: a restarted keepalived overwrites the file with 1 (init_file) and would
# otherwise wait for the next change. SIGTERM (docker stop) reaches keepalived, which gives the
# address up with a priority-0 advert; SIGHUP (a new keepalived.conf) makes it reload.
#
# usage: virtual-ip.sh --config FILE --check-file FILE --state-file FILE --door HOST:PORT
#                      --interval SECONDS
#
# The same script reads keepalived's notify FIFO (keepalived.conf's `vrrp_notify_fifo_script`,
# so no other file is shipped to every node): `virtual-ip.sh --notify-fifo STATE_FILE FIFO`.
# keepalived writes each transition to the FIFO as a line `INSTANCE "door" STATE PRIORITY`, in
# the order they happen; each STATE (MASTER, BACKUP, FAULT, STOP) goes to STATE_FILE for
# `kimipd status` to read over SSH (keepalived has no query interface). Not a `notify` script:
# keepalived runs those as they come, each in its own process, so after a flap (MASTER then
# BACKUP within a few ms) the older state can be written last and stay there. Written aside and
# renamed, so a reader never sees half. A keepalived that dies leaves its last state there:
# status trusts the file only while the container runs, and the container removes it as it
# starts (--state-file), so a restarted one shows no state until keepalived's first
# transition, never the MASTER of before the restart.
set -uo pipefail

if [[ "${1:-}" == --notify-fifo ]]; then
  if (($# != 3)); then
    echo "virtual-ip.sh: --notify-fifo STATE_FILE FIFO expected, got: $*" >&2
    exit 2
  fi
  state_file=$2 fifo=$3
  # Until keepalived closes the FIFO (it holds it open read-write while it runs). Other lines
  # (GROUP, MASTER_RX_LOWER_PRI, priority changes) are not a state of the instance.
  while read -r kind _ state _; do
    if [[ "${kind}" == INSTANCE && "${state}" =~ ^(MASTER|BACKUP|FAULT|STOP)$ ]]; then
      printf '%s\n' "${state}" > "${state_file}.new" && mv -f "${state_file}.new" "${state_file}"
    fi
  done < "${fifo}"
  exit 0
fi

config="" check_file="" state_file="" door="" interval=0.1
while (($# > 0)); do
  case "$1" in
    --config) config="$2" ;;
    --check-file) check_file="$2" ;;
    --state-file) state_file="$2" ;;
    --door) door="$2" ;;
    --interval) interval="$2" ;;
    *) echo "virtual-ip.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift 2
done
if [[ -z "${config}" || -z "${check_file}" || -z "${state_file}" || "${door}" != *:* ]]; then
  echo "virtual-ip.sh: --config, --check-file, --state-file and --door HOST:PORT are required" >&2
  exit 2
fi
host=${door%:*} port=${door##*:}
# Before keepalived starts: its notify script writes the first state of this run.
rm -f "${state_file}" "${state_file}.new"

# 0 when the door answers GET /health with 200 within a second, else 1.
door_down() {
  local status=""
  # The braces keep 2>/dev/null to the connect (bash says "Connection refused" otherwise).
  if { exec 3<>"/dev/tcp/${host}/${port}"; } 2>/dev/null; then
    printf 'GET /health HTTP/1.0\r\nHost: %s\r\n\r\n' "${host}" >&3 2>/dev/null
    IFS=" " read -r -t 1 _ status _ <&3 2>/dev/null || status=""
    exec 3>&-
  fi
  [[ "${status}" == 200 ]] && echo 0 || echo 1
}

check_loop() {
  # A door that goes away between the connect and the request (stopped, replaced) resets the
  # connection: without this the write's SIGPIPE would end the loop, and keepalived with it.
  trap '' PIPE
  while true; do
    door_down > "${check_file}"
    sleep "${interval}"
  done
}

keepalived -n -l -D -f "${config}" &
keepalived_pid=$!
check_loop &
loop_pid=$!
echo "virtual-ip.sh: keepalived ${keepalived_pid}, door check ${loop_pid} on ${door} every ${interval}s"

stopping=""
stop() {
  kill -TERM "${keepalived_pid}" "${loop_pid}" 2>/dev/null
}
trap 'stopping=1; stop' TERM INT
trap 'kill -HUP "${keepalived_pid}" 2>/dev/null' HUP

# Until either ends; a trapped signal also returns from wait, so wait again unless one ended.
while kill -0 "${keepalived_pid}" 2>/dev/null && kill -0 "${loop_pid}" 2>/dev/null; do
  wait -n "${keepalived_pid}" "${loop_pid}"
done
if [[ -n "${stopping}" ]]; then
  echo "virtual-ip.sh: stopped"
elif ! kill -0 "${keepalived_pid}" 2>/dev/null; then
  echo "virtual-ip.sh: keepalived ended; stopping the door check" >&2
else
  echo "virtual-ip.sh: the door check ended; stopping keepalived (it gives the address up)" >&2
fi
stop
wait
[[ -n "${stopping}" ]]
