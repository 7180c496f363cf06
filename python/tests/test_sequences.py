"""Shared prefixes in one call (attend_sequences): the fast path against its reference, each
sequence's certificate against exact attention over its whole cache, the dense baseline,
and the arguments it refuses.

Every random input comes from a fixed seed; the statistical test states the probability
with which it would fail under the guarantee."""
import numpy as np
import pytest

import certattn
from conftest import synthetic_cache


def same_certs(a, b, fields=("certified", "exact", "level", "heavy", "sampled")):
    return all(np.array_equal(a[f], b[f]) for f in fields)


def shared_prefix(prefix, tails, d=64, heads=2, groups=4, seed=0, dtype=np.float16):
    """A prefix cache k, v [heads, prefix, d], each sequence's own tokens [heads, tails[s], d]
    and queries [S, heads, groups, d] aligned with keys of the whole cache."""
    S = len(tails)
    k, v, q = synthetic_cache(prefix + sum(tails), d, heads=heads, seed=seed, dtype=dtype, focus=2.0, groups=groups,
                              steps=S)
    own_k, own_v, at = [], [], prefix
    for t in tails:
        own_k.append(np.ascontiguousarray(k[:, at:at + t]))
        own_v.append(np.ascontiguousarray(v[:, at:at + t]))
        at += t
    return np.ascontiguousarray(k[:, :prefix]), np.ascontiguousarray(v[:, :prefix]), own_k, own_v, q


@pytest.mark.parametrize("fmt", ["float16", "q8_0"])
def test_sequences_equal_reference(fmt):
    """Three sequences with own tails of 1, 70 and 300 tokens over a 3000-token prefix, three
    steps with the previous step's levels as hints: the same samples and certificates as
    the reference, outputs within the audit's tolerance."""
    k, v, own_k, own_v, q = shared_prefix(3000, [1, 70, 300], seed=5)
    if fmt == "q8_0":
        k, v = certattn.quantize(k, "q8_0").view(certattn.BLOCK_Q8_0), certattn.quantize(v, "q8_0").view(
            certattn.BLOCK_Q8_0)
        own_k = [certattn.quantize(x, "q8_0").view(certattn.BLOCK_Q8_0) for x in own_k]
        own_v = [certattn.quantize(x, "q8_0").view(certattn.BLOCK_Q8_0) for x in own_v]
        k, v = k.reshape(2, 3000, 2), v.reshape(2, 3000, 2)
        own_k = [x.reshape(2, -1, 2) for x in own_k]
        own_v = [x.reshape(2, -1, 2) for x in own_v]
    index = certattn.KeyIndex(k, v)
    ids = [11, 12, 13]
    hints = None
    for step in range(3):
        qs = q + np.float32(0.01 * step)
        out, certs = certattn.attend_sequences(qs, k, v, index, own_k, own_v, sequences=ids, eps=0.1, seed=7,
                                               step=step, layer=1, level_hints=hints, history=False)
        ref, rcerts = certattn.reference_attend_sequences(qs, k, v, index, own_k, own_v, sequences=ids, eps=0.1,
                                                          seed=7, step=step, layer=1, level_hints=hints)
        assert out.shape == (3, 2, 4, 64) and certs.shape == (3, 2, 4)
        assert same_certs(certs, rcerts), (certs, rcerts)
        assert np.array_equal(certs["max_score"], rcerts["max_score"])
        norm = np.maximum(np.linalg.norm(ref, axis=-1), 1e-6)
        assert (np.linalg.norm(out - ref, axis=-1) <= 1e-5 * norm).all()
        hints = certs["level"]


