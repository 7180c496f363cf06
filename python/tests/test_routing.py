"""Routing from Python (routing, cost, the index's histories): on a flat cache the group's
heads outgrow their sample budget and are answered exactly, the history then routes the
next calls to the dense kernel and probes the sparse path again; every call equals the
C++ reference given the history as it was before the call, and every exact answer equals
exact attention. Deterministic (fixed caches, queries and seeds): these tests fail only on
a wrong decision or a wrong answer."""
import numpy as np
import pytest

import certattn
from conftest import synthetic_cache

EXACT_PATHS = {"no_pool", "fallback", "over_budget", "joined", "routed"}


def flat_cache(n=4096, d=64, heads=2, groups=4, steps=12, seed=41):
    """Nearly equal scores: keys 100x smaller than the queries, so every weight is within
    a few percent of the largest and a certificate needs a large share of the cache."""
    rng = np.random.default_rng(seed)
    k = (0.01 * rng.standard_normal((heads, n, d))).astype(np.float16)
    v = rng.standard_normal((heads, n, d)).astype(np.float16)
    q = rng.standard_normal((steps, heads, groups, d)).astype(np.float32)
    return k, v, q


def same_certs(a, b, fields=("certified", "exact", "path", "level", "heavy", "sampled")):
    return all(np.array_equal(a[f], b[f]) for f in fields)


def close(out, ref, tol=1e-5):
    norm = np.maximum(np.linalg.norm(ref, axis=-1), 1e-6)
    return bool((np.linalg.norm(out - ref, axis=-1) <= tol * norm).all())


def test_answer_paths_names():
    assert certattn.ANSWER_PATHS == ("sampled", "no_pool", "fallback", "over_budget", "joined", "routed")
    assert certattn.DEFAULT_COST == (0.6, 6.4, 2.0)
    certs = np.zeros(3, certattn.CERTIFICATE_DTYPE)
    certs["path"] = [0, 3, 5]
    assert list(certattn.path_names(certs)) == ["sampled", "over_budget", "routed"]


def test_flat_cache_goes_over_budget_then_is_routed_and_probed():
    model_only = {"measured": False}
    k, v, q = flat_cache()
    index = certattn.KeyIndex(k, v)
    paths = []
    for step in range(q.shape[0]):
        before = index.history_snapshot()
        # The model's schedule, independent of timing (cost "measured" off).
        out, certs = certattn.attend(q[step], k, v, index, seed=3, step=step, layer=1, cost=model_only)
        ref, rcerts = certattn.reference_attend(q[step], k, v, index, seed=3, step=step, layer=1, history=before,
                                                cost=model_only)
        assert same_certs(certs, rcerts), (step, certattn.path_names(certs), certattn.path_names(rcerts))
        assert close(out, ref), step
        names = certattn.path_names(certs)
        paths.append(names)
        exact = np.isin(names, list(EXACT_PATHS))
        assert np.array_equal(certs["exact"], exact)
        if exact.any():  # every exact answer is exact attention
            truth, _ = certattn.exact_attention(q[step], k, v)
            assert close(out[exact], truth[exact]), step
        routed = names == "routed"
        # certified by the float kernel's rounding bound (docs/certificate.md, "Rounding")
        assert certs["certified"][routed].all() and (certs["bound"][routed] <= 0.1).all()
    # Call 0: the sparse path outgrows the budget (the first head over budget, the others join).
    for h in range(2):
        assert paths[0][h][0] == "over_budget" and set(paths[0][h][1:]) == {"joined"}, paths[0]
    # Calls 1-4: routed to the dense kernel; call 5 probes the sparse path (and loses again);
    # the next probe waits 8 calls.
    for s in range(1, 5):
        assert (paths[s] == "routed").all(), (s, paths[s])
    assert not (paths[5] == "routed").any(), paths[5]
    for s in range(6, 12):
        assert (paths[s] == "routed").all(), (s, paths[s])
    snap = index.history_snapshot()
    assert snap.kv_heads == 2 and all(snap.routes_dense)
    # A new sequence: the history forgets the loss (with measured costs, the default, its
    # first call times the dense kernel: the dense probe).
    index.reset_history()
    assert all(index.history_snapshot().routes_dense)
    _, certs = certattn.attend(q[0], k, v, index, seed=3, step=100, layer=0, cost=model_only)
    assert not (certattn.path_names(certs) == "routed").any()
    index.reset_history()
    _, certs = certattn.attend(q[0], k, v, index, seed=3, step=100, layer=0)
    assert (certattn.path_names(certs) == "routed").all()


