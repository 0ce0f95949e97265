#!/usr/bin/env bash
# Runs on a node over SSH before anything is deployed there. Checks what the runbook checked by
# hand, and what decides whether the first attempt (12-18 minutes) can succeed at all; prints one
# line per failed check, naming the node, what was found and the fix; exits 1 if any failed.
#
# usage: preflight.sh --node ADDR --gpus N --max-gpu-memory-used-mib MIB --rdma-devices a,b|''
#                     --compute-interface IFACE --nvidia-runtime yes|no --disk-path PATH
#                     --min-free-disk-gb GB --model-host-path PATH|'' --device-paths a,b|''
#                     --ports PORT=KEY,...|'' [--sysfs-root DIR] [--needs-python yes]
#                     [--needs-nft yes]
# --node is the address the other ranks, the router and the KV handshakes dial; --ports names,
# for each port this node's containers bind, the stack key that sets it (for the fix).
# --sysfs-root (default /sys) lets a test point the RDMA checks at a fake sysfs tree.
set -uo pipefail

node="" gpus=0 max_used=0 rdma_devices="" compute_interface="" nvidia_runtime=no
disk_path=/ min_free_gb=0 model_host_path="" device_paths="" ports="" sysfs_root=/sys needs_python="" needs_nft=""
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
    --model-host-path) model_host_path="$2" ;;
    --device-paths) device_paths="$2" ;;
    --ports) ports="$2" ;;
    --sysfs-root) sysfs_root="$2" ;;
    --needs-python) needs_python="$2" ;;
    --needs-nft) needs_nft="$2" ;;
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
  if ((busy > 0)) && [[ -n "$(our_containers)" ]]; then
    # Preflight re-runs when its script or settings change; on a serving node the GPUs are busy
    # with this stack's own ranks, which is not a reason to refuse the change.
    pass gpus "${count} GPUs in use by this stack's kimipd-* containers"
    return
  fi
  if ((busy > 0)); then
    fail gpus "${busy} of ${count} GPUs use more than ${max_used} MiB (not idle): $(tr '\n' ' ' <<<"${used}")"
    return
  fi
  pass gpus "${count} idle"
}

