#!/usr/bin/env bash
# Make .venv-<version> for one pin (tools/venv.sh pins/<version>): that pin's
# SGLang stack (~12 GB), kept outside the clone under ~/.cache/rlsync, keyed by
# the pin's constraints and requirements-dev.txt, so fresh clones reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
pin_dir=${1:?usage: tools/venv.sh pins/<version>}
SGLANG_VERSION=$(sed -n 's/^version *= *//p' "$pin_dir/upstream.pin")
export SGLANG_VERSION
constraints=$pin_dir/constraints.txt
key=$(cat "$constraints" requirements-dev.txt | "$PYTHON" -c \
  'import hashlib,os,platform,sys; text = os.path.expandvars(sys.stdin.read()); print(hashlib.sha256(text.encode() + platform.python_version().encode()).hexdigest()[:16])')
cache=${XDG_CACHE_HOME:-$HOME/.cache}/rlsync
venv=$cache/venv-$key
if [ ! -f "$venv/.rlsync-complete" ]; then
  echo "venv: building $venv (SGLang $SGLANG_VERSION, pinned stack, several minutes, ~12 GB)"
  rm -rf "$venv"
  mkdir -p "$cache"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade -c "$constraints" setuptools wheel
  # pip's whole log to a file; each package as it comes to the terminal, so
  # that ten quiet minutes do not look like a hang.
  log=$cache/venv-$key.log
  echo "venv: pip's log: $log"
  "$venv/bin/python" -m pip install --progress-bar off -c "$constraints" -r requirements-dev.txt 2>&1 \
    | tee "$log" | { grep --line-buffered -E '^(Collecting|Processing|Installing collected packages)' || true; } \
    | sed -u -e 's/^Installing collected packages: .*/installing them: a few quiet minutes/' \
        -e 's/^\(.\{96\}\).*/\1 .../' -e 's/^/venv:   /' \
    || { tail -n 30 "$log"; echo "venv: pip failed (log: $log)"; exit 1; }
  touch "$venv/.rlsync-complete"
fi
link=.venv-$SGLANG_VERSION
if [ "$(readlink "$link" 2>/dev/null)" != "$venv" ]; then
  rm -rf "$link"
  ln -s "$venv" "$link"
fi
echo "venv: $link -> $venv"
