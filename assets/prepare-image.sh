#!/usr/bin/env bash
# Builds the node's prepared image: the base image with the node files installed by launch.sh
# exactly as a container start would (wheels, the Mooncake one in place of the image's, patches,
# then the Mooncake release proven), so containers start without installing anything.
# Run over SSH during node preparation; prints the image id on its last stdout line.
#
# The tag names a digest of every input (base image id, file digests, scripts), so an image with
# that tag is this build: it is reused, never rebuilt. Older prepared images of the same stack are
# removed unless a container still uses them (that one goes at the next build).
#
# usage: prepare-image.sh --node ADDRESS --base IMAGE_ID --tag REPO:TAG --stack NAME
#                         [--sha256 FILE HEX]... -- [launch.sh options]...
set -euo pipefail

node=""
base=""
tag=""
stack=""
declare -A expected_sha256=()
while (($# > 0)); do
  case "$1" in
    --sha256) expected_sha256["$2"]="$3"; shift 3 ;;
    --node) node="$2"; shift 2 ;;
    --base) base="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --stack) stack="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "prepare-image.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
assets=$(dirname "${BASH_SOURCE[0]}")
fail() {
  echo "prepared image on node ${node}: $*" >&2
  exit 1
}

if id=$(docker image inspect --format '{{.Id}}' "${tag}" 2>/dev/null); then
  echo "prepared image ${tag} already on ${node}" >&2
  echo "${id}"
  exit 0
fi

context=$(mktemp -d /var/tmp/kimipd-prepare.XXXXXX)
trap 'rm -rf "${context}"' EXIT
mkdir "${context}/files"
cp "${assets}/launch.sh" "${assets}/mooncake-check.py" "${context}/"
inside=/opt/kimipd-prepare
launch_args=()
while (($# > 0)); do
  case "$1" in
    --wheel | --mooncake-wheel | --patch)
      [[ -f "$2" ]] || fail "$1 $2: no such file on the node (node files are copied before this)"
      # A copy, checked: the image is built from exactly the bytes the stack's digest names.
      copy="${context}/files/$(basename "$2")"
      cp "$2" "${copy}"
      if [[ -n "${expected_sha256[$2]:-}" ]]; then
        actual=$(sha256sum "${copy}" | cut -d' ' -f1)
        [[ "${actual}" == "${expected_sha256[$2]}" ]] ||
          fail "$2 has sha256 ${actual}, the stack copied ${expected_sha256[$2]}: the file changed \
on the node; run \`pulumi up\` again to copy it afresh"
      fi
      launch_args+=("$1" "${inside}/files/$(basename "$2")")
      shift 2 ;;
    --require-mooncake) launch_args+=("$1" "$2"); shift 2 ;;
    --require-module) launch_args+=("$1" "$2" "$3"); shift 3 ;;
    *) fail "unknown launch.sh option '$1'" ;;
  esac
done

run_line=$(printf ' %q' bash "${inside}/launch.sh" "${launch_args[@]}" -- true)
cat >"${context}/Dockerfile" <<EOF
FROM ${base}
COPY . ${inside}/
RUN${run_line}
LABEL kimipd.prepared="1" kimipd.stack="${stack}" kimipd.base="${base}"
EOF
echo "building ${tag} on ${node} from ${base}" >&2
# No network: launch.sh installs exactly the copied files (pip --no-index), and the nodes have no
# bridge network to give a build container.
if ! docker build --network none --tag "${tag}" --file "${context}/Dockerfile" "${context}" >&2
then
  fail "building ${tag} from ${base} failed (launch.sh's output above: a wheel that does not \
install, a patch that fails, or a Mooncake release below the minimum)"
fi
id=$(docker image inspect --format '{{.Id}}' "${tag}")

# Superseded prepared images of this stack; one still used by a container stays until next time.
docker image ls --filter label=kimipd.prepared=1 --filter "label=kimipd.stack=${stack}" \
    --format '{{.Repository}}:{{.Tag}} {{.ID}}' |
  while read -r reference image; do
    if [[ "${id}" != *"${image}"* ]]; then
      docker rmi "${reference}" >/dev/null 2>&1 || true
    fi
  done
echo "${id}"
