"""certattn: certified sparse attention on CPU, for NumPy arrays and PyTorch CPU tensors.

The cache is read in place, never copied: a NumPy array through the buffer it owns, a torch
tensor through ``Tensor.numpy()`` (a view of the same memory; bfloat16 through a uint16
view). Its last axis (head_dim) must be contiguous; token and head strides are free.

    import certattn
    index = certattn.KeyIndex(k, v)              # k, v [n, d] or [kv_heads, n, d]
    out, certs = certattn.attend(q, k, v, index, eps=0.1, seed=7, step=0, layer=0)
    certs["certified"], certs["bound"], certs["keys_read"]

See docs/python.md.
"""
from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from . import _core

__all__ = [
    "KeyIndex", "attend", "dense_attend", "exact_attention", "reference_attend", "attend_sequences",
    "dense_attend_sequences", "reference_attend_sequences", "audit",
    "AuditReport", "CERTIFICATE_DTYPE", "EXACT_DTYPE", "ANSWER_PATHS", "DEFAULT_COST", "path_names",
    "active_isa", "quantize", "BLOCK_Q8_0", "BLOCK_Q4_0", "FP8_E4M3", "FP8_E5M2",
]

# --- quantized caches ----------------------------------------------------------------------
#: ggml's block_q8_0 (llama.cpp's ``--cache-type-k q8_0``): an fp16 scale d and 32 int8
#: codes, channel i = d * qs[i]. 34 bytes; a cache row holds head_dim / 32 blocks, so a
#: cache array is [n, head_dim // 32] (or [kv_heads, n, head_dim // 32]) of this dtype.
BLOCK_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", (32,))])
#: ggml's block_q4_0: an fp16 scale d and 16 bytes of nibbles, channel i < 16 = d * (low
#: nibble of qs[i] - 8), channel 16 + i = d * (its high nibble - 8). 18 bytes.
BLOCK_Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
#: fp8 codes as vLLM stores them (torch.float8_e4m3fn, float8_e5m2): one byte per channel,
#: a cache array [n, head_dim] of this dtype; the layer's k_scale and v_scale are passed
#: as ``kv_scales=(k_scale, v_scale)`` (default 1, 1). A uint8 array is viewed as one with
#: ``u8.view(certattn.FP8_E4M3)`` (no copy); a torch float8 tensor is taken as it is.
FP8_E4M3 = np.dtype([("e4m3", "u1")])
FP8_E5M2 = np.dtype([("e5m2", "u1")])
_FORMATS = {"q8_0": BLOCK_Q8_0, "q4_0": BLOCK_Q4_0, "fp8_e4m3": FP8_E4M3, "fp8_e5m2": FP8_E5M2}


