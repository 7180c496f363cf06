"""The attention variants (soft-cap, ALiBi slopes, sinks, sliding window) through the Python
binding: attend() equals reference_attend() (same samples and certificates), its certified
outputs are within epsilon of exact_attention() with the same variant, dense_attend()
agrees with exact_attention(), and bad variant arguments raise errors that name them.
Deterministic: fixed seeds, no statistical rate is tested."""
import numpy as np
import pytest

import certattn
from conftest import synthetic_cache

VARIANTS = {
    "softcap": dict(softcap=5.0),
    "alibi": dict(alibi_slopes=[2.0**-6, 2.0**-8, 2.0**-10, 2.0**-12]),
    "sinks": dict(sinks=[1.0, -2.0, 3.0, 0.5]),
    "window": dict(sliding_window=1500),
    "all": dict(softcap=20.0, alibi_slopes=[0.01, 0.002, -0.001, 0.0], sinks=[0.0, 1.0, 2.0, 3.0],
                sliding_window=2000),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_attend_equals_reference_and_certifies(name):
    kw = VARIANTS[name]
    k, v, q = synthetic_cache(3000, 64, seed=5, focus=1.5, steps=2, groups=4)
    index = certattn.KeyIndex(k, v)
    hints = None
    for step in range(2):
        out, certs = certattn.attend(q[step], k, v, index, eps=0.1, seed=3, step=step, layer=1, level_hints=hints,
                                     routing="off", **kw)
        ref, rcerts = certattn.reference_attend(q[step], k, v, index, eps=0.1, seed=3, step=step, layer=1,
                                                level_hints=hints, routing="off", **kw)
        for f in ("certified", "exact", "level", "heavy", "sampled"):
            assert np.array_equal(certs[f], rcerts[f]), (f, certs, rcerts)
        assert np.array_equal(certs["max_score"], rcerts["max_score"])
        norm = np.maximum(np.linalg.norm(ref, axis=-1), 1e-6)
        assert (np.linalg.norm(out - ref, axis=-1) <= 1e-5 * norm).all()
        exact, info = certattn.exact_attention(q[step], k, v, **kw)
        err = np.linalg.norm(out - exact, axis=-1)
        ok = certs["certified"].astype(bool)
        assert (err[ok] <= 0.1 * info["value_scale"][ok]).all()
        dense = certattn.dense_attend(q[step], k, v, **kw)
        assert np.allclose(dense, exact, atol=2e-5 * max(1.0, float(np.abs(exact).max())))
        hints = certs["level"]


def test_variant_bad_arguments_name_themselves():
    k, v, q = synthetic_cache(600, 64, seed=1, steps=1, groups=2)
    index = certattn.KeyIndex(k, v)
    call = lambda **kw: certattn.attend(q[0], k, v, index, history=False, **kw)
    with pytest.raises(ValueError, match="sinks: 3 values for 2 query heads"):
        call(sinks=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="alibi_slopes contains a NaN"):
        call(alibi_slopes=[0.1, float("nan")])
    with pytest.raises(ValueError, match="softcap must be > 0"):
        call(softcap=0.0)
    with pytest.raises(ValueError, match="softcap must be > 0"):
        call(softcap=-3.0)
    with pytest.raises(ValueError, match="sliding_window must be > 0"):
        call(sliding_window=0)
    with pytest.raises(TypeError, match="sliding_window must be an integer"):
        call(sliding_window=1.5)
    with pytest.raises(ValueError, match="sinks: 1 values for 2 query heads"):
        certattn.dense_attend(q[0], k, v, sinks=[1.0])


def numpy_attention(q, k, v, softcap=None, alibi_slopes=None, sinks=None, sliding_window=None):
    """Exact attention with the variant, written out in NumPy (float64): the independent
    statement of what the library's variant means. q [G, d], k and v [n, d]."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    n, d = k.shape
    first = n - sliding_window if sliding_window and sliding_window < n else 0
    out = []
    for g in range(q.shape[0]):
        s = (k[first:] @ q[g]) / np.sqrt(d)
        if softcap:
            s = softcap * np.tanh(s / softcap)
        if alibi_slopes is not None:  # slopes and sinks are float32 in the library
            s = s + float(np.float32(alibi_slopes[g])) * (np.arange(first, n) - (n - 1))
        z = None if sinks is None else float(np.float32(sinks[g]))
        c = s.max() if z is None else max(s.max(), z)
        w = np.exp(s - c)
        den = w.sum() + (0.0 if z is None else np.exp(z - c))
        out.append(w @ v[first:] / den)
    return np.array(out)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_exact_attention_is_the_variant(name):
    kw = VARIANTS[name]
    k, v, q = synthetic_cache(3000, 64, seed=9, focus=1.5, steps=1, groups=4)
    exact, _ = certattn.exact_attention(q[0], k, v, **kw)
    want = numpy_attention(np.reshape(q[0], (-1, 64)), k, v, **kw)
    assert np.allclose(np.reshape(exact, want.shape), want, rtol=1e-9, atol=1e-12)
    plain, _ = certattn.exact_attention(q[0], k, v)
    assert not np.allclose(exact, plain, rtol=1e-6, atol=1e-9)  # the variant changes the output


def test_latent_attention_values_are_a_prefix_of_the_keys():
    """Multi-head latent attention (DeepSeek-V3): k holds one latent row per token and
    v = k[..., :dv] is a view of it (no copy); the output has dv channels."""
    d, dv, G = 192, 128, 16
    k, _, q = synthetic_cache(2500, d, seed=4, focus=1.5, steps=2, groups=G)
    v = k[..., :dv]
    assert np.shares_memory(k, v)
    index = certattn.KeyIndex(k, v)
    scale = 1.0 / np.sqrt(64.0)
    hints = None
    for step in range(2):
        out, certs = certattn.attend(q[step], k, v, index, softmax_scale=scale, step=step, layer=0, routing="off",
                                     level_hints=hints)
        assert out.shape[-1] == dv
        ref, rcerts = certattn.reference_attend(q[step], k, v, index, softmax_scale=scale, step=step, layer=0,
                                                routing="off", level_hints=hints)
        hints = certs["level"]
        for f in ("certified", "exact", "level", "heavy", "sampled"):
            assert np.array_equal(certs[f], rcerts[f])
        exact, info = certattn.exact_attention(q[step], k, v, softmax_scale=scale)
        want = np.asarray(np.reshape(q[step], (-1, d)), np.float64) @ np.asarray(k, np.float64).T * scale
        w = np.exp(want - want.max(axis=1, keepdims=True))
        want = (w @ np.asarray(v, np.float64)) / w.sum(axis=1, keepdims=True)
        assert np.allclose(np.reshape(exact, want.shape), want, rtol=1e-9, atol=1e-12)
        ok = certs["certified"].astype(bool)
        err = np.linalg.norm(out - exact, axis=-1)
        assert (err[ok] <= 0.1 * info["value_scale"][ok]).all()
        dense = certattn.dense_attend(q[step], k, v, softmax_scale=scale)
        assert np.allclose(dense, exact, atol=2e-5 * max(1.0, float(np.abs(exact).max())))
    with pytest.raises(ValueError, match="v may have fewer channels than k, not more"):
        certattn.dense_attend(q[0][..., :dv], v, k)
