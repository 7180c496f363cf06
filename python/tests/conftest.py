import numpy as np
import pytest


def synthetic_cache(n, d, heads=None, seed=0, dtype=np.float16, focus=2.0, groups=4, steps=1):
    """Keys and values N(0, 1); queries aligned with random keys (focus scales the
    alignment: larger is more focused attention, 0 flat). Returns k, v ([n, d] or
    [heads, n, d]) and q [steps, heads or 1, groups, d] float32."""
    rng = np.random.default_rng(seed)
    H = heads or 1
    k = rng.standard_normal((H, n, d)).astype(dtype)
    v = (rng.standard_normal((H, n, d)) + 0.5).astype(dtype)
    picks = rng.integers(0, n, size=(steps, H, groups))
    q = np.empty((steps, H, groups, d), np.float32)
    for s in range(steps):
        for h in range(H):
            for g in range(groups):
                q[s, h, g] = focus * k[h, picks[s, h, g]].astype(np.float32) + rng.standard_normal(d)
    if heads is None:
        return k[0], v[0], q[:, 0]
    return k, v, q


@pytest.fixture
def cache():
    return synthetic_cache