def test_sequences_each_within_its_certificate():
    """Four sequences of a layer (2 KV heads, G = 4) with tails of 8 to 200 tokens: each
    answer within its certificate of exact attention over the prefix followed by the
    sequence's own tokens. delta = 1e-9 per head: 32 certified answers fail together with
    probability < 4e-8. The dense baseline equals the dense kernel over each joined cache,
    and one array with a leading axis of sequences is taken as the list of its entries."""
    tails = [8, 50, 120, 200]
    k, v, own_k, own_v, q = shared_prefix(6000, tails, seed=9)
    index = certattn.KeyIndex(k, v)
    out, certs = certattn.attend_sequences(q, k, v, index, own_k, own_v, sequences=[1, 2, 3, 4], eps=0.1,
                                           delta=1e-9, seed=3, step=4, layer=0, routing="off")
    dense = certattn.dense_attend_sequences(q, k, v, own_k, own_v)
    for s in range(len(tails)):
        kj, vj = np.concatenate([k, own_k[s]], axis=1), np.concatenate([v, own_v[s]], axis=1)
        exact, info = certattn.exact_attention(q[s], kj, vj)
        err = np.linalg.norm(out[s] - exact, axis=-1)
        beta = np.where(certs[s]["exact"], 1e-5 * info["value_scale"], certs[s]["beta"])
        assert (certs[s]["certified"] | certs[s]["exact"]).all()
        assert (err <= beta + 1e-6 * info["value_scale"]).all(), (s, err, beta)
        assert np.allclose(dense[s], certattn.dense_attend(q[s], kj, vj), atol=1e-4)
    # The pool is the prefix's: the keys read include every own token of every sequence.
    assert (certs["keys_read"] >= np.array(tails)[:, None, None]).all()
    # Equal tails: one array [S, heads, n, d] is its list of entries.
    k, v, own_k, own_v, q = shared_prefix(2000, [30, 30], seed=2)
    index = certattn.KeyIndex(k, v)
    a = certattn.attend_sequences(q, k, v, index, own_k, own_v, sequences=[5, 6], step=1, layer=0, history=False)
    b = certattn.attend_sequences(q, k, v, index, np.stack(own_k), np.stack(own_v), sequences=[5, 6], step=1, layer=0,
                                  history=False)
    assert np.array_equal(a[0], b[0]) and same_certs(a[1], b[1])


def test_sequences_one_kv_head_and_torch():
    """A single KV head's caches [n, d] with q [S, G, d]; torch tensors in, a torch tensor
    out, equal to the NumPy call."""
    torch = pytest.importorskip("torch")
    k, v, own_k, own_v, q = shared_prefix(2500, [3, 40], heads=2, seed=4)
    k, v, own_k, own_v, q = k[0], v[0], [x[0] for x in own_k], [x[0] for x in own_v], q[:, 0]
    index = certattn.KeyIndex(k, v)
    out, certs = certattn.attend_sequences(q, k, v, index, own_k, own_v, sequences=[1, 2], step=3, layer=2,
                                           kv_head=5, history=False)
    assert out.shape == (2, 4, 64) and certs.shape == (2, 4)
    ref, rcerts = certattn.reference_attend_sequences(q, k, v, index, own_k, own_v, sequences=[1, 2], step=3,
                                                      layer=2, kv_head=5)
    assert same_certs(certs, rcerts)
    t_out, t_certs = certattn.attend_sequences(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), index,
                                               [torch.from_numpy(x) for x in own_k],
                                               [torch.from_numpy(x) for x in own_v], sequences=[1, 2], step=3,
                                               layer=2, kv_head=5, history=False)
    assert isinstance(t_out, torch.Tensor) and np.array_equal(t_out.numpy(), out) and same_certs(t_certs, certs)


