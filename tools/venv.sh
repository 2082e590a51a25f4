#!/usr/bin/env bash
# Make .venv: the pinned SGLang stack (~12 GB), kept outside the clone under
# ~/.cache/rlsync, keyed by the constraints, so fresh clones reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
key=$(cat constraints.txt requirements-dev.txt | "$PYTHON" -c \
  'import hashlib,platform,sys; print(hashlib.sha256(sys.stdin.buffer.read() + platform.python_version().encode()).hexdigest()[:16])')
cache=${XDG_CACHE_HOME:-$HOME/.cache}/rlsync
venv=$cache/venv-$key
if [ ! -f "$venv/.rlsync-complete" ]; then
  echo "venv: building $venv (pinned stack, several minutes, ~12 GB)"
  rm -rf "$venv"
  mkdir -p "$cache"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade -c constraints.txt setuptools wheel
  "$venv/bin/python" -m pip install --quiet -c constraints.txt -r requirements-dev.txt
  touch "$venv/.rlsync-complete"
fi
if [ "$(readlink .venv 2>/dev/null)" != "$venv" ]; then
  rm -rf .venv
  ln -s "$venv" .venv
fi
echo "venv: .venv -> $venv"
