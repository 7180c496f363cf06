"""The Python binding against the C++ library: the reference estimator, exact attention,
the certificates' guarantee on synthetic caches, bad inputs, and torch against NumPy.

Every random input comes from a fixed seed, so a run is deterministic; the statistical
test states the probability with which it would fail under the guarantee."""
import functools
import math
import threading
import time

import numpy as np
import pytest

import certattn
from conftest import synthetic_cache

# One-off calls with histories name their step and layer (docs/python.md).
attend0 = functools.partial(certattn.attend, step=0, layer=0)

torch = pytest.importorskip("torch")

DTYPES = [np.float16, np.float32, "bfloat16"]


def as_dtype(x, dtype):
    """x in dtype; bfloat16 as uint16 bits (rounded to nearest even by torch)."""
    if dtype == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    return np.ascontiguousarray(x, dtype)


def same_certs(a, b, fields=("certified", "exact", "level", "heavy", "sampled")):
    return all(np.array_equal(a[f], b[f]) for f in fields)


# --- the fast path equals the C++ reference ---------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("certificate", ["tight", "classic"])
@pytest.mark.parametrize("scale", ["value_scale", "output_norm", "denominator"])
def test_attend_equals_reference(dtype, certificate, scale):
    k, v, q = synthetic_cache(3000, 64, seed=3, focus=1.5, steps=3)
    k, v = as_dtype(k, dtype), as_dtype(v, dtype)
    index = certattn.KeyIndex(k, v)
    hints = None
    for step in range(3):
        # The hints of the step before, not the index's history (whose first call, with
        # measured costs, would time the dense kernel).
        out, certs = certattn.attend(q[step], k, v, index, eps=0.1, scale=scale, certificate=certificate, seed=11,
                                     step=step, layer=2, kv_head=1, level_hints=hints, history=False)
        ref, rcerts = certattn.reference_attend(q[step], k, v, index, eps=0.1, scale=scale, certificate=certificate,
                                                seed=11, step=step, layer=2, kv_head=1, level_hints=hints)
        assert same_certs(certs, rcerts), (certs, rcerts)
        assert np.array_equal(certs["max_score"], rcerts["max_score"])  # the same bits: the same scores
        # The audit's tolerance: the fast path sums in float where the reference sums in double.
        norm = np.maximum(np.linalg.norm(ref, axis=1), 1e-6)
        assert (np.linalg.norm(out - ref, axis=1) <= 1e-5 * norm).all()
        hints = certs["level"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_call_equals_group_calls(dtype):
    k, v, q = synthetic_cache(2000, 32, heads=3, seed=5, groups=2)
    k, v = as_dtype(k, dtype), as_dtype(v, dtype)
    layer = certattn.KeyIndex(k, v, threads=2)
    # history=False: the three calls are the same call (a history would carry levels between them).
    out, certs = certattn.attend(q[0], k, v, layer, seed=9, step=4, layer=1, threads=2, history=False)
    assert out.shape == (3, 2, 32) and certs.shape == (3, 2)
    flat, flat_certs = certattn.attend(q[0].reshape(6, 32), k, v, layer, seed=9, step=4, layer=1, history=False)
    assert np.array_equal(flat.reshape(3, 2, 32), out)
    for h in range(3):
        idx = certattn.KeyIndex(k[h], v[h])
        o, c = certattn.attend(q[0, h], k[h], v[h], idx, seed=9, step=4, layer=1, kv_head=h, history=False)
        assert np.array_equal(o, out[h])  # bit for bit: the same call
        assert same_certs(c, certs[h])


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_and_exact(dtype):
    k, v, q = synthetic_cache(1500, 48, seed=7, steps=1)
    k, v = as_dtype(k, dtype), as_dtype(v, dtype)
    exact, info = certattn.exact_attention(q[0], k, v)
    dense = certattn.dense_attend(q[0], k, v)
    assert exact.dtype == np.float64 and dense.dtype == np.float32
    assert np.abs(dense - exact).max() <= 1e-5 * info["value_scale"].max()
    kf = (k.astype(np.uint32) << 16).view(np.float32) if dtype == "bfloat16" else k.astype(np.float32)
    vf = (v.astype(np.uint32) << 16).view(np.float32) if dtype == "bfloat16" else v.astype(np.float32)
    s = q[0].astype(np.float64) @ kf.astype(np.float64).T / math.sqrt(48)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    np_out = (w @ vf.astype(np.float64)) / w.sum(axis=1, keepdims=True)
    assert np.abs(np_out - exact).max() <= 1e-9 * info["value_scale"].max()
    assert np.allclose(info["max_score"], s.max(axis=1), rtol=1e-12)


# --- the certificates hold -----------------------------------------------------------------

def binomial_tail(v, n, p):
    return certattn._binomial_upper_tail(v, n, p)


def test_positions_each_within_its_certificate():
    """Four draft positions of a layer (2 KV heads, G = 4) in one call: each position's
    answer within its certificate of exact attention over the cache up to its own token.
    delta = 1e-9 per head: 32 certified answers fail together with probability < 4e-8.
    One position is the plain call, bit for bit; the causal dense kernel agrees with the
    dense kernel over each prefix."""
    P = 4
    k, v, q = synthetic_cache(4096, 64, heads=2, seed=41, focus=2.0, groups=4, steps=P)
    index = certattn.KeyIndex(k, v)
    out, certs = certattn.attend(q, k, v, index, eps=0.1, delta=1e-9, seed=3, step=1, layer=0, history=False,
                                 positions=P)
    assert out.shape == (P, 2, 4, 64) and certs.shape == (P, 2, 4)
    dense = certattn.dense_attend(q, k, v, positions=P)
    n = k.shape[1]
    for p in range(P):
        n_p = n - P + 1 + p
        exact, info = certattn.exact_attention(q[p], k[:, :n_p], v[:, :n_p])
        err = np.linalg.norm(out[p] - exact, axis=-1)
        beta = np.where(certs[p]["exact"], 1e-5 * info["value_scale"], certs[p]["beta"])
        assert (certs[p]["certified"] | certs[p]["exact"]).all()
        assert (err <= beta + 1e-6 * info["value_scale"]).all(), (p, err, beta)
        assert np.allclose(dense[p], certattn.dense_attend(q[p], k[:, :n_p], v[:, :n_p]), atol=1e-4)
    one, one_certs = certattn.attend(q[0], k, v, index, eps=0.1, delta=1e-9, seed=3, step=1, layer=0, history=False)
    out1, certs1 = certattn.attend(q[0], k, v, index, eps=0.1, delta=1e-9, seed=3, step=1, layer=0, history=False,
                                   positions=1)
    assert np.array_equal(one, out1) and same_certs(one_certs, certs1)
    with pytest.raises(ValueError, match="leading axis of positions=4"):
        certattn.attend(q[0], k, v, index, step=1, layer=0, positions=P)
    with pytest.raises(ValueError, match="positions must be an integer >= 1"):
        certattn.dense_attend(q, k, v, positions=0)


@pytest.mark.parametrize("fmt,kv_scales", [("q8_0", None), ("q4_0", None), ("fp8_e4m3", (0.05, 0.04)),
                                           ("fp8_e5m2", (1.0, 1.0))])
def test_quantized_caches(fmt, kv_scales):
    """A layer stored in llama.cpp's blocks or vLLM's fp8 (certattn.quantize), read in
    place: the certified call equals the reference over the decoded cache (same samples),
    each answer within its certificate of exact attention over the decoded cache (delta
    1e-9 per head: 24 heads fail together with probability < 3e-8), and the dense kernel
    agrees with exact attention."""
    k, v, q = synthetic_cache(3000, 64, heads=2, seed=51, focus=2.0, groups=4, steps=1)
    ks, vs = kv_scales or (1.0, 1.0)
    kq = certattn.quantize(k, fmt, ks) if fmt.startswith("fp8") else certattn.quantize(k, fmt)
    vq = certattn.quantize(v, fmt, vs) if fmt.startswith("fp8") else certattn.quantize(v, fmt)
    assert kq.dtype == {"q8_0": certattn.BLOCK_Q8_0, "q4_0": certattn.BLOCK_Q4_0, "fp8_e4m3": certattn.FP8_E4M3,
                        "fp8_e5m2": certattn.FP8_E5M2}[fmt]
    assert kq.shape[:2] == (2, 3000)
    index = certattn.KeyIndex(kq, vq, kv_scales=kv_scales)
    assert index.dtype == fmt and index.head_dim == 64
    out, certs = certattn.attend(q[0], kq, vq, index, delta=1e-9, seed=2, step=0, layer=0, history=False,
                                 kv_scales=kv_scales)
    ref, rcerts = certattn.reference_attend(q[0], kq, vq, index, delta=1e-9, seed=2, kv_scales=kv_scales)
    assert same_certs(certs, rcerts)
    exact, info = certattn.exact_attention(q[0], kq, vq, kv_scales=kv_scales)
    norm = np.maximum(np.linalg.norm(ref, axis=-1), 1e-6)
    assert (np.linalg.norm(out - ref, axis=-1) <= 1e-5 * norm).all()
    err = np.linalg.norm(out - exact, axis=-1)
    assert (certs["certified"] | certs["exact"]).all()
    assert (err <= np.where(certs["exact"], 1e-5 * info["value_scale"], certs["beta"]) + 1e-6 * info["value_scale"]).all()
    dense = certattn.dense_attend(q[0], kq, vq, kv_scales=kv_scales)
    assert np.allclose(dense, exact, atol=1e-4 * info["value_scale"].max())
    # The decoded cache is the float one up to the format's rounding.
    tol = {"q8_0": 0.02, "q4_0": 0.3, "fp8_e4m3": 0.2, "fp8_e5m2": 0.4}[fmt]
    assert np.abs(certattn.exact_attention(q[0], k, v)[0] - exact).max() < tol * info["value_scale"].max()
    if kv_scales is not None and kv_scales != (1.0, 1.0):
        with pytest.raises(Exception, match="scale"):
            certattn.attend(q[0], kq, vq, index, step=1, layer=0, history=False)  # other scales than the index's
    with pytest.raises(ValueError, match="kv_scales apply to fp8 caches only"):
        certattn.dense_attend(q[0], k, v, kv_scales=(2.0, 1.0))


@pytest.mark.parametrize("kfmt,vfmt", [("q8_0", None), ("q4_0", None), ("q8_0", "q4_0")])
def test_keys_and_values_in_two_formats(kfmt, vfmt):
    """llama.cpp's -ctk q8_0 with f16 values (and its other pairs): the certified call equals
    the reference over the decoded cache, within its certificate of exact attention (delta
    1e-9 per head), and the dense kernel agrees with exact attention."""
    k, v, q = synthetic_cache(3000, 64, heads=2, seed=53, focus=2.0, groups=4, steps=1)
    kq = certattn.quantize(k, kfmt)
    vq = v.astype(np.float16) if vfmt is None else certattn.quantize(v, vfmt)
    index = certattn.KeyIndex(kq, vq)
    assert index.dtype == kfmt + "/" + ("float16" if vfmt is None else vfmt)
    out, certs = certattn.attend(q[0], kq, vq, index, delta=1e-9, seed=2, step=0, layer=0, history=False)
    ref, rcerts = certattn.reference_attend(q[0], kq, vq, index, delta=1e-9, seed=2)
    assert same_certs(certs, rcerts)
    exact, info = certattn.exact_attention(q[0], kq, vq)
    norm = np.maximum(np.linalg.norm(ref, axis=-1), 1e-6)
    assert (np.linalg.norm(out - ref, axis=-1) <= 1e-5 * norm).all()
    err = np.linalg.norm(out - exact, axis=-1)
    assert (certs["certified"] | certs["exact"]).all()
    assert (err <= np.where(certs["exact"], 1e-5 * info["value_scale"], certs["beta"]) + 1e-6 * info["value_scale"]).all()
    dense = certattn.dense_attend(q[0], kq, vq)
    assert np.allclose(dense, exact, atol=1e-4 * info["value_scale"].max())
    # An index built from one pair refuses another, and unserved pairs are named.
    with pytest.raises(TypeError, match="v: dtype"):
        certattn.attend(q[0], kq, certattn.quantize(v, kfmt), index, step=1, layer=0, history=False)
    with pytest.raises(TypeError, match="different dtypes"):
        certattn.dense_attend(q[0], v.astype(np.float16), kq)


def test_certificates_hold_on_synthetic_caches():
    """Three attention regimes x 3 error scales x 2 epsilons, 96 calls each (1728 calls).
    Under the guarantee each certified call violates with probability <= delta = 0.05;
    the test fails only when the violations exceed the count whose binomial tail is below
    1e-6 (its false-failure probability), or any call disagrees with the reference."""
    eps, delta = (0.1, 0.3), 0.05
    total_cert = total_viol = 0
    for regime, (focus, seed) in {"flat": (0.0, 21), "mixed": (1.0, 22), "focused": (3.0, 23)}.items():
        k, v, q = synthetic_cache(4096, 64, heads=2, seed=seed, focus=focus, groups=4, steps=12)
        report = certattn.audit(k, v, q, eps=eps, delta=delta, check_every=7, alpha=1e-6, threads=2)
        assert report.passed, (regime, report.table())
        for row in report.rows:
            assert row["calls"] == 12 * 2 * 4 and row["disagreements"] == 0
            total_cert += row["certified"]
            total_viol += row["violations"]
    limit = next(x for x in range(total_cert + 1) if binomial_tail(x, total_cert, delta) < 1e-6)
    assert total_viol < limit, (total_viol, total_cert)
    assert total_cert > 0.5 * 1728


def test_certified_error_within_bound_per_call():
    k, v, q = synthetic_cache(8192, 64, heads=2, seed=31, focus=2.0, groups=4, steps=4)
    index = certattn.KeyIndex(k, v)
    viol = calls = 0
    for s in range(4):
        out, certs = certattn.attend(q[s], k, v, index, eps=0.1, seed=5, step=s, layer=0)
        exact, info = certattn.exact_attention(q[s], k, v)
        err = np.linalg.norm(out - exact, axis=-1) / info["value_scale"]
        viol += int(((err > 0.1) & certs["certified"]).sum())
        calls += certs.size
        assert (certs["bound"][certs["certified"] & ~certs["exact"]] <= 0.1).all()
        assert (certs["keys_read"] <= 8192).all()
    # 32 calls at delta 0.05: P(>= 8 violations) < 1e-3 under the guarantee.
    assert viol < 8


# --- bad input raises, never crashes --------------------------------------------------------

@pytest.fixture(scope="module")
def good():
    k, v, q = synthetic_cache(512, 32, seed=1, steps=1)
    return k, v, q[0], certattn.KeyIndex(k, v)


def bad_cases(good):
    k, v, q, idx = good
    nan_k = k.copy()
    nan_k[10, 3] = np.nan
    nan_q = q.copy()
    nan_q[0, 0] = np.nan
    longer_k = np.concatenate([k, k[:1]])
    longer_v = np.concatenate([v, v[:1]])
    return {
        "k int dtype": (TypeError, lambda: certattn.KeyIndex(k.astype(np.int32), v)),
        "k float64": (TypeError, lambda: certattn.KeyIndex(k.astype(np.float64), v.astype(np.float64))),
        "k list": (TypeError, lambda: certattn.KeyIndex(k.tolist(), v)),
        "k/v dtypes differ": (TypeError, lambda: certattn.KeyIndex(k, v.astype(np.float32))),
        "k/v shapes differ": (ValueError, lambda: certattn.KeyIndex(k, v[:100])),
        "k 1-D": (ValueError, lambda: certattn.KeyIndex(k[0], v[0])),
        "k 4-D": (ValueError, lambda: certattn.KeyIndex(k[None, None], v[None, None])),
        "k empty": (ValueError, lambda: certattn.KeyIndex(k[:0], v[:0])),
        "k NaN": (ValueError, lambda: certattn.KeyIndex(nan_k, v)),
        "v Inf": (ValueError, lambda: certattn.KeyIndex(k, np.where(np.arange(32) == 5, np.inf, v).astype(v.dtype))),
        "k not contiguous": (ValueError, lambda: certattn.KeyIndex(k[:, ::2], v[:, ::2])),
        "k transposed": (ValueError, lambda: certattn.KeyIndex(k.T, v.T)),
        "k reversed": (ValueError, lambda: certattn.KeyIndex(k[::-1], v[::-1])),
        "k big-endian": (TypeError, lambda: certattn.KeyIndex(k.astype(">f2"), v.astype(">f2"))),
        "q NaN": (ValueError, lambda: attend0(nan_q, k, v, idx)),
        "q int": (TypeError, lambda: attend0(q.astype(np.int32), k, v, idx)),
        "q wrong head_dim": (ValueError, lambda: attend0(q[:, :16], k, v, idx)),
        "q 3-D for one head": (ValueError, lambda: attend0(q[None], k, v, idx)),
        "q huge": (ValueError, lambda: attend0(q * 1e30, k, v, idx)),
        "index is not a KeyIndex": (TypeError, lambda: attend0(q, k, v, "index")),
        "cache grew without append": (ValueError, lambda: attend0(q, longer_k, longer_v, idx)),
        "cache of another dtype": (TypeError, lambda: attend0(q, k.astype(np.float32), v.astype(np.float32), idx)),
        "layer cache, head index": (ValueError, lambda: attend0(q[None], k[None], v[None], idx)),
        "eps 0": (ValueError, lambda: attend0(q, k, v, idx, eps=0)),
        "eps NaN": (ValueError, lambda: attend0(q, k, v, idx, eps=float("nan"))),
        "eps string": (TypeError, lambda: attend0(q, k, v, idx, eps="0.1")),
        "delta 1": (ValueError, lambda: attend0(q, k, v, idx, delta=1.0)),
        "unknown scale": (ValueError, lambda: attend0(q, k, v, idx, scale="l2")),
        "unknown certificate": (ValueError, lambda: attend0(q, k, v, idx, certificate="loose")),
        "window > 64": (ValueError, lambda: attend0(q, k, v, idx, window=65)),
        "max_levels too many": (ValueError, lambda: attend0(q, k, v, idx, max_levels=5000)),
        "negative step": (ValueError, lambda: attend0(q, k, v, idx, step=-1)),
        "float step": (TypeError, lambda: attend0(q, k, v, idx, step=1.5)),
        "seed too large": (ValueError, lambda: attend0(q, k, v, idx, seed=2**64)),
        "layer too large": (ValueError, lambda: attend0(q, k, v, idx, layer=2**32)),
        "hints wrong count": (ValueError, lambda: attend0(q, k, v, idx, level_hints=[1, 2])),
        "hints float": (TypeError, lambda: attend0(q, k, v, idx, level_hints=[0.5] * 4)),
        "out wrong size": (ValueError, lambda: attend0(q, k, v, idx, out=np.zeros(3, np.float32))),
        "out wrong dtype": (ValueError, lambda: attend0(q, k, v, idx, out=np.zeros((4, 32)))),
        "append shorter cache": (ValueError, lambda: idx.append(k[:100], v[:100])),
        "append NaN": (ValueError, lambda: certattn.KeyIndex(k[:500], v[:500]).append(nan_k[:, :] if False else np.concatenate([k[:500], nan_k[10:11]]), np.concatenate([v[:500], v[:1]]))),
        "truncate beyond size": (ValueError, lambda: idx.truncate(k, v, 600)),
        "truncate negative": (ValueError, lambda: idx.truncate(k, v, -1)),
        "dense NaN": (ValueError, lambda: certattn.dense_attend(q, nan_k, v)),
        "dense negative scale": (ValueError, lambda: certattn.dense_attend(q, k, v, softmax_scale=-1.0)),
        "exact NaN": (ValueError, lambda: certattn.exact_attention(q, nan_k, v)),
        "reference wrong index": (ValueError, lambda: certattn.reference_attend(q, longer_k, longer_v, idx)),
        "audit 2-D cache": (ValueError, lambda: certattn.audit(k, v, q[None, None])),
        "audit short cache": (ValueError, lambda: certattn.audit(k[None, :64], v[None, :64], q[None, None])),
        "audit queries shape": (ValueError, lambda: certattn.audit(k[None], v[None], q)),
        "audit unknown scale": (ValueError, lambda: certattn.audit(k[None], v[None], q[None, None], scales=["x"])),
    }


def test_bad_inputs_raise(good):
    cases = bad_cases(good)
    for name, (exc, call) in cases.items():
        with pytest.raises(exc) as info:
            call()
        assert str(info.value), name
    # The index is intact after all of that.
    k, v, q, idx = good
    out, certs = certattn.attend(q, k, v, idx, step=0, layer=0)
    assert len(idx) == 512 and np.isfinite(out).all()


def test_torch_bad_inputs(good):
    k, v, q, idx = good
    with pytest.raises(TypeError):
        certattn.KeyIndex(torch.from_numpy(k).to(torch.int32), torch.from_numpy(v).to(torch.int32))
    with pytest.raises(TypeError):
        certattn.KeyIndex(torch.from_numpy(k).double(), torch.from_numpy(v).double())
    with pytest.raises(ValueError):  # a non-contiguous view is read in place, or refused
        certattn.KeyIndex(torch.from_numpy(k).t(), torch.from_numpy(v).t())


# --- torch and NumPy, views and copies -------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_torch_equals_numpy(dtype):
    k, v, q = synthetic_cache(2500, 64, heads=2, seed=13, steps=1)
    tk = torch.from_numpy(k.astype(np.float32)).to(dtype)
    tv = torch.from_numpy(v.astype(np.float32)).to(dtype)
    tq = torch.from_numpy(q[0]).to(dtype)
    if dtype == torch.bfloat16:
        nk, nv = tk.view(torch.int16).numpy().view(np.uint16), tv.view(torch.int16).numpy().view(np.uint16)
        nq = tq.float().numpy()
    else:
        nk, nv, nq = tk.numpy().copy(), tv.numpy().copy(), tq.numpy().copy()
    ti, ni = certattn.KeyIndex(tk, tv), certattn.KeyIndex(nk, nv)
    to, tc = certattn.attend(tq, tk, tv, ti, seed=3, step=1, layer=0)
    no, nc = certattn.attend(nq, nk, nv, ni, seed=3, step=1, layer=0)
    assert isinstance(to, torch.Tensor) and isinstance(no, np.ndarray)
    assert np.array_equal(to.numpy(), no) and np.array_equal(tc, nc)
    assert np.array_equal(certattn.dense_attend(tq, tk, tv).numpy(), certattn.dense_attend(nq, nk, nv))
    assert np.array_equal(certattn.exact_attention(tq, tk, tv)[0], certattn.exact_attention(nq, nk, nv)[0])


def test_record_dtypes():
    k, v, q = synthetic_cache(300, 32, seed=2, steps=1)
    _, certs = certattn.attend(q[0], k, v, certattn.KeyIndex(k, v), step=0, layer=0)
    _, info = certattn.exact_attention(q[0], k, v)
    assert certs.dtype == certattn.CERTIFICATE_DTYPE and info.dtype == certattn.EXACT_DTYPE
    assert certattn.CERTIFICATE_DTYPE.names == (
        "certified", "exact", "path", "level", "tau", "bound", "beta", "scale_value", "max_score", "denominator", "heavy",
        "sampled", "keys_read", "values_read", "bytes_read")


def test_zero_copy():
    k, v, _ = synthetic_cache(300, 32, heads=2, seed=2)
    assert certattn._core.cache_address(k) == k.ctypes.data
    tk = torch.from_numpy(k.astype(np.float32)).to(torch.bfloat16)
    assert certattn._core.cache_address(certattn._cache(tk, "k")) == tk.data_ptr()
    tk16 = torch.from_numpy(k)
    assert certattn._core.cache_address(certattn._cache(tk16, "k")) == tk16.data_ptr()
    # Writing the buffer after the call is seen by the next call: no copy is kept.
    q = np.ones((2, 1, 32), np.float32)
    a = certattn.dense_attend(q, k, v)
    v[:, :, :] = v + np.float16(1)
    b = certattn.dense_attend(q, k, v)
    assert np.allclose(b - a, 1, atol=1e-2)


def test_strided_caches_read_in_place():
    """A head-major buffer [kv_heads, capacity, d] sliced to n tokens, and a token-major
    buffer [capacity, kv_heads, d] seen as [kv_heads, n, d], give the contiguous result."""
    k, v, q = synthetic_cache(1000, 32, heads=2, seed=17, steps=1)
    ref_idx = certattn.KeyIndex(np.ascontiguousarray(k), np.ascontiguousarray(v))
    ref, rc = certattn.attend(q[0], k, v, ref_idx, seed=1, step=0, layer=0)
    hk = np.zeros((2, 1500, 32), np.float16)
    hv = np.zeros_like(hk)
    hk[:, :1000], hv[:, :1000] = k, v
    nk = np.zeros((1500, 2, 32), np.float16)
    nv = np.zeros_like(nk)
    nk[:1000], nv[:1000] = k.transpose(1, 0, 2), v.transpose(1, 0, 2)
    for kk, vv in ((hk[:, :1000], hv[:, :1000]), (nk[:1000].transpose(1, 0, 2), nv[:1000].transpose(1, 0, 2))):
        assert not kk.flags.c_contiguous
        idx = certattn.KeyIndex(kk, vv)
        out, c = certattn.attend(q[0], kk, vv, idx, seed=1, step=0, layer=0)
        assert np.array_equal(out, ref) and np.array_equal(c, rc)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_torch_strided_views_read_in_place(dtype):
    k, v, q = synthetic_cache(1000, 32, heads=2, seed=18, steps=1)
    ck = torch.from_numpy(k.astype(np.float32)).to(dtype)
    cv = torch.from_numpy(v.astype(np.float32)).to(dtype)
    ref, rc = certattn.attend(q[0], ck, cv, certattn.KeyIndex(ck, cv), seed=1, step=0, layer=0)
    hk = torch.zeros(2, 1500, 32, dtype=dtype)
    hv = torch.zeros_like(hk)
    hk[:, :1000], hv[:, :1000] = ck, cv
    nk = torch.zeros(1500, 2, 32, dtype=dtype)
    nv = torch.zeros_like(nk)
    nk[:1000], nv[:1000] = ck.transpose(0, 1), cv.transpose(0, 1)
    for kk, vv in ((hk[:, :1000], hv[:, :1000]), (nk[:1000].transpose(0, 1), nv[:1000].transpose(0, 1))):
        assert not kk.is_contiguous()
        assert certattn._core.cache_address(certattn._cache(kk, "k")) == kk.data_ptr()
        out, c = certattn.attend(q[0], kk, vv, certattn.KeyIndex(kk, vv), seed=1, step=0, layer=0)
        assert np.array_equal(out, ref) and np.array_equal(c, rc)


def test_append_and_truncate():
    """An index grown by appends, and one truncated, give the reference's answer with
    their own value bounds (a fresh build may centre the values elsewhere, so its samples
    differ), and the same key codes decide the same scores."""
    k, v, q = synthetic_cache(1200, 32, heads=2, seed=19, steps=1)
    grown = certattn.KeyIndex(k[:, :700], v[:, :700], reserve=1200)
    for n in (701, 702, 900, 1200):  # one token, one more, then chunks
        grown.append(k[:, :n], v[:, :n])
    assert len(grown) == 1200
    for n in (1200, 800):
        if n < len(grown):
            grown.truncate(k, v, n)
            assert len(grown) == n
        kk, vv = k[:, :n], v[:, :n]
        # history=False: every call on the sparse path (a history could route the second).
        out, certs = certattn.attend(q[0], kk, vv, grown, seed=4, step=n, history=False)
        ref, rcerts = certattn.reference_attend(q[0], kk, vv, grown, seed=4, step=n)
        assert same_certs(certs, rcerts)
        assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()
        fresh = certattn.KeyIndex(kk, vv)
        assert np.array_equal(certattn.attend(q[0], kk, vv, fresh, seed=4, step=n, history=False)[1]["max_score"],
                              certs["max_score"])


def test_gil_released_and_threads():
    """A long layer call leaves the interpreter free: a Python thread counts meanwhile.
    Two threads calling on two indices agree with sequential calls."""
    k, v, q = synthetic_cache(65536, 64, heads=2, seed=29, steps=1)
    idx = certattn.KeyIndex(k, v, threads=2)
    expected = certattn.reference_attend(q[0, :, :1], k, v, idx, seed=2)[0]
    ticks = []
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.0005)

    t = threading.Thread(target=count)
    t.start()
    time.sleep(0.01)
    before = len(ticks)
    got = certattn.reference_attend(q[0, :, :1], k, v, idx, seed=2)[0]  # O(n) per head, ~0.1 s
    during = len(ticks) - before
    stop.set()
    t.join()
    assert np.array_equal(got, expected)
    assert during >= 5, during

    k2, v2, _ = synthetic_cache(4096, 64, heads=2, seed=30, steps=1)
    idx2 = certattn.KeyIndex(k2, v2)
    # history=False: repeated calls are the same call (a history would carry levels between them).
    seq = [certattn.attend(q[0], k, v, idx, seed=2, history=False)[0],
           certattn.attend(q[0], k2, v2, idx2, seed=2, history=False)[0]]
    res = [None, None]

    def run(i, kk, vv, ii):
        for _ in range(5):
            res[i] = certattn.attend(q[0], kk, vv, ii, seed=2, history=False)[0]

    threads = [threading.Thread(target=run, args=(0, k, v, idx)), threading.Thread(target=run, args=(1, k2, v2, idx2))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert np.array_equal(res[0], seq[0]) and np.array_equal(res[1], seq[1])


def test_one_index_from_several_threads():
    """Calls on one index from four Python threads (serialised by its mutex) equal the
    sequential ones (without the history, which would depend on the order of the calls)."""
    k, v, q = synthetic_cache(3000, 32, heads=2, seed=33, steps=1)
    idx = certattn.KeyIndex(k, v)
    expected = [certattn.attend(q[0], k, v, idx, seed=1, step=s, history=False)[0] for s in range(20)]
    got = {}

    def run(t):
        for s in range(t, 20, 4):
            got[s] = certattn.attend(q[0], k, v, idx, seed=1, step=s, threads=2, history=False)[0]

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(np.array_equal(got[s], expected[s]) for s in range(20))