def quantize(x, format: str, scale: float = 1.0) -> np.ndarray:
    """x [..., head_dim] (float) stored in a quantized format: an array [..., head_dim // 32]
    of BLOCK_Q8_0 or BLOCK_Q4_0 (ggml's quantize_row rounding), or [..., head_dim] of
    FP8_E4M3 or FP8_E5M2 (round to nearest even of x / scale; e4m3 saturates). For tests
    and for building a cache in the format an engine keeps."""
    if format not in _FORMATS:
        raise ValueError(f"format: expected one of {sorted(_FORMATS)}, got {format!r}")
    xf = _queries(x, "x")
    if xf.ndim < 1:
        raise ValueError("x: expected [..., head_dim]")
    raw = _core.quantize(xf, format, _real(scale, "scale"))
    dt = _FORMATS[format]
    return raw.view(dt).reshape(xf.shape[:-1] + (raw.shape[1] // dt.itemsize,))


def _kv_scales(kv_scales) -> tuple[float, float]:
    if kv_scales is None:
        return (1.0, 1.0)
    try:
        ks, vs = kv_scales
    except (TypeError, ValueError):
        raise TypeError(f"kv_scales: expected (k_scale, v_scale), got {kv_scales!r}") from None
    return (_real(ks, "kv_scales"), _real(vs, "kv_scales"))

#: The record of one certificate (one query head): the fields of certattn::certificate
#: (certified, exact, path, level, tau, bound, beta, scale_value, max_score, denominator,
#: heavy, sampled, keys_read, values_read, bytes_read), laid out as the C++ record.
CERTIFICATE_DTYPE = _core.CERTIFICATE_DTYPE
#: The names of certattn::answer_path, indexed by a certificate's ``path`` field: which path
#: answered the head ("sampled", "no_pool", "fallback", "over_budget", "joined", "routed").
ANSWER_PATHS: tuple[str, ...] = tuple(_core.ANSWER_PATHS)


def path_names(certs) -> np.ndarray:
    """The names of ``certs["path"]`` (ANSWER_PATHS), an array of str in the same shape."""
    return np.asarray(ANSWER_PATHS, dtype=object)[np.asarray(certs["path"], dtype=np.intp)]
#: What exact_attention reports beside the output, per query head.
EXACT_DTYPE = _core.EXACT_DTYPE


def active_isa() -> str:
    """The kernels the library dispatched to on this machine (avx512_vnni, avx2, scalar)."""
    return _core.active_isa()


# --- arguments ---------------------------------------------------------------------------

def _is_torch(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _cache(x: Any, name: str) -> np.ndarray:
    """A cache argument as an ndarray over the same memory (no copy)."""
    if isinstance(x, np.ndarray):
        if x.dtype.byteorder == ">":
            raise TypeError(f"{name}: big-endian data is not supported")
        return x
    if _is_torch(x):
        import torch
        if x.device.type != "cpu":
            raise ValueError(f"{name}: tensor on {x.device}; certattn reads CPU memory (use .cpu())")
        t = x.detach()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16)
        if t.dtype in (torch.float16, torch.float32):
            return t.numpy()
        for fp8, dt in (("float8_e4m3fn", FP8_E4M3), ("float8_e5m2", FP8_E5M2)):  # torch >= 2.1
            if getattr(torch, fp8, None) is not None and t.dtype == getattr(torch, fp8):
                return t.view(torch.uint8).numpy().view(dt)
        raise TypeError(f"{name}: dtype {t.dtype} is not supported (float16, bfloat16, float32, float8)")
    raise TypeError(f"{name}: expected a numpy.ndarray or a torch.Tensor, got {type(x).__name__}")


def _queries(q: Any, name: str = "q") -> np.ndarray:
    """Queries as float32 (a small copy when they are another dtype)."""
    if _is_torch(q):
        import torch
        if q.device.type != "cpu":
            raise ValueError(f"{name}: tensor on {q.device}; use .cpu()")
        if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise TypeError(f"{name}: dtype {q.dtype} is not supported")
        q = q.detach().to(torch.float32).contiguous().numpy()
    elif isinstance(q, np.ndarray):
        if q.dtype == np.float32 and q.flags.c_contiguous:
            return q
        if q.dtype == np.uint16:  # bfloat16 bits
            q = (q.astype(np.uint32) << 16).view(np.float32)
        elif q.dtype.kind != "f":
            raise TypeError(f"{name}: dtype {q.dtype} is not supported (float16, float32, float64, uint16 bfloat16)")
        q = np.ascontiguousarray(q, dtype=np.float32)
    else:
        raise TypeError(f"{name}: expected a numpy.ndarray or a torch.Tensor, got {type(q).__name__}")
    return q  # NaN and Inf are refused by the C++ side (attend_group, exact_attention, audit)


def _count(x: Any, name: str, lo: int = 0, hi: int = 2**64 - 1) -> int:
    if isinstance(x, bool):
        raise TypeError(f"{name} must be an integer, got bool")
    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(x).__name__}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{name} = {v} is out of range ({lo} .. {hi})")
    return v


def _real(x: Any, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    return float(x)


@functools.lru_cache(maxsize=64)
def _options_cached(*args):
    return _core.Options(*args)


_COST_FIELDS = ("fixed", "per_key", "give_up")
#: certattn::cost_model's defaults (options.cost): (fixed, per_key, give_up).
DEFAULT_COST: tuple[float, float, float] = tuple(_core.DEFAULT_COST)


def _cost(cost) -> tuple[float, float, float]:
    """cost: None (the defaults), a (fixed, per_key, give_up) sequence, or a dict of some of
    those keys and "measured" (the others keep their defaults)."""
    if cost is None:
        return DEFAULT_COST
    if isinstance(cost, dict):
        unknown = sorted(str(key) for key in cost if key not in _COST_FIELDS and key != "measured")
        if unknown:
            raise ValueError(f"cost: unknown key(s) {', '.join(unknown)} "
                             "(expected fixed, per_key, give_up, measured)")
        values = dict(zip(_COST_FIELDS, DEFAULT_COST))
        values.update((k, v) for k, v in cost.items() if k != "measured")
        return tuple(_real(values[f], f"cost.{f}") for f in _COST_FIELDS)
    if isinstance(cost, (str, bytes)) or not hasattr(cost, "__len__"):
        raise TypeError(f"cost must be None, a (fixed, per_key, give_up) tuple or a dict, got {type(cost).__name__}")
    if len(cost) != 3:
        raise ValueError(f"cost: expected 3 values (fixed, per_key, give_up), got {len(cost)}")
    return tuple(_real(c, f"cost.{f}") for c, f in zip(cost, _COST_FIELDS))


def _cost_measured(cost) -> bool:
    """cost["measured"] (default True): route on measured costs once a history has timed a
    dense call (C++ cost_model::measured); False routes on the cost model alone."""
    if not isinstance(cost, dict) or "measured" not in cost:
        return True
    if not isinstance(cost["measured"], bool):
        raise TypeError(f"cost.measured must be a bool, got {type(cost['measured']).__name__}")
    return cost["measured"]


def _options(eps, delta, scale, certificate, window, grid_ratio, max_levels, grid_top, softmax_scale, seed,
             routing="auto", cost=None):
    for v, n in ((scale, "scale"), (certificate, "certificate"), (routing, "routing")):
        if not isinstance(v, str):
            raise TypeError(f"{n} must be a string, got {type(v).__name__}")
    return _options_cached(
        _real(eps, "eps"), _real(delta, "delta"), scale, certificate, _count(window, "window"),
        _count(grid_ratio, "grid_ratio", 0, 2**31 - 1), _count(max_levels, "max_levels", 0, 2**31 - 1),
        _count(grid_top, "grid_top", 0, 2**31 - 1), _real(softmax_scale, "softmax_scale"), _count(seed, "seed"),
        routing, *_cost(cost), _cost_measured(cost))


def _head_values(x, name: str, heads: int) -> list[float]:
    """A per-query-head float array (alibi_slopes, sinks): one finite value per query head."""
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if a.size != heads:
        raise ValueError(f"{name}: {a.size} values for {heads} query heads (one per query head, in q's order)")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains a NaN or Inf")
    return [float(v) for v in a]


def _variant(softcap, alibi_slopes, sinks, sliding_window, heads: int):
    """The call's attention variant (C++ attention_variant), or None for plain attention."""
    if softcap is None and alibi_slopes is None and sinks is None and sliding_window is None:
        return None
    cap = 0.0
    if softcap is not None:
        cap = _real(softcap, "softcap")
        if not cap > 0.0:
            raise ValueError(f"softcap must be > 0 (None: no soft-cap), got {cap}")
    window = 0
    if sliding_window is not None:
        window = _count(sliding_window, "sliding_window")
        if window == 0:
            raise ValueError("sliding_window must be > 0 (None: every token attends)")
    slopes = [] if alibi_slopes is None else _head_values(alibi_slopes, "alibi_slopes", heads)
    sink_values = [] if sinks is None else _head_values(sinks, "sinks", heads)
    return _core.Variant(cap, window, slopes, sink_values)


def _group_queries(q: np.ndarray, k: np.ndarray, name: str = "q") -> tuple[np.ndarray, tuple[int, ...]]:
    """q as [kv_heads, group, d] for the cache k, and the shape the result takes."""
    d = k.shape[-1] * (32 if k.dtype in (BLOCK_Q8_0, BLOCK_Q4_0) else 1)  # a block holds 32 channels
    if q.shape[-1:] != (d,):
        raise ValueError(f"{name}: last dimension {q.shape[-1] if q.ndim else None} != head_dim {d}")
    if k.ndim == 2:  # one KV head: q [d] or [G, d]
        if q.ndim == 1:
            return q.reshape(1, 1, d), (d,)
        if q.ndim == 2:
            return q.reshape(1, q.shape[0], d), q.shape
        raise ValueError(f"{name}: expected [head_dim] or [group, head_dim] for a cache [n, d], got {q.shape}")
    if k.ndim == 3:  # a layer: q [H, G, d] or [n_heads, d] (query head h*G + g of KV head h)
        H = k.shape[0]
        if q.ndim == 3 and q.shape[0] == H:
            return q, q.shape
        if q.ndim == 2 and q.shape[0] % H == 0 and q.shape[0] > 0:
            return q.reshape(H, q.shape[0] // H, d), q.shape
        raise ValueError(f"{name}: expected [kv_heads={H}, group, head_dim] or [n_heads, head_dim] with n_heads a "
                         f"multiple of {H} for a cache [kv_heads, n, d], got {list(q.shape)}")
    raise ValueError(f"k: expected [n_tokens, head_dim] or [kv_heads, n_tokens, head_dim], got {k.ndim} dimensions")


def _position_queries(q: np.ndarray, k: np.ndarray, positions: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """q [positions, ...] (each position's queries shaped as _group_queries takes them) as
    [kv_heads, positions * group, d], and the shape of one position's result."""
    if isinstance(positions, bool) or not isinstance(positions, (int, np.integer)) or positions < 1:
        raise ValueError(f"positions must be an integer >= 1, got {positions!r}")
    if positions == 1:
        return _group_queries(q, k)
    if q.ndim < 2 or q.shape[0] != positions:
        raise ValueError(f"q: expected a leading axis of positions={positions}, got shape {list(q.shape)}")
    return _stacked_queries(q, k, positions)


def _stacked_queries(q: np.ndarray, k: np.ndarray, count: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """q [count, ...] (each entry shaped as _group_queries takes it) as [kv_heads, count *
    group, d], and the shape of one entry's result."""
    parts = [_group_queries(q[i], k) for i in range(count)]
    q4 = np.stack([x for x, _ in parts], axis=1)  # [kv_heads, count, group, d]
    return np.ascontiguousarray(q4.reshape(q4.shape[0], -1, q4.shape[-1])), parts[0][1]


def _stacked_result(x: np.ndarray, count: int, shape: tuple[int, ...]) -> np.ndarray:
    """A result [kv_heads, count * group, ...] in the caller's layout: [count, *shape]."""
    x = x.reshape((x.shape[0], count, -1) + x.shape[2:]).swapaxes(0, 1)
    return np.ascontiguousarray(x).reshape((count,) + shape)


def _position_result(x: np.ndarray, positions: int, shape: tuple[int, ...]) -> np.ndarray:
    """A result [kv_heads, positions * group, ...] in the caller's layout: [positions, *shape]
    (shape itself for one position)."""
    return x.reshape(shape) if positions == 1 else _stacked_result(x, positions, shape)


def _level_hints(level_hints, heads: int) -> np.ndarray:
    """The previous step's levels, checked: integers >= -1, one per query head."""
    hints = np.asarray(level_hints)
    if hints.dtype.kind not in "iu":
        raise TypeError(f"level_hints must hold integers, got {hints.dtype}")
    if hints.size != heads:
        raise ValueError(f"level_hints: {hints.size} values for {heads} query heads")
    if hints.size and (hints.min() < -1 or hints.max() > 2**31 - 1):
        raise ValueError("level_hints: levels are >= -1")
    return hints


def _like(x: np.ndarray, template: Any):
    if _is_torch(template):
        import torch
        return torch.from_numpy(x)
    return x


# --- the index -----------------------------------------------------------------------------

class KeyIndex:
    """The key index of one KV head (built from k, v [n, d]) or of a layer ([kv_heads, n, d]).

    Build it after prefill; call ``append(k, v)`` when the cache holds new tokens (k and v
    then hold every token so far: the tokens beyond ``len(index)`` are indexed) and
    ``truncate(k, v, n)`` to drop rejected draft tokens. The index keeps no reference to
    the cache: pass the same buffers (with the tokens so far) to every call. ``reserve`` is
    the longest sequence expected (no reallocation below it). Calls on one index are
    serialised; indices of different layers can be used from different threads.

    The index also keeps one routing history (certattn::group_history) per KV head, which
    ``attend`` uses unless given ``level_hints`` or ``history=False``: the heads' last
    stopping levels (the hints) and whether the group's last sparse call lost to the dense
    kernel (docs/python.md, "Routing"). They are created for the group size of the first
    such call and recreated when it changes; call ``reset_history()`` for a new sequence.
    An index of a shared prefix keeps one such history per sequence id of
    ``attend_sequences`` calls as well.
    """

    def __init__(self, k, v, *, reserve: int = 0, threads: int = 1, kv_scales=None):
        kc, vc = _cache(k, "k"), _cache(v, "v")
        self._core = _core.KeyIndex(kc, vc, _count(reserve, "reserve"), _count(threads, "threads"),
                                    _kv_scales(kv_scales))

    def append(self, k, v, *, threads: int = 1, kv_scales=None) -> None:
        """Index the tokens of k, v beyond len(self) (k, v hold all tokens so far)."""
        self._core.append(_cache(k, "k"), _cache(v, "v"), _count(threads, "threads"), _kv_scales(kv_scales))

    def truncate(self, k, v, n: int, *, kv_scales=None) -> None:
        """Keep the first n tokens (the index equals one built on them); k, v hold >= n tokens."""
        self._core.truncate(_cache(k, "k"), _cache(v, "v"), _count(n, "n"), _kv_scales(kv_scales))

    def reserve(self, tokens: int) -> None:
        self._core.reserve(_count(tokens, "tokens"))

    def reset_history(self, sequence: int | None = None) -> None:
        """Forget the routing histories (levels, costs, probes): all of them (a new
        sequence), or those ``attend_sequences`` keeps for one sequence id (a sample
        that ended: its histories are freed)."""
        self._core.reset_history(None if sequence is None else _count(sequence, "sequence"))

    def history_snapshot(self, sequence: int | None = None):
        """The routing histories as they are now, an opaque object: ``attend``'s (no
        sequence), to pass as ``reference_attend(..., history=)``, or those
        ``attend_sequences`` keeps for one sequence id, to pass (one per sequence) as
        ``reference_attend_sequences(..., history=)``; either reproduces the next call made
        with them. ``.levels`` and ``.routes_dense`` (under routing "auto") show them."""
        return self._core.history_snapshot(None if sequence is None else _count(sequence, "sequence"))

    def __len__(self) -> int:
        return self._core.size

    @property
    def kv_heads(self) -> int:
        return self._core.kv_heads

    @property
    def head_dim(self) -> int:
        return self._core.head_dim

    @property
    def dtype(self) -> str:
        return self._core.dtype

    @property
    def memory_bytes(self) -> int:
        return self._core.memory_bytes

    def __repr__(self) -> str:
        shape = f"{self.kv_heads} KV heads, " if self._core.layer else ""
        return f"KeyIndex({shape}{len(self)} tokens, head_dim {self.head_dim}, {self.dtype})"


# --- calls ---------------------------------------------------------------------------------

def _use_history(history, level_hints) -> bool:
    """Whether a call uses the index's routing histories: ``history`` None (then unless
    ``level_hints`` is given), True or False."""
    if history is not None and not isinstance(history, bool):
        raise TypeError(f"history must be None, True or False, got {type(history).__name__}")
    if history is True and level_hints is not None:
        raise ValueError("level_hints and history=True exclude each other (the history carries the hints)")
    return level_hints is None and history is not False


def attend(q, k, v, index: KeyIndex, *, eps: float = 0.1, delta: float = 0.05, scale: str = "value_scale",
           certificate: str = "tight", softmax_scale: float = 0.0, seed: int = 0, step: int | None = None,
           layer: int | None = None, kv_head: int = 0, sequence: int = 0, level_hints=None, history=None,
           routing: str = "auto", cost=None, window: int = 64, grid_ratio: int = 2, max_levels: int = 32,
           grid_top: int = 6, threads: int = 1, out=None, softcap=None, alibi_slopes=None, sinks=None,
           sliding_window=None, positions: int = 1, kv_scales=None):
    """Certified attention of one decoding step.

    One group: k, v [n, d] (one KV head), q [G, d] (or [d]); kv_head names the head in the
    perturbation key. A layer: k, v [kv_heads, n, d], q [kv_heads, G, d] or [n_heads, d]
    (query head h*G + g belongs to KV head h); ``threads`` KV heads run in parallel.
    q is unscaled (softmax_scale 0 means 1/sqrt(head_dim)). ``seed`` is fixed before
    generation, ``step`` advances every call (docs/integration.md, "Perturbation seeds and steps");
    ``layer`` names the layer (one id per layer); ``sequence`` separates concurrent sequences
    under one seed (0: none). ``step`` and ``layer`` are required when the call uses the
    index's histories (the default): a default step would repeat the perturbations of every
    call of a decode loop, and one layer id for every layer would reuse them across layers
    (docs/python.md, "Steps, layers and histories"). Without a history they default to 0.

    ``routing``: "auto" (default) answers exactly where the sparse path would cost more than
    the dense kernel; "off" always samples. ``cost``: the cost model's (fixed, per_key,
    give_up), as a tuple or a dict; None for the defaults (DEFAULT_COST).
    ``history``: None (default) uses the index's routing histories unless ``level_hints``
    is given; False uses neither (no hints, no routing across calls); True requires them.
    ``level_hints``: None, or the previous step's ``certs["level"]`` of this layer (then no
    history is used or updated).

    The attention variants of current models (docs/integration.md, "Model families"):
    ``softcap`` (s = cap tanh(s / cap), Gemma 2: 50), ``alibi_slopes`` (one slope m per
    query head, s_i += m (i - (n - 1))), ``sinks`` (one logit per query head in the
    denominator, gpt-oss) and ``sliding_window`` (only the newest W tokens attend); None
    (default): off.

    ``positions`` (speculative verification, docs/integration.md): q gets a leading axis of
    that many query positions, position p being the query of token n - positions + p, whose
    tokens k, v and the index already hold; each attends the tokens up to its own, with its
    own perturbations and certificates, and the index is scanned once for all of them
    (attend_positions). ``out`` and ``level_hints`` are then not taken.

    Returns ``(out, certs)``: out float32 in q's shape (a torch tensor when q is one),
    certs a structured array (CERTIFICATE_DTYPE) with one record per query head.
    """
    kc, vc = _cache(k, "k"), _cache(v, "v")
    if not isinstance(index, KeyIndex):
        raise TypeError(f"index must be a certattn.KeyIndex, got {type(index).__name__}")
    qf = _queries(q)
    if positions != 1 and (out is not None or level_hints is not None):
        raise ValueError("positions > 1 takes neither out nor level_hints")
    q3, shape = _position_queries(qf, kc, positions)
    heads = q3.shape[0] * q3.shape[1] // positions
    opt = _options(eps, delta, scale, certificate, window, grid_ratio, max_levels, grid_top, softmax_scale, seed,
                   routing, cost)
    use_history = _use_history(history, level_hints)
    if use_history and (step is None or layer is None):
        missing = " and ".join(name for name, value in (("step", step), ("layer", layer)) if value is None)
        raise TypeError(f"attend: {missing} must be given when the call uses the index's histories (the default): "
                        "the step advances every decoding step and each layer has its own id, so that no call "
                        "reuses the perturbations its hints came from; pass history=False for a one-off call")
    step = 0 if step is None else step
    layer = 0 if layer is None else layer
    hints = None if level_hints is None else np.ascontiguousarray(_level_hints(level_hints, heads), dtype=np.int32)
    variant = _variant(softcap, alibi_slopes, sinks, sliding_window, heads)
    o, certs = _core.attend(q3, kc, vc, index._core, opt, _count(step, "step"), _count(layer, "layer", 0, 2**32 - 1),
                            _count(kv_head, "kv_head", 0, 2**32 - 1), _count(sequence, "sequence"), hints,
                            use_history, out, _count(threads, "threads"), variant, positions,
                            _kv_scales(kv_scales))
    return (_like(_position_result(o, positions, shape[:-1] + o.shape[-1:]), q),
            _position_result(certs, positions, shape[:-1]))


def dense_attend(q, k, v, *, softmax_scale: float = 0.0, threads: int = 1, softcap=None, alibi_slopes=None,
                 sinks=None, sliding_window=None, positions: int = 1, kv_scales=None):
    """Exact attention with the library's vectorised dense kernel (float32 accumulation), with
    the variant and ``positions`` arguments of attend() (several positions: causally, each
    over the tokens up to its own, dense_attend_positions)."""
    kc, vc = _cache(k, "k"), _cache(v, "v")
    q3, shape = _position_queries(_queries(q), kc, positions)
    variant = _variant(softcap, alibi_slopes, sinks, sliding_window, q3.shape[0] * q3.shape[1] // positions)
    o = _core.dense_attend(q3, kc, vc, _real(softmax_scale, "softmax_scale"), _count(threads, "threads"), variant,
                           positions, _kv_scales(kv_scales))
    return _like(_position_result(o, positions, shape[:-1] + o.shape[-1:]), q)


def exact_attention(q, k, v, *, softmax_scale: float = 0.0, softcap=None, alibi_slopes=None, sinks=None,
                    sliding_window=None, kv_scales=None):
    """Exact attention in double (the tests' truth), with the variant arguments of attend().
    Returns (out float64, info EXACT_DTYPE)."""
    kc, vc = _cache(k, "k"), _cache(v, "v")
    q3, shape = _group_queries(_queries(q), kc)
    variant = _variant(softcap, alibi_slopes, sinks, sliding_window, q3.shape[0] * q3.shape[1])
    o, info = _core.exact_attention(q3, kc, vc, _real(softmax_scale, "softmax_scale"), variant, _kv_scales(kv_scales))
    return o.reshape(shape[:-1] + o.shape[-1:]), info.reshape(shape[:-1])


def reference_attend(q, k, v, index: KeyIndex | None = None, *, eps: float = 0.1, delta: float = 0.05,
                     scale: str = "value_scale", certificate: str = "tight", softmax_scale: float = 0.0,
                     seed: int = 0, step: int = 0, layer: int = 0, kv_head: int = 0, sequence: int = 0,
                     level_hints=None, history=None, routing: str = "auto", cost=None, window: int = 64,
                     grid_ratio: int = 2, max_levels: int = 32, grid_top: int = 6, softcap=None, alibi_slopes=None,
                     sinks=None, sliding_window=None, kv_scales=None):
    """The exact-score reference estimator (the C++ reference_attend_group per KV head, the
    test oracle): the same samples, routing decisions and certificates as attend() when
    given the same index (its value centre, cap and reach floor) and options, and either
    the same ``level_hints`` (attend called with them, or with ``history=False`` and no
    hints: pass None here) or ``history=index.history_snapshot()`` taken just before the
    attend call that used the index's histories. Returns (out float64, certs). Slow: O(n)
    per head."""
    kc, vc = _cache(k, "k"), _cache(v, "v")
    if index is not None and not isinstance(index, KeyIndex):
        raise TypeError(f"index must be a certattn.KeyIndex or None, got {type(index).__name__}")
    q3, shape = _group_queries(_queries(q), kc)
    opt = _options(eps, delta, scale, certificate, window, grid_ratio, max_levels, grid_top, softmax_scale, seed,
                   routing, cost)
    if history is not None and not isinstance(history, _core.HistorySnapshot):
        raise TypeError(f"history must be None or KeyIndex.history_snapshot()'s result, got {type(history).__name__}")
    hints = None if level_hints is None else np.ascontiguousarray(np.asarray(level_hints), dtype=np.int32)
    variant = _variant(softcap, alibi_slopes, sinks, sliding_window, q3.shape[0] * q3.shape[1])
    o, certs = _core.reference_attend(q3, kc, vc, None if index is None else index._core, opt, _count(step, "step"),
                                      _count(layer, "layer", 0, 2**32 - 1), _count(kv_head, "kv_head", 0, 2**32 - 1),
                                      _count(sequence, "sequence"), hints, history, variant, _kv_scales(kv_scales))
    return o.reshape(shape[:-1] + o.shape[-1:]), certs.reshape(shape[:-1])


# --- shared prefixes -----------------------------------------------------------------------

def _sequence_args(q, k, v, own_k, own_v):
    """The prefix cache, each sequence's own tokens (as lists of arrays), q stacked as
    [kv_heads, sequences * group, d] and the shape of one sequence's result."""
    kc, vc = _cache(k, "k"), _cache(v, "v")

    def tails(x, name):
        if isinstance(x, (list, tuple)):
            return [_cache(t, f"{name}[{s}]") for s, t in enumerate(x)]
        x = _cache(x, name)  # one array with a leading axis of sequences
        if x.ndim != kc.ndim + 1:
            raise ValueError(f"{name}: expected a list of caches shaped like k, or an array [sequences, *k.shape] "
                             f"with the sequences' own token counts, got {x.ndim} dimensions")
        return list(x)

    ok, ov = tails(own_k, "own_k"), tails(own_v, "own_v")
    S = len(ok)
    if S == 0 or len(ov) != S:
        raise ValueError(f"own_k and own_v must hold the same number (>= 1) of sequences, got {len(ok)} and {len(ov)}")
    qf = _queries(q)
    if qf.ndim < 2 or qf.shape[0] != S:
        raise ValueError(f"q: expected a leading axis of sequences={S} (one per own_k entry), got shape "
                         f"{list(qf.shape)}")
    return (kc, vc, ok, ov) + _stacked_queries(qf, kc, S)


def _sequence_hints(level_hints, sequences: int, q3: np.ndarray) -> np.ndarray:
    """level_hints [sequences, ...] as attend_sequences returned them (checked: one per query
    head of every sequence), as the core's [kv_heads, sequences * group] int32 (q3 the
    stacked queries)."""
    hints = _level_hints(level_hints, q3.shape[0] * q3.shape[1])
    return np.ascontiguousarray(hints.reshape(sequences, q3.shape[0], -1).swapaxes(0, 1), dtype=np.int32)


def _sequence_ids(sequences, count: int) -> list[int]:
    ids = [_count(x, "sequences") for x in sequences]
    if len(ids) != count:
        raise ValueError(f"sequences: {len(ids)} ids for {count} sequences (one per own_k entry)")
    if len(set(ids)) != len(ids):
        raise ValueError("sequences: the ids must differ (each sequence draws its own perturbations)")
    return ids


def attend_sequences(q, k, v, index: KeyIndex, own_k, own_v, *, sequences, step: int, layer: int,
                     eps: float = 0.1, delta: float = 0.05, scale: str = "value_scale", certificate: str = "tight",
                     softmax_scale: float = 0.0, seed: int = 0, kv_head: int = 0, level_hints=None, history=None,
                     routing: str = "auto", cost=None, window: int = 64, grid_ratio: int = 2, max_levels: int = 32,
                     grid_top: int = 6, threads: int = 1, softcap=None, alibi_slopes=None, sinks=None,
                     sliding_window=None, kv_scales=None):
    """Parallel samples of one prompt in one call (C++ ``attend_sequences``): S sequences
    share the prefix k, v (the tokens ``index`` holds; nothing of the sequences is appended
    to it) and each has its own tokens ``own_k[s]``, ``own_v[s]`` (shaped like k, in its
    dtype, with the sequence's own token count; a list, or one array with a leading axis
    of sequences when the counts agree). Sequence s attends the prefix followed by its own
    tokens; the prefix's index is scanned once for all S * G query heads, and each
    sequence's own tokens are read exactly with the window (they suit tails of up to a
    few thousand tokens: docs/integration.md, "Parallel samples and shared prefixes").

    q: a leading axis of S, each sequence's queries shaped as attend() takes them.
    ``sequences``: S different ids, sequence s drawing the perturbations of its id (the
    noise key's sequence); ``step`` (advancing every call) and ``layer`` are required.
    ``history``: None (default) uses the routing histories the index keeps per sequence
    id unless ``level_hints`` is given (each hints, routes and times its own sequence;
    ``index.reset_history(sequence=id)`` frees one); False uses none; True requires them.
    ``level_hints``: None, or the previous step's ``certs["level"]`` of this call. The
    other arguments are attend()'s. Returns ``(out, certs)`` with the leading axis of
    sequences.
    """
    kc, vc, ok, ov, q3, shape = _sequence_args(q, k, v, own_k, own_v)
    if not isinstance(index, KeyIndex):
        raise TypeError(f"index must be a certattn.KeyIndex, got {type(index).__name__}")
    S = len(ok)
    ids = _sequence_ids(sequences, S)
    heads = q3.shape[0] * q3.shape[1] // S
    opt = _options(eps, delta, scale, certificate, window, grid_ratio, max_levels, grid_top, softmax_scale, seed,
                   routing, cost)
    use_history = _use_history(history, level_hints)
    hints = None if level_hints is None else _sequence_hints(level_hints, S, q3)
    variant = _variant(softcap, alibi_slopes, sinks, sliding_window, heads)
    o, certs = _core.attend_sequences(q3, kc, vc, index._core, ok, ov, ids, opt, _count(step, "step"),
                                      _count(layer, "layer", 0, 2**32 - 1), _count(kv_head, "kv_head", 0, 2**32 - 1),
                                      hints, use_history, _count(threads, "threads"), variant, _kv_scales(kv_scales))
    return (_like(_stacked_result(o, S, shape[:-1] + o.shape[-1:]), q), _stacked_result(certs, S, shape[:-1]))


def dense_attend_sequences(q, k, v, own_k, own_v, *, softmax_scale: float = 0.0, threads: int = 1, softcap=None,
                           alibi_slopes=None, sinks=None, sliding_window=None, kv_scales=None):
    """Exact attention of attend_sequences()'s shapes with the dense kernel (C++
    ``dense_attend_sequences``: the shared tokens read once for every sequence), its
    baseline."""
    kc, vc, ok, ov, q3, shape = _sequence_args(q, k, v, own_k, own_v)
    S = len(ok)
    variant = _variant(softcap, alibi_slopes, sinks, sliding_window, q3.shape[0] * q3.shape[1] // S)
    o = _core.dense_attend_sequences(q3, kc, vc, ok, ov, _real(softmax_scale, "softmax_scale"),
                                     _count(threads, "threads"), variant, _kv_scales(kv_scales))
    return _like(_stacked_result(o, S, shape[:-1] + o.shape[-1:]), q)


def reference_attend_sequences(q, k, v, index: KeyIndex, own_k, own_v, *, sequences, step: int = 0, layer: int = 0,
                               eps: float = 0.1, delta: float = 0.05, scale: str = "value_scale",
                               certificate: str = "tight", softmax_scale: float = 0.0, seed: int = 0,
                               kv_head: int = 0, level_hints=None, history=None, routing: str = "auto", cost=None,
                               window: int = 64, grid_ratio: int = 2, max_levels: int = 32, grid_top: int = 6,
                               softcap=None, alibi_slopes=None, sinks=None, sliding_window=None, kv_scales=None):
    """The exact-score reference of attend_sequences() (C++ ``reference_attend_sequences``
    per KV head, the test oracle): the same samples, routing decisions and certificates
    given the same arguments: the same ``level_hints``, or ``history`` = one
    ``index.history_snapshot(sequence=id)`` per sequence, taken just before the call to
    reproduce (None: no history, as attend_sequences(..., history=False)). Returns (out
    float64, certs) with the leading axis of sequences. Slow: O(n) per head."""
    kc, vc, ok, ov, q3, shape = _sequence_args(q, k, v, own_k, own_v)
    if not isinstance(index, KeyIndex):
        raise TypeError(f"index must be a certattn.KeyIndex, got {type(index).__name__}")
    S = len(ok)
    ids = _sequence_ids(sequences, S)
    opt = _options(eps, delta, scale, certificate, window, grid_ratio, max_levels, grid_top, softmax_scale, seed,
                   routing, cost)
    hints = None if level_hints is None else _sequence_hints(level_hints, S, q3)
    if history is not None:
        if not isinstance(history, (list, tuple)) or not all(isinstance(h, _core.HistorySnapshot) for h in history):
            raise TypeError("history must be None or a list of KeyIndex.history_snapshot(sequence=id) results, "
                            "one per sequence")
        history = list(history)
    variant = _variant(softcap, alibi_slopes, sinks, sliding_window, q3.shape[0] * q3.shape[1] // S)
    o, certs = _core.reference_attend_sequences(q3, kc, vc, index._core, ok, ov, ids, opt, _count(step, "step"),
                                                _count(layer, "layer", 0, 2**32 - 1),
                                                _count(kv_head, "kv_head", 0, 2**32 - 1), hints, history, variant,
                                                _kv_scales(kv_scales))
    return _stacked_result(o, S, shape[:-1] + o.shape[-1:]), _stacked_result(certs, S, shape[:-1])


# --- audit ---------------------------------------------------------------------------------

def _binomial_upper_tail(v: int, n: int, p: float) -> float:
    """P(Binomial(n, p) >= v)."""
    if v <= 0:
        return 1.0
    if v > n:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
             for i in range(v, n + 1)]
    m = max(terms)
    return min(1.0, math.exp(m) * sum(math.exp(t - m) for t in terms))


def _clopper_pearson_upper(v: int, n: int, level: float = 0.95) -> float:
    """The exact one-sided upper confidence bound on a binomial rate (v successes of n)."""
    if n == 0 or v >= n:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(100):  # the p with P(Binomial(n, p) <= v) = 1 - level
        mid = 0.5 * (lo + hi)
        if 1.0 - _binomial_upper_tail(v + 1, n, mid) > 1.0 - level:
            lo = mid
        else:
            hi = mid
    return hi


@dataclass
class AuditReport:
    """One row per (certificate, scale, epsilon); ``passed`` as certattn-bench audit decides."""
    rows: list[dict] = field(default_factory=list)
    passed: bool = True

    def table(self) -> str:
        cols = ["certificate", "scale", "eps", "calls", "certified", "fallbacks", "violations",
                "violation_rate_ub95", "max_err_over_bound", "keys_read_frac", "checked", "disagreements", "pass"]
        lines = ["  ".join(cols)]
        for r in self.rows:
            lines.append("  ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in cols))
        return "\n".join(lines)


def audit(k, v, queries, *, eps: Sequence[float] = (0.05, 0.1, 0.2, 0.3), delta: float = 0.05,
          scales: Sequence[str] = ("denominator", "output_norm", "value_scale"),
          certificates: Sequence[str] = ("tight",), seed: int = 1, check_every: int = 1, alpha: float = 0.05,
          threads: int = 1) -> AuditReport:
    """The check of ``certattn-bench audit --kv --queries`` on arrays.

    k, v [kv_heads, n, d] (one layer's cache, read in its own dtype); queries [steps,
    kv_heads, group, d] (unscaled). For every (certificate, scale, epsilon), every call of
    attend (routing "off", as in the bench: the audit studies the certificates; steps in
    order, each hinted with the levels of the step before) is compared
    with exact attention in double; every ``check_every``-th also with reference_attend,
    which must agree exactly. A row fails on a disagreement, or when its violations are
    improbable under the guarantee: P(Binomial(certified, delta) >= violations) below
    alpha / rows.
    """
    kc, vc = _cache(k, "k"), _cache(v, "v")
    if kc.ndim != 3:
        raise ValueError(f"k: expected [kv_heads, n_tokens, head_dim], got {kc.ndim} dimensions")
    qf = _queries(queries, "queries")
    if qf.ndim != 4:
        raise ValueError(f"queries: expected [steps, kv_heads, group, head_dim], got {list(qf.shape)}")
    if isinstance(eps, (int, float)):
        eps = [eps]
    if isinstance(scales, str):
        scales = [scales]
    if isinstance(certificates, str):
        certificates = [certificates]
    alpha = _real(alpha, "alpha")
    if not 0 < alpha < 1:
        raise ValueError("alpha must lie in (0, 1)")
    counts = _core.audit(kc, vc, qf, list(certificates), list(scales), [_real(e, "eps") for e in eps],
                         _real(delta, "delta"), _count(seed, "seed"), _count(check_every, "check_every", 1),
                         _count(threads, "threads"))
    configs = [(c, s, e) for c in certificates for s in scales for e in eps]
    report = AuditReport()
    per_row_alpha = alpha / len(configs)
    for (c, s, e), a in zip(configs, counts):
        p = _binomial_upper_tail(a.violations, a.certified, delta)
        ok = a.disagreements == 0 and p >= per_row_alpha
        report.rows.append(dict(
            certificate=c, scale=s, eps=float(e), delta=float(delta), calls=a.calls, certified=a.certified,
            fallbacks=a.fallbacks, violations=a.violations,
            violation_rate_ub95=_clopper_pearson_upper(a.violations, a.certified), p_value=p,
            max_err_over_bound=a.max_ratio, p90_err_over_bound=a.p90_ratio,
            max_certified_bound_over_eps=a.bound_max, keys_read_frac=a.keys_frac, checked=a.checked,
            disagreements=a.disagreements, first_disagreement=a.first_disagreement, **{"pass": ok}))
        report.passed = report.passed and ok
    return report
