#!/usr/bin/env bash
# Runs on a node over SSH before anything is deployed there. Checks what the runbook checked by
# hand and prints one line per failed check, naming the node and the check; exits 1 if any failed.
#
# usage: preflight.sh --node ADDR --gpus N --max-gpu-memory-used-mib MIB --rdma-devices a,b|''
#                     --compute-interface IFACE --nvidia-runtime yes|no --disk-path PATH
#                     --min-free-disk-gb GB
set -uo pipefail

node="" gpus=0 max_used=0 rdma_devices="" compute_interface="" nvidia_runtime=no
disk_path=/ min_free_gb=0
while (($# > 0)); do
  case "$1" in
    --node) node="$2" ;;
    --gpus) gpus="$2" ;;
    --max-gpu-memory-used-mib) max_used="$2" ;;
    --rdma-devices) rdma_devices="$2" ;;
    --compute-interface) compute_interface="$2" ;;
    --nvidia-runtime) nvidia_runtime="$2" ;;
    --disk-path) disk_path="$2" ;;
    --min-free-disk-gb) min_free_gb="$2" ;;
    *) echo "preflight.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift 2
done

failures=()
fail() { failures+=("preflight failed on node ${node}: $1: $2"); }
pass() { echo "preflight ${node}: $1: ok ($2)"; }

check_gpus() {
  if ((gpus == 0)); then return; fi
  if ! command -v nvidia-smi >/dev/null; then
    fail gpus "nvidia-smi not found (expected ${gpus} GPUs)"; return
  fi
  local used count busy
  if ! used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>&1); then
    fail gpus "nvidia-smi failed: ${used}"; return
  fi
  count=$(grep -c . <<<"${used}")
  if ((count != gpus)); then
    fail gpus "found ${count} GPUs, expected ${gpus}"; return
  fi
  busy=$(awk -v max="${max_used}" '$1 > max {n++} END {print n+0}' <<<"${used}")
  if ((busy > 0)); then
    fail gpus "${busy} of ${count} GPUs use more than ${max_used} MiB (not idle): $(tr '\n' ' ' <<<"${used}")"
    return
  fi
  pass gpus "${count} idle"
}

check_rdma() {
  local device missing=()
  [[ -n "${rdma_devices}" ]] || return
  IFS=, read -r -a devices <<<"${rdma_devices}"
  for device in "${devices[@]}"; do
    [[ -e "/sys/class/infiniband/${device}" ]] || missing+=("${device}")
  done
  if ((${#missing[@]} > 0)); then
    fail rdma "missing under /sys/class/infiniband: ${missing[*]}"; return
  fi
  pass rdma "${rdma_devices}"
}

check_compute_interface() {
  local link
  # `ip` asks the kernel through netlink, so it sees the node's own network namespace.
  if ! link=$(ip -o link show dev "${compute_interface}" 2>&1); then
    fail compute-interface "${compute_interface} not found"; return
  fi
  if [[ ! "${link}" =~ \<([^>]*,)?UP(,[^>]*)?\> ]]; then
    fail compute-interface "${compute_interface} is down"; return
  fi
  pass compute-interface "${compute_interface} up"
}

check_docker() {
  local runtimes
  if ! command -v docker >/dev/null; then
    fail docker "docker CLI not found"; return
  fi
  if ! runtimes=$(docker info --format '{{json .Runtimes}}' 2>&1); then
    fail docker "docker engine does not answer: ${runtimes}"; return
  fi
  if [[ "${nvidia_runtime}" == yes && "${runtimes}" != *'"nvidia"'* ]]; then
    fail docker "NVIDIA container runtime not registered with docker"; return
  fi
  pass docker "engine answers"
}

check_tools() {
  if ! command -v curl >/dev/null; then
    fail tools "curl not found (the readiness gates and the smoke test use it)"; return
  fi
  pass tools "curl"
}

check_disk() {
  local path="${disk_path}" free_gb
  while [[ ! -e "${path}" && "${path}" != / ]]; do path=$(dirname "${path}"); done
  free_gb=$(df -P -BG "${path}" | awk 'NR == 2 {sub(/G$/, "", $4); print $4}')
  if ((free_gb < min_free_gb)); then
    fail disk "${free_gb} GB free on ${path}, need ${min_free_gb} GB"; return
  fi
  pass disk "${free_gb} GB free on ${path}"
}

check_gpus
check_rdma
check_compute_interface
check_docker
check_tools
check_disk

if ((${#failures[@]} > 0)); then
  printf '%s\n' "${failures[@]}" >&2
  exit 1
fi
echo "preflight ${node}: all checks passed"
