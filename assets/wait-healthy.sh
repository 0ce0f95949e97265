#!/usr/bin/env bash
# A readiness gate: runs on the node of the container it waits for, polls URL until HTTP 200.
# Fails at once if the container stops running, or after TIMEOUT seconds; on failure names the
# node and the container and prints the last 100 lines of its log, so `pulumi up` shows which
# rank died and why.
# --any-status: any HTTP answer passes (the port accepts connections and speaks HTTP); used for
# prefill rank 0's KV bootstrap server, which opens before the model has loaded.
# --fingerprint DIR: once healthy, prints `model fingerprint: HEX` of the checkpoint the group
# just loaded from DIR on this node (its config and index files' contents, every file's name and
# size): part of the contract its admission declares, so a checkpoint rewritten in place is
# another contract for the groups that loaded it (components/render/contract.py).
#
# usage: wait-healthy.sh --url URL --container NAME --node ADDRESS --timeout SECONDS
#                        --interval SECONDS [--any-status] [--fingerprint DIR]
set -uo pipefail

url="" container="" node="this node" timeout=1800 interval=10 any_status="" model_dir=""
while (($# > 0)); do
  case "$1" in
    --any-status) any_status=1; shift; continue ;;
    --url) url="$2" ;;
    --container) container="$2" ;;
    --node) node="$2" ;;
    --timeout) timeout="$2" ;;
    --interval) interval="$2" ;;
    --fingerprint) model_dir="$2" ;;
    *) echo "wait-healthy.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift 2
done

fingerprint() {
  [[ -d "${model_dir}" ]] || { echo "unreadable"; return; }
  { find "${model_dir}" -maxdepth 1 -type f -printf '%f %s\n' | LC_ALL=C sort
    find "${model_dir}" -maxdepth 1 -type f \( -name config.json -o -name '*.index.json' \) \
      -print0 | LC_ALL=C sort -z | xargs -0 -r cat
  } | sha256sum | cut -c1-12
}

log_tail() {
  echo "last 100 lines of ${container} on ${node}:" >&2
  docker logs --tail 100 "${container}" 2>&1 | sed 's/^/  | /' >&2
}

start=${SECONDS} reported_code="" reported_at=0
while true; do
  code=$(curl --silent --output /dev/null --write-out '%{http_code}' --max-time 10 "${url}")
  elapsed=$((SECONDS - start))
  if [[ "${code}" == 200 ]]; then
    echo "${container}: healthy after ${elapsed}s (${url})"
    [[ -z "${model_dir}" ]] || echo "model fingerprint: $(fingerprint)"
    exit 0
  fi
  # curl writes 000 when nothing answered (refused, reset, timed out).
  if [[ -n "${any_status}" && "${code}" != 000 ]]; then
    echo "${container}: answering after ${elapsed}s (${url}: HTTP ${code})"
    exit 0
  fi
  state=$(docker inspect --format '{{.State.Status}} (exit code {{.State.ExitCode}})' \
    "${container}" 2>/dev/null || echo "missing")
  if [[ "${state}" != running* ]]; then
    echo "${container} on ${node}: not running: ${state}; ${url} answered ${code}" >&2
    log_tail
    exit 1
  fi
  if ((elapsed >= timeout)); then
    verdict="not healthy"
    [[ -n "${any_status}" ]] && verdict="not answering"
    echo "${container} on ${node}: ${verdict} after ${elapsed}s (${url} answered ${code})" >&2
    log_tail
    exit 1
  fi
  # One line when the answer changes and every 30 s: polls come every second or faster, and the
  # command's output is kept in the stack's state.
  if [[ "${code}" != "${reported_code}" ]] || ((elapsed - reported_at >= 30)); then
    echo "${container}: waiting for ${url}: HTTP ${code}, ${elapsed}s of ${timeout}s"
    reported_code=${code} reported_at=${elapsed}
  fi
  sleep "${interval}"
done
