# Sourced by scripts/test.sh and scripts/demo.sh: a .venv with the project and its test and
# kafka extras, created on first use and re-installed only when the build files changed. Sets VENV.
VENV="${STREAM_SVM_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# The editable install follows Python source edits by itself; the dependencies and the compiled
# engine (built from the .pyx files) are re-installed when they change.
stamp="$VENV/.stream-svm-installed"
wanted="$(cat pyproject.toml setup.py stream_svm/*.pyx | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  # (setuptools warns on every editable build of an extension that a folder named like the
  # package may shadow it: the folder is the package itself.)
  PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    -e ".[test,kafka]"
  echo "$wanted" > "$stamp"
fi
