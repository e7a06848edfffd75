#!/usr/bin/env bash
# GPU check of the daemon path: three `p2p start` nodes on one CUDA device (loopback), a built-in
# task, DiLoCo with the SparseLoCo codec, a swarm key, checkpoints. Mid-run it asks the swarm for
# its table (`p2p status --swarm --json`); at the end it prints each node's "started" device and
# "done" line (steps, steps/s, accuracy, bytes) and the consensus distance of the final outer
# copies (theta_start, from the checkpoints). bench/gpu_smoke.sh covers the p2p.Swarm path.
#   bash bench/gpu_daemon.sh [STEPS] [TASK] [PRECISION]   # defaults: 3000 nodes.wide:WideTask bf16
# DEVICE=cpu runs the same on the CPU (a dry run of this script; the test suite covers the CPU).
# CONFIG=examples/slow-links.toml runs that file's averaging settings instead of the defaults below.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${1:-3000}"
TASK="${2:-nodes.wide:WideTask}"
PRECISION="${3:-bf16}"
DEVICE="${DEVICE:-cuda}"
PYTHON="${PYTHON:-python3}"
AVERAGING=(--algorithm diloco --compression sparseloco --diloco-inner-steps 25)
[ -n "${CONFIG:-}" ] && AVERAGING=(--config "$CONFIG")
if [ "$DEVICE" = cuda ]; then
  "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_daemon: no CUDA device')"
  "$PYTHON" -c "import torch; print('gpu_daemon:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
fi
OUT="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$OUT"' EXIT
"$PYTHON" -m p2p keygen > "$OUT/swarm.key"
chmod 600 "$OUT/swarm.key"
read -r P0 P1 P2 < <("$PYTHON" -c "from p2p.net.ports import free_ports; print(*free_ports(3))")
PORTS=("$P0" "$P1" "$P2")
for i in 0 1 2; do
  JOIN=(); [ "$i" -gt 0 ] && JOIN=(--join "127.0.0.1:$P0")
  "$PYTHON" -m p2p start --listen "127.0.0.1:${PORTS[$i]}" "${JOIN[@]}" --min-members 3 --shard "$i/3" \
    --task "$TASK" --device "$DEVICE" --precision "$PRECISION" --swarm-key "$OUT/swarm.key" \
    "${AVERAGING[@]}" --steps "$STEPS" --linger 5 \
    --checkpoint-dir "$OUT/ckpt$i" --log-format json > "$OUT/node$i.log" 2>&1 &
done
# One look at the swarm while it trains: poll until a node answers with three members training.
for _ in $(seq 1 120); do
  if "$PYTHON" -m p2p status --peer "127.0.0.1:$P0" --swarm --json --timeout 10 --swarm-key "$OUT/swarm.key" > "$OUT/status.json" 2>/dev/null \
     && "$PYTHON" -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if len(r)==3 and all(((x.get('status') or {}).get('step') or 0)>0 for x in r) else 1)" "$OUT/status.json" 2>/dev/null; then
    "$PYTHON" -c "import json,sys; [print('status:', {k: x['status'].get(k) for k in ('id','device','phase','step','steps_per_s','accuracy','bytes_sent')}) for x in json.load(open(sys.argv[1]))]" "$OUT/status.json" || true
    break
  fi
  sleep 1
done
wait
for i in 0 1 2; do
  echo "node $i: $(grep -m1 '"event": "started"' "$OUT/node$i.log" | "$PYTHON" -c "import json,sys; d=json.loads(sys.stdin.read()); print('device', d['device'], 'parameters', d['parameters'])")"
  echo "node $i: $(grep '"event": "done"' "$OUT/node$i.log" | tail -n1 | "$PYTHON" -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('step','steps_per_s','accuracy','bytes_sent','repairs','inner_steps')})")"
done
"$PYTHON" - "$OUT" <<'PY'
import glob, sys
import numpy as np, torch
from p2p.harness.local_swarm import consensus_distance
starts, models = [], []
for i in range(3):
    path = sorted(glob.glob(f"{sys.argv[1]}/ckpt{i}/ckpt-*.pt"))[-1]
    ck = torch.load(path, map_location="cpu", weights_only=True)
    starts.append(ck["algorithm_state"]["theta_start"].numpy().astype(np.float64))
    models.append(torch.cat([t.float().reshape(-1) for t in ck["model"].values()]).numpy())
d, scale = consensus_distance(starts), float(np.linalg.norm(np.mean(starts, axis=0)))
print(f"outer copies (theta_start): consensus distance {d:.3e} ({d / scale:.2e} of the norm)")
print(f"final models (inner steps since the last round): consensus distance {consensus_distance(models):.3e}")
PY