def test_routing_off_never_routes_nor_stops():
    k, v, q = flat_cache(steps=3)
    index = certattn.KeyIndex(k, v)
    for step in range(3):
        before = index.history_snapshot()
        out, certs = certattn.attend(q[step], k, v, index, seed=3, step=step, routing="off", layer=0)
        names = set(certattn.path_names(certs).ravel())
        assert names <= {"sampled", "fallback"}, names
        ref, rcerts = certattn.reference_attend(q[step], k, v, index, seed=3, step=step, routing="off",
                                                history=before)
        assert same_certs(certs, rcerts) and close(out, ref)


def test_hints_and_history_false_leave_the_history_alone():
    model_only = {"measured": False}  # the model's decisions (no dense probe)
    k, v, q = flat_cache(steps=3)
    index = certattn.KeyIndex(k, v)
    certattn.attend(q[0], k, v, index, seed=3, step=0, layer=0, cost=model_only)  # loses: the next call would be routed
    assert all(index.history_snapshot().routes_dense)
    for kw in (dict(history=False), dict(level_hints=np.full((2, 4), -1))):
        _, certs = certattn.attend(q[1], k, v, index, seed=3, step=1, cost=model_only, **kw)
        assert not (certattn.path_names(certs) == "routed").any(), kw
    _, certs = certattn.attend(q[1], k, v, index, seed=3, step=1, layer=0, cost=model_only)
    assert (certattn.path_names(certs) == "routed").all()


def test_group_size_change_recreates_the_histories():
    model_only = {"measured": False}  # the model's decisions (no dense probe)
    k, v, q = flat_cache(steps=2)
    index = certattn.KeyIndex(k, v)
    certattn.attend(q[0], k, v, index, seed=3, step=0, layer=0, cost=model_only)
    assert index.history_snapshot().levels[0] == [-1] * 4
    before = index.history_snapshot()
    out, certs = certattn.attend(q[1, :, :2], k, v, index, seed=3, step=1, layer=0,
                                 cost=model_only)  # G = 2: fresh histories
    assert not (certattn.path_names(certs) == "routed").any()
    ref, rcerts = certattn.reference_attend(q[1, :, :2], k, v, index, seed=3, step=1, history=before,
                                            cost=model_only)
    assert same_certs(certs, rcerts) and close(out, ref)
    assert len(index.history_snapshot().levels[0]) == 2


def test_history_carries_the_levels_of_a_focused_cache():
    """A focused cache on the sparse path (a cost model under which 3000 tokens are worth
    sampling: at the default one, the sparse path loses below the break-even): the history
    holds each head's last level, and the reference given the snapshot reproduces the
    hinted call."""
    k, v, q = synthetic_cache(3000, 64, heads=2, seed=3, focus=2.0, steps=3)
    index = certattn.KeyIndex(k, v)
    # The model's costs alone: with measured ones the first call would time the dense
    # kernel (the dense probe).
    kw = dict(seed=11, sequence=5, layer=0,
              cost={"fixed": 0.2, "per_key": 0.5, "give_up": 2.0, "measured": False})
    for step in range(3):
        before = index.history_snapshot()
        out, certs = certattn.attend(q[step], k, v, index, step=step, **kw)
        ref, rcerts = certattn.reference_attend(q[step], k, v, index, step=step, history=before, **kw)
        assert same_certs(certs, rcerts) and close(out, ref)
        assert (certattn.path_names(certs) == "sampled").all()
        assert index.history_snapshot().levels == certs["level"].tolist()


def test_sequence_separates_the_perturbations():
    k, v, q = synthetic_cache(3000, 64, seed=3, focus=1.5, steps=1)
    index = certattn.KeyIndex(k, v)
    a = certattn.attend(q[0], k, v, index, seed=11, history=False)
    b = certattn.attend(q[0], k, v, index, seed=11, sequence=0, history=False)
    c = certattn.attend(q[0], k, v, index, seed=11, sequence=7, history=False)
    assert np.array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])
    ref, rcerts = certattn.reference_attend(q[0], k, v, index, seed=11, sequence=7)
    assert same_certs(c[1], rcerts) and close(c[0], ref)


