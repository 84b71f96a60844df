# Sourced by scripts/test.sh and scripts/demo.sh: a .venv with the project and its test and
# kafka extras, created on first use. Sets VENV.
VENV="${STREAM_SVM_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -e ".[test,kafka]"
