#!/usr/bin/env bash
# Entry point of every kimipd container (SGLang ranks and the Mooncake master).
# Installs the node files' wheels over the image's own packages (the image ships Mooncake
# 0.3.11.post1; the runbook needs >= 0.3.12.post1), applies the model team's patches, then
# execs the server so that it receives docker's signals directly.
#
# usage: launch.sh [--wheel FILE]... [--patch FILE]... -- COMMAND [ARG]...
set -euo pipefail

wheels=()
patches=()
while (($# > 0)); do
  case "$1" in
    --wheel) wheels+=("$2"); shift 2 ;;
    --patch) patches+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "launch.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
if (($# == 0)); then
  echo "launch.sh: no command after --" >&2
  exit 2
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

echo "launch.sh: exec $*"
exec "$@"
