#!/usr/bin/env bash
# Run pytest; "no tests ran" (exit 5) is a failure, never a pass.
set -uo pipefail
py="$1"; shift
"$py" -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
