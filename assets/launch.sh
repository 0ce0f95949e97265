#!/usr/bin/env bash
# Entry point of every kimipd container (SGLang ranks and the Mooncake master).
# Installs the node files' wheels over the image's own packages, applies the model team's
# patches, proves which Mooncake Python will import (runbook rule 3: the image ships 0.3.11.post1,
# the runbook needs >= 0.3.12.post1), then execs the server so that it receives docker's signals
# directly.
#
# usage: launch.sh [--wheel FILE]... [--mooncake-wheel FILE] [--patch FILE]...
#                  [--require-mooncake MIN_VERSION] [--require-module MODULE "WHY"]...
#                  -- COMMAND [ARG]...
set -euo pipefail

here=$(dirname "${BASH_SOURCE[0]}")
wheels=()
patches=()
mooncake_wheel=""
require_mooncake=""
required_modules=()
while (($# > 0)); do
  case "$1" in
    --wheel) wheels+=("$2"); shift 2 ;;
    --mooncake-wheel) mooncake_wheel="$2"; wheels+=("$2"); shift 2 ;;
    --patch) patches+=("$2"); shift 2 ;;
    --require-mooncake) require_mooncake="$2"; shift 2 ;;
    --require-module) required_modules+=("$2" "$3"); shift 3 ;;
    --) shift; break ;;
    *) echo "launch.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
if (($# == 0)); then
  echo "launch.sh: no command after --" >&2
  exit 2
fi

if [[ -n "${mooncake_wheel}" ]]; then
  # A different distribution name leaves the image's Mooncake installed beside the new one.
  python3 "${here}/mooncake-check.py" remove-others "${mooncake_wheel}"
fi
if ((${#wheels[@]} > 0)); then
  echo "launch.sh: installing ${wheels[*]}"
  # Nodes need not reach a package index: install exactly these files, nothing else.
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --no-index --no-deps \
    --force-reinstall "${wheels[@]}"
fi
for patch in "${patches[@]}"; do
  echo "launch.sh: applying ${patch}"
  python3 "${patch}"
done
if [[ -n "${require_mooncake}" ]]; then
  python3 "${here}/mooncake-check.py" verify "${require_mooncake}"
fi
for ((i = 0; i < ${#required_modules[@]}; i += 2)); do
  module=${required_modules[i]}
  if ! python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)' \
      "${module}" 2>/dev/null; then
    echo "launch.sh: Python cannot import ${module}, which ${required_modules[i + 1]}" >&2
    exit 1
  fi
done

if [[ "$1" == mooncake_master ]]; then
  # The wheel's `mooncake_master` console script runs the binary as a child
  # (subprocess.call in 0.3.12.post1), so docker's SIGTERM would stop the wrapper, not the master.
  binary=$(python3 "${here}/mooncake-check.py" binary mooncake_master)
  set -- "${binary}" "${@:2}"
fi
echo "launch.sh: exec $*"
exec "$@"
