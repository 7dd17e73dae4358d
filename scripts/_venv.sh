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
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[dev]"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
