#!/bin/sh
# Install `hllm serve` with only the `runtime` and `serve` extras (tokenizers, onnxruntime, lap, fastapi, uvicorn,
# httpx, prometheus_client, typer, rich): no torch, no transformers. The one install step of the Dockerfile, and
# what tests/serve/test_deploy.py runs in a fresh virtual environment.
#
#   deploy/install-serve.sh [SOURCE_DIR]        # default: the checkout this script is in
#   PYTHON=/opt/venv/bin/python deploy/install-serve.sh /src
#
# Versions are pinned by SOURCE_DIR/constraints.txt (the set the test suite ran with). Add `otel` to EXTRAS for
# --otlp-endpoint: EXTRAS=runtime,serve,otel deploy/install-serve.sh
set -eu
SRC=${1:-$(dirname "$0")/..}
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-runtime,serve}
"$PYTHON" -m pip install --no-cache-dir --disable-pip-version-check -c "$SRC/constraints.txt" "$SRC[$EXTRAS]"
# the server imports, and without PyTorch
"$PYTHON" -c "import sys, hllm.serve.app, hllm.serve.server; bad = [m for m in ('torch', 'transformers') if m in sys.modules]; sys.exit(f'imports {bad}' if bad else 0)"
"$PYTHON" -m hllm serve --help > /dev/null
