# Sourced by scripts/test.sh and scripts/demo.sh: a .venv with the project and its test and
# kafka extras, created on first use and re-installed only when pyproject.toml changed. Sets VENV.
VENV="${STREAM_SVM_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# The editable install follows source edits by itself; only the dependencies can go stale.
stamp="$VENV/.stream-svm-installed"
wanted="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[test,kafka]"
  echo "$wanted" > "$stamp"
fi
