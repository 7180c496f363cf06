#!/usr/bin/env python3
"""The binding's overhead: certattn.attend from Python against the same calls made from
C++ (certattn._core.cpp_attend_seconds: attend_group per KV head on the same buffers and
index, workspaces made beforehand), in one process, on one cache.

Blocks of C++ and Python repeats alternate, so that load on a shared machine hits both;
reported are the medians per call and their ratio (Python / C++).

    PYTHONPATH=build/python/python python3 python/bench/overhead.py --tokens 32768
"""
import argparse
import statistics
import time

import numpy as np

import certattn
from certattn import _core


def measure(q, k, v, index, threads, repeats, blocks):
    # Both sides make the same calls: the default options (routing auto), no history.
    opt = certattn._options(0.1, 0.05, "value_scale", "tight", 64, 2, 32, 6, 0.0, 7)
    cpp, py = [], []
    out = np.empty(q.shape, np.float32)
    step = 0
    q3 = q.reshape(1, *q.shape) if k.ndim == 2 else q
    for _ in range(blocks):
        cpp += _core.cpp_attend_seconds(q3, k, v, index._core, opt, step, threads, repeats)
        for r in range(repeats):
            t0 = time.perf_counter()
            certattn.attend(q, k, v, index, eps=0.1, seed=7, step=step + r, threads=threads, out=out, history=False)
            py.append(time.perf_counter() - t0)
        step += repeats
    return statistics.median(cpp), statistics.median(py)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--repeats", type=int, default=10, help="calls per block (a layer: a quarter, at least 2)")
    p.add_argument("--blocks", type=int, default=20)
    a = p.parse_args()
    rng = np.random.default_rng(1)
    n, d, G, H = a.tokens, a.head_dim, a.group, a.kv_heads
    k = rng.standard_normal((H, n, d)).astype(np.float16)
    v = rng.standard_normal((H, n, d)).astype(np.float16)
    # Mixed attention: queries near a few keys.
    q = np.stack([[1.5 * k[h, rng.integers(n)].astype(np.float32) + rng.standard_normal(d) for _ in range(G)]
                  for h in range(H)]).astype(np.float32)
    print(f"{n} tokens, head_dim {d}, group {G}, fp16, isa {certattn.active_isa()}; medians of "
          f"{a.blocks} x {a.repeats} calls, C++ and Python blocks alternating")
    print(f"{'call':<28} {'C++ ms':>8} {'Python ms':>10} {'Python/C++':>11}")
    one = certattn.KeyIndex(k[0], v[0])
    c, py = measure(q[0], k[0], v[0], one, 1, a.repeats, a.blocks)
    print(f"{'one group (1 KV head)':<28} {1e3 * c:>8.3f} {1e3 * py:>10.3f} {py / c:>11.3f}")
    layer = certattn.KeyIndex(k, v, threads=2)
    for t in (1, 2):
        c, py = measure(q, k, v, layer, t, max(a.repeats // 4, 2), a.blocks)
        print(f"{f'layer ({H} KV heads), {t} thr':<28} {1e3 * c:>8.3f} {1e3 * py:>10.3f} {py / c:>11.3f}")


if __name__ == "__main__":
    main()
