#!/usr/bin/env bash
# The virtualenv behind `make setup` and `make lock`.
#
#   scripts/venv.sh install   create $VENV if needed and install requirements.lock into it (+ the project)
#   scripts/venv.sh lock      regenerate requirements.lock from pyproject.toml (keeps existing pins)
#
# uv (pinned: UV_VERSION) does the work. pip installs it once per machine, into
# ~/.cache/serving-school/uv-<version> (so a second clone starts without pip), or into $VENV when the
# system Python has no pip. If uv cannot be had (INSTALLER=pip forces this), pip installs the same
# lock file, only slower.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
LOCK=${LOCK:-requirements.lock}
UV_VERSION=${UV_VERSION:-0.13.8}
INSTALLER=${INSTALLER:-uv}
UV_DIR=${UV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/serving-school/uv-$UV_VERSION}
UV="$UV_DIR/bin/uv"
# One command makes the lock, so the file's header names it and every machine runs the same one.
LOCK_ARGS=(pip compile pyproject.toml --extra dev --universal --python-version 3.11
  --custom-compile-command "make lock" --quiet)

say() { printf '==> %s\n' "$*"; }

# Tools' chatter goes to a log that is shown only when they fail.
LOG=$(mktemp)
trap 'rm -f "$LOG" "$LOCK.new"' EXIT
silently() { "$@" >>"$LOG" 2>&1; }
quietly() {
  if ! silently "$@"; then
    grep -v "is ignored: it is neither a file nor a directory" "$LOG" >&2 || true
    return 1
  fi
}

make_venv() {
  [[ -x $VENV/bin/python ]] && return 0
  if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "error: Python 3.11+ not found (PYTHON=$PYTHON); install it or run make PYTHON=/path/to/python3.11" >&2
    exit 1
  fi
  say "Creating $VENV with $("$PYTHON" --version 2>&1)"
  # Without pip: uv installs the packages, so the ~3 s of seeding pip are saved.
  "$PYTHON" -m venv --without-pip "$VENV"
}

ensure_pip() {
  "$VENV/bin/python" -m pip --version >/dev/null 2>&1 || quietly "$VENV/bin/python" -m ensurepip --upgrade
}

uv_ok() { [[ -x $1 && "$("$1" --version 2>/dev/null)" == "uv $UV_VERSION"* ]]; }

# Succeeds with $UV at UV_VERSION, installing it when missing.
ensure_uv() {
  uv_ok "$UV" && return 0
  uv_ok "$VENV/bin/uv" && UV="$VENV/bin/uv" && return 0
  say "Installing uv $UV_VERSION for this machine into $UV_DIR (once, a few seconds)"
  # Into a fresh folder, moved into place whole: two clones setting up at once do not clash.
  local staging="$UV_DIR.tmp.$$"
  if silently "$PYTHON" -m pip install --quiet --target "$staging" "uv==$UV_VERSION" &&
    mkdir -p "$(dirname "$UV_DIR")" && { [[ -e $UV_DIR ]] || mv "$staging" "$UV_DIR"; } &&
    uv_ok "$UV"; then
    rm -rf "$staging"
    return 0
  fi
  rm -rf "$staging"
  # No pip beside this Python (or no writable cache): the venv's own pip installs uv into the venv.
  : >"$LOG"
  [[ -x $VENV/bin/python ]] || return 1
  UV="$VENV/bin/uv"
  ensure_pip && silently "$VENV/bin/python" -m pip install --quiet "uv==$UV_VERSION"
}

direct_deps() {
  # Names of the packages pyproject.toml asks for (the lock marks them "via serving-school").
  awk '/^[A-Za-z0-9]/ {name=$1; sub(/==.*/, "", name)} /serving-school \(pyproject/ {print name}' "$LOCK" |
    head -n 5 | paste -sd, - | sed 's/,/, /g'
}

# Regenerates the lock when pyproject.toml asks for something it lacks; says so loudly.
refresh_lock() {
  [[ -f $LOCK ]] && cp "$LOCK" "$LOCK.new" || : >"$LOCK.new"
  if ! quietly "$UV" "${LOCK_ARGS[@]}" --output-file "$LOCK.new"; then
    echo "warning: could not check $LOCK against pyproject.toml (offline?); installing it as it is" >&2
    rm -f "$LOCK.new"
    return 0
  fi
  if cmp -s "$LOCK" "$LOCK.new"; then
    rm -f "$LOCK.new"
  else
    mv "$LOCK.new" "$LOCK"
    say "$LOCK did not match pyproject.toml: regenerated it (what \`make lock\` does); commit it"
  fi
}

# What will be installed, as many as the installer reports: the lock's pins whose markers apply to
# this Python (a universal lock also pins other platforms' packages), and the project itself.
packages() {
  local pins
  pins=$("$VENV/bin/python" scripts/lock_count.py "$LOCK" 2>/dev/null) ||
    pins=$(grep -c '^[A-Za-z0-9]' "$LOCK" 2>/dev/null || true)
  echo "$((pins + 1)) packages ($pins pinned in $LOCK, and the project)"
}

install() {
  local started=$SECONDS first=0
  [[ -x $VENV/bin/python ]] || first=1
  make_venv
  local count
  if [[ $INSTALLER != pip ]] && ensure_uv; then
    refresh_lock
    count=$(packages)
    if ((first)); then
      say "Installing $count with uv ($(direct_deps), ...)"
      say "This usually takes 5-15 s with uv's cache warm, up to a minute when it downloads all"
    else
      say "Updating $VENV from $LOCK with uv"
    fi
    # uv lists every package it adds; its summary lines are enough.
    if ! "$UV" pip install --python "$VENV/bin/python" -r "$LOCK" -e . 2>&1 |
      { grep -Ev '^ [-+~] |^Using Python' || true; }; then
      exit 1
    fi
  else
    if [[ $INSTALLER != pip ]]; then
      # pip's last error line says why (its full output lists every uv version ever released).
      local why
      why=$(grep -E '^ERROR' "$LOG" | tail -n 1 | cut -c 1-160 || true)
      echo "warning: uv $UV_VERSION could not be installed${why:+ ($why)}; installing with pip" \
        "instead (slower, same pinned versions from $LOCK)" >&2
    fi
    ensure_pip
    count=$(packages)
    say "Installing $count with pip; usually 45 s with pip's cache warm," \
      "about 3 minutes without"
    # pip's own notices and the setuptools editable-install banner stay in the log unless it fails.
    quietly "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$LOCK" -e .
  fi
  say "$VENV ready in $((SECONDS - started)) s"
}

lock() {
  ensure_uv || {
    echo "error: uv $UV_VERSION could not be installed; \`make lock\` needs it" >&2
    exit 1
  }
  # Into a copy (uv keeps the pins it finds there), replacing the lock only when it changed, so
  # an unchanged lock does not make the next `make setup` reinstall.
  [[ -f $LOCK ]] && cp "$LOCK" "$LOCK.new" || : >"$LOCK.new"
  "$UV" "${LOCK_ARGS[@]}" --output-file "$LOCK.new"
  if cmp -s "$LOCK" "$LOCK.new"; then
    rm -f "$LOCK.new"
    say "$LOCK already matches pyproject.toml"
  else
    mv "$LOCK.new" "$LOCK"
    say "$LOCK regenerated from pyproject.toml ($(grep -c '^[A-Za-z0-9]' "$LOCK") packages); commit it"
  fi
}

case "${1:-}" in
  install) install ;;
  lock) lock ;;
  *)
    echo "usage: $0 install|lock" >&2
    exit 2
    ;;
esac