# "4: ACTIVE" is the only state that carries traffic; a DOWN or INIT port makes Mooncake and
# NCCL fail (or fall back to TCP) only once the servers have loaded, 15 minutes in.
inactive_ports() {
  local device="$1" state_file state
  for state_file in "${sysfs_root}/class/infiniband/${device}"/ports/*/state; do
    if [[ ! -e "${state_file}" ]]; then echo "${device} has no ports"; return; fi
    state=$(<"${state_file}")
    if [[ "${state#*: }" != ACTIVE ]]; then
      echo "${device} port $(basename "$(dirname "${state_file}")") is ${state#*: }"
    fi
  done
}

check_rdma() {
  local device missing=() inactive=() line listing
  [[ -n "${rdma_devices}" ]] || return
  IFS=, read -r -a devices <<<"${rdma_devices}"
  for device in "${devices[@]}"; do
    if [[ ! -e "${sysfs_root}/class/infiniband/${device}" ]]; then
      missing+=("${device}"); continue
    fi
    while read -r line; do inactive+=("${line}"); done < <(inactive_ports "${device}")
  done
  if ((${#missing[@]} > 0)); then
    fail rdma "missing under ${sysfs_root}/class/infiniband: ${missing[*]}"; return
  fi
  if ((${#inactive[@]} > 0)); then
    listing=$(printf '%s, ' "${inactive[@]}")
    fail rdma "${listing%, } (not ACTIVE); bring the link up (ibstat, cable, switch port) or remove the device from network.rdmaDevices"
    return
  fi
  pass rdma "${rdma_devices} ACTIVE"
}

# docker refuses to create a container whose --device path is missing, after the image pull.
check_device_paths() {
  local path missing=()
  [[ -n "${device_paths}" ]] || return
  IFS=, read -r -a paths <<<"${device_paths}"
  for path in "${paths[@]}"; do
    [[ -e "${path}" ]] || missing+=("${path}")
  done
  if ((${#missing[@]} > 0)); then
    fail devices "${missing[*]} not found (container.devices; docker would refuse to start the ranks); load the RDMA drivers (mlx5_ib, rdma-core) or remove it from container.devices"
    return
  fi
  pass devices "${device_paths}"
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

# The ranks advertise --node (SGLANG_HOST_IP, dist-init) and the peers dial it, so the route to
# it decides the network: on bond0 the NCCL rendezvous and the KV handshakes run over the
# management network whatever NCCL_SOCKET_IFNAME says.
check_node_address() {
  local addresses holders on_compute
  if ! addresses=$(ip -o -4 addr show 2>&1); then
    fail address "cannot list the node's addresses: ${addresses}"; return
  fi
  # One line per address: "3: bond0    inet 174.1.60.3/24 ...".
  holders=$(awk -v address="${node}" '{split($4, a, "/"); sub(/@.*/, "", $2)}
                                      a[1] == address {printf "%s%s", sep, $2; sep = " "}' <<<"${addresses}")
  if [[ " ${holders} " == *" ${compute_interface} "* ]]; then
    pass address "${node} on ${compute_interface}"; return
  fi
  on_compute=$(awk -v iface="${compute_interface}" '{sub(/@.*/, "", $2)}
                                                   $2 == iface {printf "%s%s", sep, $4; sep = " "}' <<<"${addresses}")
  local found="${node} is on no interface of this node"
  [[ -z "${holders}" ]] || found="${node} is on ${holders}, not on ${compute_interface}"
  fail address "${found} (${compute_interface} has ${on_compute:-no IPv4 address}); the other ranks, the router and the KV handshakes dial ${node}, so they would not use ${compute_interface}: assign ${node} to ${compute_interface}, or set this node's address in \`nodes\` to its ${compute_interface} address"
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
  if [[ -n "${needs_python}" ]] && ! command -v python3 >/dev/null; then
    fail tools "python3 not found (the rust router's membership runs router-members.py on this node); install python3 (3.8 or newer)"; return
  fi
  if [[ -n "${needs_nft}" ]] && ! command -v nft >/dev/null; then
    fail tools "nft not found (the program's firewall is an nftables table on every node); install Debian's nftables package, or set kimipd:firewall.enabled false"; return
  fi
  pass tools "curl${needs_python:+, python3}${needs_nft:+, nft}"
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

# SGLang reads config.json first; without it a rank dies after the image pull and the wait for
# the other ranks, a full attempt lost.
check_model() {
  [[ -n "${model_host_path}" ]] || return
  if [[ ! -d "${model_host_path}" ]]; then
    fail model "${model_host_path} not found (the node side of model.path through container.volumes); copy the model there, or fix model.path or the volume"
    return
  fi
  if [[ ! -f "${model_host_path}/config.json" ]]; then
    fail model "no config.json in ${model_host_path} (the node side of model.path): the copy is incomplete or model.path names the wrong directory; copy the whole model, or fix model.path"
    return
  fi
  pass model "${model_host_path}/config.json"
}

# "PID_NAMESPACE NAME" for every running kimipd-* container. With host networking our own
# servers hold the very ports checked below; a process is ours when it lives in the pid
# namespace of one of them (SGLang's scheduler children included).
our_containers() {
  local ids=() pid name
  command -v docker >/dev/null || return 0
  mapfile -t ids < <(docker ps --quiet --filter name=^kimipd- 2>/dev/null)
  ((${#ids[@]} > 0)) || return 0
  docker inspect --format '{{.State.Pid}} {{.Name}}' "${ids[@]}" 2>/dev/null |
    while read -r pid name; do
      echo "$(readlink "/proc/${pid}/ns/pid") ${name#/}"
    done
}

# Who listens on PORT, from `ss -Hltnp` lines: "python3 pid 1234", "an unnamed process" (ss
# names owners only to root), or nothing when the port is free.
port_holder() {
  local listeners="$1" port="$2" process
  process=$(awk -v port="${port}" '{n = split($4, a, ":")} a[n] == port {print $6 " "; exit}' \
    <<<"${listeners}")
  [[ -n "${process}" ]] || return 0
  if [[ "${process}" =~ \(\(\"([^\"]*)\",pid=([0-9]+) ]]; then
    echo "${BASH_REMATCH[1]} pid ${BASH_REMATCH[2]}"
  else
    echo "an unnamed process"
  fi
}

# The container that owns HOLDER ("NAME pid N"), if any; with no pid to go on, any running
# kimipd-* container (then the port is most likely its).
owning_container() {
  local holder="$1" ours="$2" namespace host_namespace
  [[ -n "${ours}" ]] || return 0
  if [[ "${holder}" =~ pid\ ([0-9]+)$ ]]; then
    namespace=$(readlink "/proc/${BASH_REMATCH[1]}/ns/pid")
    host_namespace=$(readlink /proc/self/ns/pid)
    # A container sharing the node's pid namespace would make every process look like ours.
    [[ "${namespace}" != "${host_namespace}" ]] || return 0
    awk -v ns="${namespace}" '$1 == ns {print $2; exit}' <<<"${ours}"
  else
    awk 'NR == 1 {print $2}' <<<"${ours}"
  fi
}

check_ports() {
  local listeners ours entry port key holder owner free=() kept=() taken=0
  [[ -n "${ports}" ]] || return
  if ! listeners=$(ss -Hltnp 2>&1); then
    fail ports "cannot list listening ports (ss from iproute2): ${listeners}"; return
  fi
  ours=$(our_containers)
  IFS=, read -r -a entries <<<"${ports}"
  for entry in "${entries[@]}"; do
    port="${entry%%=*}" key="${entry#*=}"
    holder=$(port_holder "${listeners}" "${port}")
    if [[ -z "${holder}" ]]; then free+=("${port}"); continue; fi
    owner=$(owning_container "${holder}" "${ours}")
    if [[ -n "${owner}" ]]; then kept+=("${port}:${owner}"); continue; fi
    fail ports "port ${port} (${key}) is held by ${holder}, not by a kimipd-* container; stop that process, or set ${key%+*} to a free port"
    taken=$((taken + 1))
  done
  ((taken == 0)) || return
  pass ports "free: ${free[*]:-none}; held by this stack's containers: ${kept[*]:-none}"
}

check_gpus
check_rdma
check_device_paths
check_compute_interface
check_node_address
check_docker
check_tools
check_disk
check_model
check_ports

if ((${#failures[@]} > 0)); then
  printf '%s\n' "${failures[@]}" >&2
  exit 1
fi
echo "preflight ${node}: all checks passed"
