#!/usr/bin/env bash
# GPU smoke test: a 3-peer swarm on CUDA, bf16 autocast, through p2p.Swarm + swarm.wrap (the
# user's-own-loop path: examples/amp_cuda.py), on loopback. Prints each peer's device, dtype,
# steps/s and held-out accuracy, then the consensus distance of the three final models.
#   bash bench/gpu_smoke.sh [STEPS] [ALGORITHM]        # defaults: 2000 diloco
# Needs a CUDA GPU (it refuses to run on the CPU: that is what the test suite covers).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${1:-2000}"
ALGORITHM="${2:-diloco}"
PYTHON="${PYTHON:-python3}"
"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_smoke: no CUDA device (torch.cuda.is_available() is False)')"
"$PYTHON" -c "import torch; print('gpu_smoke:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
OUT="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$OUT"' EXIT
read -r P0 P1 P2 < <("$PYTHON" -c "from p2p.net.ports import free_ports; print(*free_ports(3))")
PORTS=("$P0" "$P1" "$P2")
for i in 0 1 2; do
  JOIN=(); [ "$i" -gt 0 ] && JOIN=(--join "127.0.0.1:$P0")
  "$PYTHON" examples/amp_cuda.py --listen "127.0.0.1:${PORTS[$i]}" "${JOIN[@]}" --peers 3 --shard "$i/3" \
    --dtype bf16 --algorithm "$ALGORITHM" --steps "$STEPS" --linger 5 --out "$OUT/peer$i.pt" > "$OUT/peer$i.log" 2>&1 &
done
wait
for i in 0 1 2; do echo "peer $i: $(tail -n 1 "$OUT/peer$i.log")"; done
"$PYTHON" - "$OUT" <<'PY'
import sys, torch
from p2p.harness.local_swarm import consensus_distance
states = [torch.load(f"{sys.argv[1]}/peer{i}.pt", map_location="cpu", weights_only=True) for i in range(3)]
vectors = [torch.cat([t.float().reshape(-1) for t in s.values()]).numpy() for s in states]
import numpy as np
distance, scale = consensus_distance(vectors), float(np.linalg.norm(np.mean(vectors, axis=0)))
print(f"consensus distance {distance:.3e} (mean L2 to the swarm mean; {distance / scale:.2e} of its norm)")
PY
