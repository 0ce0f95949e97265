#!/usr/bin/env bash
# End-to-end check through the router: POST BODY to URL until HTTP 200 or TIMEOUT seconds.
# Health alone proves nothing here: with Mooncake #2511 every server is healthy and the first
# KV transfer fails, so only a generated answer counts. Prints the response body on success.
#
# usage: smoke-test.sh --url URL --body JSON --timeout SECONDS [--header-file FILE] [--cacert F]
# --header-file: extra request headers, one per line (the rust router's Authorization).
# --cacert: the CA the door's HTTPS certificate is verified against.
set -uo pipefail

url="" body="" timeout=300 header_file="" cacert=""
while (($# > 0)); do
  case "$1" in
    --url) url="$2" ;;
    --body) body="$2" ;;
    --timeout) timeout="$2" ;;
    --header-file) header_file="$2" ;;
    --cacert) cacert="$2" ;;
    *) echo "smoke-test.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift 2
done

headers=(--header 'Content-Type: application/json')
[[ -n "${header_file}" ]] && headers+=(--header "@${header_file}")
[[ -n "${cacert}" ]] && headers+=(--cacert "${cacert}")
response=$(mktemp)
trap 'rm -f "${response}"' EXIT
start=${SECONDS}
while true; do
  code=$(curl --silent --output "${response}" --write-out '%{http_code}' --max-time 120 \
    "${headers[@]}" --data "${body}" "${url}")
  if [[ "${code}" == 200 ]]; then
    cat "${response}"
    exit 0
  fi
  if ((SECONDS - start >= timeout)); then
    echo "smoke test failed: POST ${url} answered HTTP ${code} after $((SECONDS - start))s:" >&2
    head -c 2000 "${response}" >&2
    exit 1
  fi
  echo "smoke test: POST ${url} answered HTTP ${code}; retrying" >&2
  sleep 5
done
