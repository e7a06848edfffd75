#!/usr/bin/env bash
# Install p2p and its dependencies into the current Python environment.
# torch goes in first, pinned to the CPU build 2.13.0 when no torch is present: an unpinned
# requirement would pull several GB of CUDA packages. An existing torch is kept as it is.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
  "$PYTHON" -m pip install --quiet --root-user-action=ignore "torch==2.13.0"
fi
"$PYTHON" -m pip install --quiet --root-user-action=ignore -e ".[test]"
# Byte-compile the package now: an editable install leaves that to the first import, and where
# PYTHONDONTWRITEBYTECODE is set (this project's CI machines) it never happens, so every node,
# worker and `p2p status` compiled p2p's ~110 modules again (~0.2 s of CPU each; four nodes on two
# cores began training ~0.1-0.2 s later for it, bench/startup.py). A source edited later is
# compiled from source again (Python checks each .pyc against its source), never run stale.
"$PYTHON" -m compileall -q p2p nodes >/dev/null
"$PYTHON" -c "import torch, zmq, msgpack, typer, cryptography; print(f'p2p installed: torch {torch.__version__}, pyzmq {zmq.__version__}, cryptography {cryptography.__version__}')"