def test_cost_model_argument():
    k, v, q = flat_cache(steps=1, heads=1)
    k, v = k[0], v[0]
    index = certattn.KeyIndex(k, v)
    # A generous budget (give_up 50): the flat group certifies on the sparse path; the
    # same call as a dict; routing off equals it when the budget is not reached.
    kw = dict(seed=3, history=False)
    big = certattn.attend(q[0, 0], k, v, index, cost=(0.6, 6.4, 50.0), **kw)
    assert set(certattn.path_names(big[1])) <= {"sampled", "fallback"}
    as_dict = certattn.attend(q[0, 0], k, v, index, cost={"give_up": 50.0}, **kw)
    off = certattn.attend(q[0, 0], k, v, index, routing="off", **kw)
    assert np.array_equal(big[0], as_dict[0]) and np.array_equal(big[0], off[0])


@pytest.mark.parametrize("kwargs, exc", [
    (dict(routing="fast"), ValueError),
    (dict(routing=""), ValueError),
    (dict(routing=1), TypeError),
    (dict(cost=(1.0, 6.4, 2.0)), ValueError),      # fixed must lie in [0, 1)
    (dict(cost=(-0.1, 6.4, 2.0)), ValueError),
    (dict(cost=(0.6, 0.0, 2.0)), ValueError),      # per_key > 0
    (dict(cost=(0.6, float("inf"), 2.0)), ValueError),
    (dict(cost=(0.6, 6.4, 0.5)), ValueError),      # give_up >= 1
    (dict(cost=(0.6, 6.4, float("nan"))), ValueError),
    (dict(cost=(0.6, 6.4)), ValueError),
    (dict(cost={"fixd": 0.5}), ValueError),
    (dict(cost=(0.6, "x", 2.0)), TypeError),
    (dict(cost="fast"), TypeError),
    (dict(cost=2.0), TypeError),
    (dict(sequence=-1), ValueError),
    (dict(history="yes"), TypeError),
    (dict(history=True, level_hints=[-1] * 4), ValueError),
])
def test_bad_routing_arguments(kwargs, exc):
    k, v, q = synthetic_cache(300, 32, seed=2, steps=1)
    index = certattn.KeyIndex(k, v)
    with pytest.raises(exc):
        certattn.attend(q[0], k, v, index, **{"step": 0, "layer": 0, **kwargs})
    if "history" not in kwargs:
        with pytest.raises(exc):
            certattn.reference_attend(q[0], k, v, index, **kwargs)


def test_bad_reference_history():
    k, v, q = flat_cache(steps=1)
    index = certattn.KeyIndex(k, v)
    with pytest.raises(TypeError):
        certattn.reference_attend(q[0], k, v, index, history="snapshot")
    certattn.attend(q[0], k, v, index, step=0, layer=0)
    with pytest.raises(ValueError):  # a snapshot of 2 KV heads for a cache of one
        certattn.reference_attend(q[0, 0], k[0], v[0], None, history=index.history_snapshot())
    with pytest.raises(ValueError):
        certattn.reference_attend(q[0], k, v, index, history=index.history_snapshot(), level_hints=[-1] * 8)


def test_step_and_layer_are_required_with_histories():
    k, v, q = synthetic_cache(3000, 32, seed=2, focus=1.5, steps=1)
    index = certattn.KeyIndex(k, v)
    with pytest.raises(TypeError, match="step and layer"):
        certattn.attend(q[0], k, v, index)
    with pytest.raises(TypeError, match="layer must be given"):
        certattn.attend(q[0], k, v, index, step=0)
    certattn.attend(q[0], k, v, index, history=False)  # a one-off call: both default to 0


def test_repeated_step_gets_no_hints_from_itself():
    k, v, q = synthetic_cache(16384, 32, seed=4, focus=1.5, steps=1)
    index = certattn.KeyIndex(k, v)
    kw = dict(seed=5, layer=2, routing="off")
    for step in (3, 4):
        certattn.attend(q[0], k, v, index, step=step, **kw)
    certattn.attend(q[0], k, v, index, step=5, **kw)
    again, again_certs = certattn.attend(q[0], k, v, index, step=5, **kw)  # a retried step
    plain, plain_certs = certattn.attend(q[0], k, v, index, step=5, history=False, **kw)
    assert np.array_equal(again, plain)
    assert np.array_equal(again_certs["level"], plain_certs["level"])
    assert np.array_equal(again_certs["bound"], plain_certs["bound"])