def test_sequences_keep_a_history_each():
    """The index keeps a routing history per sequence id: over 8 steps a sequence whose
    queries are flat (every key equally likely: over budget, then routed) and one whose
    queries are focused (sampled) each follow their own history, every step equal to the
    reference given snapshots of the histories taken before it (cost model only, so that
    the decisions do not depend on timing)."""
    model_only = {"measured": False}
    k, v, own_k, own_v, q = shared_prefix(3000, [5, 40], seed=6)
    q[0] = 0.0  # sequence 10: flat attention
    index = certattn.KeyIndex(k, v)
    ids = [10, 11]
    paths = []
    for step in range(8):
        before = [index.history_snapshot(sequence=i) for i in ids]
        out, certs = certattn.attend_sequences(q, k, v, index, own_k, own_v, sequences=ids, seed=2, step=step,
                                               layer=3, cost=model_only)
        ref, rcerts = certattn.reference_attend_sequences(q, k, v, index, own_k, own_v, sequences=ids, seed=2,
                                                          step=step, layer=3, cost=model_only, history=before)
        assert same_certs(certs, rcerts), (step, certattn.path_names(certs), certattn.path_names(rcerts))
        norm = np.maximum(np.linalg.norm(ref, axis=-1), 1e-6)
        assert (np.linalg.norm(out - ref, axis=-1) <= 1e-5 * norm).all()
        paths.append(certattn.path_names(certs))
        # Each history holds its own sequence's levels; attend()'s history is untouched.
        assert index.history_snapshot(sequence=11).levels == certs[1]["level"].tolist()
        assert index.history_snapshot().kv_heads == 0
    assert (paths[0][0] == "over_budget").any() and all((p[0] == "routed").all() for p in paths[1:5])
    assert not any((p[1] == "routed").any() for p in paths) and (paths[-1][1] == "sampled").any()
    assert all(index.history_snapshot(sequence=10).routes_dense)
    # Forgetting one sequence leaves the other's; a sequence never seen has none.
    index.reset_history(sequence=10)
    assert index.history_snapshot(sequence=10).kv_heads == 0 and index.history_snapshot(sequence=11).kv_heads == 2
    index.reset_history()
    assert index.history_snapshot(sequence=11).kv_heads == 0
    # The reference takes one snapshot per sequence, never with level hints.
    with pytest.raises(ValueError, match="history: 1 snapshots for 2 sequences"):
        certattn.reference_attend_sequences(q, k, v, index, own_k, own_v, sequences=ids, history=before[:1])
    with pytest.raises(TypeError, match="one per sequence"):
        certattn.reference_attend_sequences(q, k, v, index, own_k, own_v, sequences=ids, history=before[0])
    with pytest.raises(ValueError, match="exclude each other"):
        certattn.reference_attend_sequences(q, k, v, index, own_k, own_v, sequences=ids, history=before,
                                            level_hints=np.zeros((2, 2, 4), np.int32))
    with pytest.raises(ValueError, match="exclude each other"):
        certattn.attend_sequences(q, k, v, index, own_k, own_v, sequences=ids, step=9, layer=3, history=True,
                                  level_hints=np.zeros((2, 2, 4), np.int32))


def test_sequences_refuse_bad_arguments():
    k, v, own_k, own_v, q = shared_prefix(1500, [10, 20], seed=1)
    index = certattn.KeyIndex(k, v)
    call = lambda **kw: certattn.attend_sequences(**{**dict(q=q, k=k, v=v, index=index, own_k=own_k, own_v=own_v,
                                                            sequences=[1, 2], step=0, layer=0), **kw})
    call()
    with pytest.raises(ValueError, match="ids must differ"):
        call(sequences=[4, 4])
    with pytest.raises(ValueError, match="2 ids for 3 sequences|3 ids for 2 sequences"):
        call(sequences=[1, 2, 3])
    with pytest.raises(ValueError, match="leading axis of sequences=2"):
        call(q=q[:1])
    with pytest.raises(ValueError, match="same number"):
        call(own_v=own_v[:1])
    with pytest.raises(TypeError, match=r"own_k\[1\], own_v\[1\]: dtypes"):
        call(own_k=[own_k[0], own_k[1].astype(np.float32)], own_v=[own_v[0], own_v[1].astype(np.float32)])
    with pytest.raises(ValueError, match=r"own_k\[0\]: kv_heads and head_dim"):
        call(own_k=[own_k[0][:, :, :32], own_k[1]], own_v=[own_v[0][:, :, :32], own_v[1]])
    with pytest.raises(ValueError, match=r"own_k\[0\]: the cache is empty"):
        call(own_k=[own_k[0][:, :0], own_k[1]], own_v=[own_v[0][:, :0], own_v[1]])
    with pytest.raises(TypeError, match="step"):
        certattn.attend_sequences(q, k, v, index, own_k, own_v, sequences=[1, 2], layer=0)
    with pytest.raises(ValueError, match="level_hints: 3 values for 16 query heads"):
        call(level_hints=[0, 0, 0])
    # The index holds the prefix's tokens, not the sequences': one appended to is refused.
    longer = certattn.KeyIndex(np.concatenate([k, own_k[0]], axis=1), np.concatenate([v, own_v[0]], axis=1))
    with pytest.raises(ValueError, match="index holds 1510 tokens, the prefix cache 1500"):
        call(index=longer)
