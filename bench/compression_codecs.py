"""Codec throughput and compression ratio.

    python bench/compression_codecs.py [--sizes 2000000 16000000] [--repeat 3]

Per codec and vector size: best-of-``repeat`` wall time of compress and of decompress, the
throughput of a compress+decompress round trip in MB/s of float32 input, and the ratio of
compressed payload bytes to float32 bytes. A plain ``np.copy`` of the vector is printed first as
the machine's memory-bandwidth yardstick. Single-threaded numpy; timings on a shared machine vary.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from p2p.compression import COMPRESSORS, decompress, make_compressor

CONFIGS = [
    ("none", {}),
    ("fp16", {}),
    ("bf16", {}),
    ("int8", {"block": 256}),
    ("int8", {"block": 4096}),
    ("int4", {"block": 64}),
    ("topk", {"fraction": 0.01}),
    ("topk", {"fraction": 0.001}),
    ("sign", {"block": 1024}),
    ("sparseloco", {"fraction": 0.02, "block": 4096}),
]


def best(fn, repeat: int) -> tuple[float, object]:
    out, t = None, float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        t = min(t, time.perf_counter() - start)
    return t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2_000_000, 16_000_000])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    assert {name for name, _ in CONFIGS} == set(COMPRESSORS)
    for n in args.sizes:
        x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        mb = x.nbytes / 1e6
        t_copy, _ = best(x.copy, args.repeat)
        print(f"\n{n:,} float32 ({mb:.0f} MB); np.copy {t_copy * 1e3:.1f} ms ({mb / t_copy:,.0f} MB/s)")
        print(f"{'codec':<38}{'compress ms':>12}{'decompress ms':>15}{'round trip MB/s':>17}{'ratio':>9}")
        for name, params in CONFIGS:
            comp = make_compressor(name, **params)
            t_c, c = best(lambda comp=comp, x=x: comp.compress(x), args.repeat)
            t_d, _ = best(lambda c=c, n=n: decompress(c, n), args.repeat)
            label = name + ("(" + ",".join(f"{k}={v}" for k, v in params.items()) + ")" if params else "")
            print(f"{label:<38}{t_c * 1e3:>12.1f}{t_d * 1e3:>15.1f}{mb / (t_c + t_d):>17,.0f}"
                  f"{c.nbytes / x.nbytes:>9.4f}")


if __name__ == "__main__":
    main()
