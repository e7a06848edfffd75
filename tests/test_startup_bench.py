"""bench/startup.py on two real peers: it launches both modes, reads each process's first step
from its logs and splits p2p's critical path in two phases that add up to its last start."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_startup_bench_times_both_modes_and_splits_p2p_start_up():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "startup.py"), "--peers", "2", "--runs", "1"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    firsts = {mode: [float(x) for x in re.search(rf"run 1 {mode}\s+first step at ([\d. ]+) s", out).group(1).split()]
              for mode in ("compute_only", "p2p")}
    assert all(len(times) == 2 and 0 < min(times) for times in firsts.values()), out
    medians = re.search(r"p2p ([\d.]+) s, compute-only ([\d.]+) s", out)
    assert medians and float(medians.group(1)) == max(firsts["p2p"]), out
    phases = [float(x) for x in re.findall(r"p2p .*: median ([\d.]+) s", out)]
    assert len(phases) == 2 and phases[0] > 0 and phases[1] >= 0, out
    assert abs(sum(phases) - max(firsts["p2p"])) < 0.02, out  # the two phases are the last start, split
