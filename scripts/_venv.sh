# Sourced by scripts/run and scripts/test: create or reuse .venv and install the
# project into it, again only when pyproject.toml changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "Agent-Reach needs Python 3.11 (found: $("$PYTHON" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
VENV="$ROOT/.venv"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.reach-installed"
WANT="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  # Said, not silent: a first install downloads some 150 packages (Django, the sentence
  # encoder, Playwright's driver, ...): 40 s from a warm cache, about 3 minutes cold.
  started=$SECONDS
  if [ -f "$STAMP" ]; then
    echo "agent-reach: pyproject.toml changed; updating the virtualenv in .venv ..." >&2
  else
    echo "agent-reach: first run: installing Python packages into .venv" \
         "(1 to 3 minutes; later runs skip this) ..." >&2
  fi
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  # One line per package as it is collected and installed: progress, not a wall of text.
  log="$VENV/install.log"
  set +e
  "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off \
    -e ".[dev]" 2>&1 | tee "$log" \
    | grep --line-buffered -E "^(Collecting|Installing collected)" \
    | sed -u -e 's/^Collecting /  collecting /' \
             -e 's/^Installing collected packages.*/  installing .../' >&2
  status=${PIPESTATUS[0]}
  set -e
  if [ "$status" -ne 0 ]; then
    echo "agent-reach: the install failed (pip exited $status); its output: $log" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  echo "$WANT" > "$STAMP"
  echo "agent-reach: packages ready in $((SECONDS - started)) s." >&2
fi
export PATH="$VENV/bin:$PATH"
