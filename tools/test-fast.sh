#!/usr/bin/env bash
# `make test-fast`: the tests that start no server and build nothing, in two
# pytest processes side by side (one per core): the git-heavy series and
# checkout tests in one, everything else in the other.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${VENV_PY:-.venv-$(ls -v pins | head -1)/bin/python}
marks="not server and not build"
git_heavy=(tests/test_checkout.py tests/test_series.py tests/test_style.py)
log=$(mktemp)
"$py" -m pytest -q -p no:cacheprovider -m "$marks" "${git_heavy[@]}" >"$log" 2>&1 &
pid=$!
"$py" -m pytest -q -m "$marks" "${git_heavy[@]/#/--ignore=}" "$@"
rest=$?
wait "$pid"
first=$?
echo "--- ${git_heavy[*]}"
tail -n 25 "$log"
rm -f "$log"
exit $((first || rest))
