#!/usr/bin/env bash
# Runs on a node over SSH (fed on stdin) right after the image is pulled, before any container
# starts: an image can bake settings into its own environment that break the runbook's hard rules
# in every container, whatever the stack says. Variables the program sets in every container are
# skipped: docker lets the container's value win.
#
# usage: image-env-check.sh --node ADDR --image REF --management-interface IFACE
#                           --overridden VAR,VAR,...
set -uo pipefail

node="" image="" management="" overridden=""
while (($# > 0)); do
  case "$1" in
    --node) node="$2" ;;
    --image) image="$2" ;;
    --management-interface) management="$2" ;;
    --overridden) overridden="$2" ;;
    *) echo "image-env-check.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift 2
done

if ! env_lines=$(docker image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "${image}" 2>&1); then
  echo "image check failed on node ${node}: docker image inspect ${image}: ${env_lines}" >&2
  exit 1
fi

failures=()
is_overridden() { [[ ",${overridden}," == *",$1,"* ]]; }
while IFS= read -r line; do
  [[ -n "${line}" ]] || continue
  name=${line%%=*} value=${line#*=}
  is_overridden "${name}" && continue
  case "${name}" in
    PYTORCH_CUDA_ALLOC_CONF | PYTORCH_ALLOC_CONF)
      shopt -s nocasematch
      if [[ "${value}" =~ expandable_segments[[:space:]]*:[[:space:]]*true ]]; then
        failures+=("image ${image} on node ${node}: its environment sets ${name}=${value}; expandable segments cannot be registered for RDMA by Mooncake (runbook rule 1, Mooncake #2511): set container.env.${name} to a value without expandable_segments:True (the container's value wins) or fix the image.")
      fi
      shopt -u nocasematch ;;
    NCCL_SOCKET_IFNAME | GLOO_SOCKET_IFNAME)
      if [[ "${value}" == ^* || ",${value#=}," == *",${management},"* ]]; then
        failures+=("image ${image} on node ${node}: its environment sets ${name}=${value}, which lets collective traffic onto the management interface ${management} (runbook rule 4): fix the image.")
      fi ;;
  esac
done <<<"${env_lines}"

if ((${#failures[@]} > 0)); then
  printf '%s\n' "${failures[@]}" >&2
  exit 1
fi
echo "image ${image} on node ${node}: environment ok"
