#!/usr/bin/env python3
"""A real llama2.c model (stories260K) in PyTorch, decoding through certattn.

The model of examples/llama2c (the same checkpoint and tokenizer files, the same forward
pass: RMSNorm, RoPE on adjacent channel pairs, GQA, SwiGLU), written with torch. Its KV
cache is fp16, one head-major buffer per layer [kv_heads, seq_len, head_dim]; certattn
reads its first n tokens in place (the view cache[:, :n] is strided, not copied).

Two runs in lockstep, as the C++ example: both prefill the prompt with exact attention;
then at every decode step the dense run attends with
torch.nn.functional.scaled_dot_product_attention (or its formula on a torch without it),
the certattn run with certattn.attend over one KeyIndex per layer (built after prefill,
appended every step). Teacher forcing on the certattn run's tokens: both runs are fed the
same token, so each step compares two next-token distributions from the same context.
Prints token agreement, KL(dense || certattn) per step, the certified share, the keys read,
and checks every certified output against exact attention. Then writes each layer's cache
and its decode queries as .npy in the shapes `certattn-bench audit --kv/--queries` reads
(docs/accuracy.md): kv_layer<l>.npy [2, kv_heads, n_tokens, head_dim] and
queries_layer<l>.npy [steps, kv_heads, group, head_dim], float32.

    python3 python/examples/llama2c_torch.py                       # files from examples/llama2c/data
    python3 python/examples/llama2c_torch.py --prompt-tokens 200 --steps 12 --out-dir /tmp/kv
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import certattn

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.normpath(os.path.join(HERE, "..", "..", "examples", "llama2c", "data"))


# --- model ---------------------------------------------------------------------------------

class Llama2c:
    """A float32 llama2.c checkpoint (legacy version-0 format of run.c)."""

    def __init__(self, path):
        raw = np.fromfile(path, dtype=np.uint8)
        if raw.size < 28:
            raise ValueError(f"{path}: too short for a llama2.c header")
        dim, hidden, L, H, KV, vocab, T = struct.unpack("<7i", raw[:28].tobytes())
        self.shared = vocab > 0
        vocab = abs(vocab)
        if min(dim, hidden, L, H, KV, vocab, T) <= 0 or dim % H or H % KV or (dim // H) % 2:
            raise ValueError(f"{path}: implausible header (not a float32 llama2.c checkpoint?)")
        self.dim, self.hidden, self.n_layers, self.n_heads, self.n_kv_heads = dim, hidden, L, H, KV
        self.vocab, self.seq_len = vocab, T
        self.hs = dim // H
        self.group = H // KV
        kv_dim = KV * self.hs
        w = torch.from_numpy(raw[28:].view(np.float32).copy())
        sizes = [("emb", (vocab, dim)), ("rms_att", (L, dim)), ("wq", (L, dim, dim)), ("wk", (L, kv_dim, dim)),
                 ("wv", (L, kv_dim, dim)), ("wo", (L, dim, dim)), ("rms_ffn", (L, dim)), ("w1", (L, hidden, dim)),
                 ("w2", (L, dim, hidden)), ("w3", (L, hidden, dim)), ("rms_final", (dim,)), ("freq", (T * self.hs,))]
        if not self.shared:
            sizes.append(("wcls", (vocab, dim)))
        need = sum(math.prod(s) for _, s in sizes)
        if w.numel() != need:
            raise ValueError(f"{path}: {raw.size} bytes, but its header implies {28 + 4 * need}")
        off = 0
        for name, shape in sizes:
            n = math.prod(shape)
            setattr(self, name, w[off:off + n].view(shape))
            off += n
        if self.shared:
            self.wcls = self.emb
        # RoPE as run.c: channel pair (i, i+1) of each head rotates by pos / 10000^(i/hs).
        i = torch.arange(0, dim, 2, dtype=torch.float32)
        self.freq = 1.0 / torch.pow(torch.tensor(10000.0), (i % self.hs) / self.hs)

    def rope(self, x, pos):
        """x [..., dim or kv_dim] at positions pos [...] (adjacent pairs rotated)."""
        f = self.freq[: x.shape[-1] // 2]
        ang = pos[..., None].to(torch.float32) * f
        c, s = torch.cos(ang), torch.sin(ang)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)

    @staticmethod
    def rmsnorm(x, w):
        return w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5))


class Cache:
    """fp16 head-major cache per layer, [kv_heads, seq_len, head_dim]."""

    def __init__(self, m):
        self.k = [torch.zeros(m.n_kv_heads, m.seq_len, m.hs, dtype=torch.float16) for _ in range(m.n_layers)]
        self.v = [torch.zeros_like(x) for x in self.k]


def sdpa(q, k, v):
    """q [H, t, d], k, v [H, n, d] float32; causal when t > 1 (prefill), else one query."""
    causal = q.shape[1] > 1
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # the same formula, for torch < 2.0
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def forward(m, cache, tokens, pos0, attention):
    """Tokens at positions pos0.. (several: a causal prefill; one: a decode step). Writes k, v
    to the fp16 cache, calls attention(layer, q [n_heads, t, hs], n) -> [n_heads, t, hs] and
    returns the logits of the last token."""
    t = len(tokens)
    pos = torch.arange(pos0, pos0 + t)
    x = m.emb[torch.tensor(tokens)]
    for l in range(m.n_layers):
        xb = m.rmsnorm(x, m.rms_att[l])
        q = m.rope(xb @ m.wq[l].T, pos)
        k = m.rope(xb @ m.wk[l].T, pos)
        v = xb @ m.wv[l].T
        cache.k[l][:, pos0:pos0 + t] = k.view(t, m.n_kv_heads, m.hs).transpose(0, 1).to(torch.float16)
        cache.v[l][:, pos0:pos0 + t] = v.view(t, m.n_kv_heads, m.hs).transpose(0, 1).to(torch.float16)
        att = attention(l, q.view(t, m.n_heads, m.hs).transpose(0, 1), pos0 + t)
        x = x + att.transpose(0, 1).reshape(t, m.dim) @ m.wo[l].T
        xb = m.rmsnorm(x, m.rms_ffn[l])
        x = x + (F.silu(xb @ m.w1[l].T) * (xb @ m.w3[l].T)) @ m.w2[l].T
    return m.rmsnorm(x[-1], m.rms_final) @ m.wcls.T


def dense_attention(m, cache):
    def attend(l, q, n):  # the fp16 cache, read in float32; GQA by repeating KV heads
        k = cache.k[l][:, :n].float().repeat_interleave(m.group, dim=0)
        v = cache.v[l][:, :n].float().repeat_interleave(m.group, dim=0)
        return sdpa(q, k, v)
    return attend


# --- tokenizer -----------------------------------------------------------------------------

class Tokenizer:
    """run.c's BPE: code points looked up whole (byte fallback <0xXX> = byte + 3), then the
    adjacent pair whose merge has the best score merged until none is in the vocabulary."""
    BOS = 1

    def __init__(self, path, vocab_size):
        data = open(path, "rb").read()
        off = 4
        self.vocab, self.scores, self.lookup = [], [], {}
        for i in range(vocab_size):
            score, n = struct.unpack_from("<fi", data, off)
            off += 8
            s = data[off:off + n]
            off += n
            self.vocab.append(s)
            self.scores.append(score)
            self.lookup.setdefault(s, i)

    def encode(self, text):
        tokens = [self.BOS, self.lookup[b" "]] if text else [self.BOS]
        for ch in text:
            b = ch.encode("utf-8")
            tokens += [self.lookup[b]] if b in self.lookup else [x + 3 for x in b]
        while True:
            best = (-1e10, -1, 0)
            for i in range(len(tokens) - 1):
                j = self.lookup.get(self.vocab[tokens[i]] + self.vocab[tokens[i + 1]], -1)
                if j >= 0 and self.scores[j] > best[0]:
                    best = (self.scores[j], j, i)
            if best[1] < 0:
                return tokens
            tokens[best[2]:best[2] + 2] = [best[1]]

    def decode(self, prev, token):
        piece = self.vocab[token]
        if prev == self.BOS and piece.startswith(b" "):
            piece = piece[1:]
        if len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
            piece = bytes([int(piece[3:5], 16)])
        return piece.decode("utf-8", "replace")


def read_passage(path, offset, max_bytes):
    """From offset, moved to the next word start, whitespace runs collapsed (as main.cpp)."""
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.read(max_bytes)
    space = b" \n\r\t\f"
    i = 0
    if offset > 0:
        while i < len(raw) and raw[i] not in space:
            i += 1
    words = raw[i:].split()
    return b" ".join(words).decode("utf-8", "replace")


# --- the two runs --------------------------------------------------------------------------

def log_softmax64(logits):
    return torch.log_softmax(logits.double(), dim=-1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=DEFAULT_DATA, help="stories260K.bin, tok512.bin, pride-and-prejudice.txt")
    p.add_argument("--prompt-offset", type=int, default=51, help="byte offset in the prompt text")
    p.add_argument("--prompt-tokens", type=int, default=400)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--eps", type=float, default=0.1)
    p.add_argument("--delta-total", type=float, default=0.05, help="split over layers x heads x steps")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--min-pool", type=int, default=64, help="exact attention while n < 64 + this")
    p.add_argument("--threads", type=int, default=1)
    # Routing off by default, as in the C++ example: this model's contexts (at most 512
    # tokens) lie far below the break-even of the cost model, where "auto" answers nearly
    # every call exactly and the run would show no certificates.
    p.add_argument("--routing", default="off", choices=["off", "auto"],
                   help="off: every call on the sparse path (to see its certificates); auto: exact answers where "
                        "the sparse path would cost more than dense (then the index's history carries the hints)")
    p.add_argument("--out-dir", default="llama2c_kv", help="where the .npy caches go ('' for none)")
    p.add_argument("--json", default="", help="also write the summary as JSON")
    a = p.parse_args(argv)

    files = {x: os.path.join(a.data_dir, x) for x in ("stories260K.bin", "tok512.bin", "pride-and-prejudice.txt")}
    missing = [f for f in files.values() if not os.path.exists(f)]
    if missing:
        raise SystemExit(f"--data-dir: missing {', '.join(missing)}")
    torch.manual_seed(0)
    m = Llama2c(files["stories260K.bin"])
    tok = Tokenizer(files["tok512.bin"], m.vocab)
    prompt = tok.encode(read_passage(files["pride-and-prejudice.txt"], a.prompt_offset, 8 * a.prompt_tokens + 64))
    prompt = prompt[:a.prompt_tokens]
    P = len(prompt)
    if P < 2 or P >= m.seq_len:
        raise SystemExit(f"the prompt has {P} tokens; it needs 2 .. {m.seq_len - 1}")
    steps = min(a.steps, m.seq_len - (P - 1))
    delta = a.delta_total / (m.n_layers * m.n_heads * steps)
    window, min_tokens = 64, 64 + a.min_pool
    dense_name = ("torch.nn.functional.scaled_dot_product_attention" if hasattr(F, "scaled_dot_product_attention")
                  else "softmax(q k^T / sqrt(d)) v in torch (this torch has no scaled_dot_product_attention)")
    print(f"model: dim {m.dim}, {m.n_layers} layers, {m.n_heads} query heads, {m.n_kv_heads} KV heads "
          f"(head_dim {m.hs}), vocab {m.vocab}, context {m.seq_len}")
    print(f"prompt: {P} tokens; {steps} decode steps; dense: {dense_name}")
    print(f"certattn: epsilon {a.eps} (value scale), delta {delta:.3g} per call (--delta-total {a.delta_total} / "
          f"({m.n_layers} layers x {m.n_heads} heads x {steps} steps)), seed {a.seed}, isa {certattn.active_isa()}")

    cd, cc = Cache(m), Cache(m)  # dense run, certattn run
    with torch.no_grad():
        # Prefill positions 0 .. P-2 with exact attention, once: both runs share it.
        forward(m, cd, prompt[:-1], 0, dense_attention(m, cd))
        for l in range(m.n_layers):
            cc.k[l].copy_(cd.k[l])
            cc.v[l].copy_(cd.v[l])
        index = [certattn.KeyIndex(cc.k[l][:, :P - 1], cc.v[l][:, :P - 1], reserve=m.seq_len)
                 for l in range(m.n_layers)]
        hints = [None] * m.n_layers
        tally = dict(calls=0, certified=0, exact=0, routed=0, keys=0, tokens=0, short=0, violations=0, max_err=0.0,
                     max_bound=0.0, attend_s=0.0)
        queries = [[] for _ in range(m.n_layers)]
        step = 0

        def certattn_attention(l, q, n):
            k, v = cc.k[l][:, :n], cc.v[l][:, :n]  # strided views of the cache: read in place
            index[l].append(k, v)
            q = q[:, 0]  # [n_heads, hs]: head h*G + g is query g of KV head h
            queries[l].append(q.reshape(m.n_kv_heads, m.group, m.hs).numpy().copy())
            if n < min_tokens:
                tally["short"] += m.n_heads
                return dense_attention(m, cc)(l, q[:, None], n)
            t0 = time.perf_counter()
            # Routing off: the previous step's levels as hints. Auto: the index's histories
            # (hints and routing across steps; level_hints=None uses them).
            out, certs = certattn.attend(q, k, v, index[l], eps=a.eps, delta=delta, seed=a.seed, step=step, layer=l,
                                         level_hints=hints[l] if a.routing == "off" else None, routing=a.routing,
                                         window=window, threads=a.threads)
            tally["attend_s"] += time.perf_counter() - t0
            hints[l] = certs["level"]
            exact, info = certattn.exact_attention(q, k, v)
            err = np.linalg.norm(out.numpy() - exact, axis=-1) / info["value_scale"]
            c = certs.reshape(-1)
            tally["calls"] += c.size
            tally["certified"] += int(c["certified"].sum())
            tally["exact"] += int(c["exact"].sum())
            tally["routed"] += int(np.isin(certattn.path_names(c), ["over_budget", "joined", "routed"]).sum())
            tally["keys"] += int(c["keys_read"].sum())
            tally["tokens"] += c.size * n
            cert = c["certified"] & ~c["exact"]
            tally["violations"] += int((err.reshape(-1)[c["certified"]] > a.eps).sum())
            if c["certified"].any():
                tally["max_err"] = max(tally["max_err"], float(err.reshape(-1)[c["certified"]].max()))
            if cert.any():
                tally["max_bound"] = max(tally["max_bound"], float(c["bound"][cert].max()))
            return out[:, None]

        agree, kls, text, token = 0, [], [], prompt[-1]
        print(f"{'step':>4} {'pos':>4} {'KL':>10}  agree  token")
        for step in range(steps):
            pos = P - 1 + step
            lc = forward(m, cc, [token], pos, certattn_attention)
            ld = forward(m, cd, [token], pos, dense_attention(m, cd))
            pc, pd = log_softmax64(lc), log_softmax64(ld)
            kl = max(float((pd.exp() * (pd - pc)).sum()), 0.0)
            kls.append(kl)
            nxt, nxt_dense = int(lc.argmax()), int(ld.argmax())
            agree += nxt == nxt_dense
            piece = tok.decode(token, nxt)
            text.append(piece)
            print(f"{step:>4} {pos:>4} {kl:>10.3g}  {'yes' if nxt == nxt_dense else 'NO ':>5}  {piece!r}")
            token = nxt

    n_final = P - 1 + steps
    summary = dict(
        steps=steps, prompt_tokens=P, token_agreement=agree / steps, mean_kl=float(np.mean(kls)),
        max_kl=float(np.max(kls)), certattn_calls=tally["calls"], short_context_calls=tally["short"],
        certified_frac=tally["certified"] / max(tally["calls"], 1), fallback_frac=tally["exact"] / max(tally["calls"], 1),
        routing=a.routing, routed_frac=tally["routed"] / max(tally["calls"], 1),
        keys_read_frac=tally["keys"] / max(tally["tokens"], 1), max_certified_bound=tally["max_bound"],
        max_error_over_scale=tally["max_err"], certificate_violations=tally["violations"], epsilon=a.eps,
        delta_per_call=delta, attend_ms_per_step=1e3 * tally["attend_s"] / steps, text="".join(text))
    print(f"token agreement {summary['token_agreement']:.4f} ({agree} of {steps} steps), "
          f"KL(dense || certattn) mean {summary['mean_kl']:.3g} max {summary['max_kl']:.3g}")
    print(f"certified {summary['certified_frac']:.4f} of {tally['calls']} calls (exact "
          f"{summary['fallback_frac']:.4f}, of which routing {summary['routed_frac']:.4f}: routing {a.routing}), keys read {summary['keys_read_frac']:.4f} of the cache, "
          f"largest certified bound {tally['max_bound']:.4f} (epsilon {a.eps}), largest certified error "
          f"{tally['max_err']:.4f}, violations {tally['violations']}")
    if a.out_dir:
        os.makedirs(a.out_dir, exist_ok=True)
        for l in range(m.n_layers):
            kv = torch.stack([cc.k[l][:, :n_final], cc.v[l][:, :n_final]]).float().numpy()
            np.save(os.path.join(a.out_dir, f"kv_layer{l}.npy"), kv)                        # [2, H, n, d]
            np.save(os.path.join(a.out_dir, f"queries_layer{l}.npy"), np.stack(queries[l]))  # [steps, H, G, d]
        print(f"wrote {a.out_dir}/kv_layer<l>.npy [2, {m.n_kv_heads}, {n_final}, {m.hs}] and "
              f"queries_layer<l>.npy [{steps}, {m.n_kv_heads}, {m.group}, {m.hs}] for l = 0..{m.n_layers - 1}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
