"""python/examples/llama2c_torch.py on a short prompt: agreement with dense attention,
certified bounds within epsilon, and its .npy caches accepted by certattn.audit and (when
built) by `certattn-bench audit --kv --queries`."""
import glob
import importlib.util
import json
import os
import subprocess

import numpy as np
import pytest

import certattn

pytest.importorskip("torch")
ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE = os.path.join(ROOT, "python", "examples", "llama2c_torch.py")


def load_example():
    spec = importlib.util.spec_from_file_location("llama2c_torch", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def find_bench():
    if os.environ.get("CERTATTN_BENCH"):
        return os.environ["CERTATTN_BENCH"]
    # The release build first; any other build of this host (a cross build, e.g.
    # build/aarch64, cannot run here).
    found = sorted(glob.glob(os.path.join(ROOT, "build", "*", "bench", "certattn-bench")),
                   key=lambda p: os.path.basename(os.path.dirname(os.path.dirname(p))) != "release")
    for path in found:
        try:
            subprocess.run([path, "--help"], capture_output=True, timeout=60)
            return path
        except OSError:
            continue
    return None


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    ex = load_example()
    data = os.environ.get("CERTATTN_DATA_DIR", ex.DEFAULT_DATA)
    out = tmp_path_factory.mktemp("llama2c")
    rc = ex.main(["--data-dir", data, "--prompt-tokens", "200", "--steps", "10", "--out-dir", str(out / "kv"),
                  "--json", str(out / "summary.json")])
    assert rc == 0
    with open(out / "summary.json") as f:
        return json.load(f), out / "kv"


def test_example_agrees_with_dense(run):
    s, _ = run
    assert s["steps"] == 10 and s["certattn_calls"] > 0
    assert s["routing"] == "off" and s["routed_frac"] == 0  # every call on the sparse path
    assert s["token_agreement"] >= 0.9
    assert s["max_certified_bound"] <= s["epsilon"]
    assert s["certificate_violations"] == 0
    assert s["max_kl"] < 1e-2


def test_example_cache_audits(run):
    _, kv_dir = run
    kv = np.load(kv_dir / "kv_layer0.npy")
    q = np.load(kv_dir / "queries_layer0.npy")
    assert kv.dtype == np.float32 and kv.ndim == 4 and kv.shape[0] == 2
    assert q.shape == (10, kv.shape[1], 2, kv.shape[3])
    report = certattn.audit(kv[0].astype(np.float16), kv[1].astype(np.float16), q, eps=[0.1], scales=["value_scale"],
                            delta=0.05, alpha=1e-6)
    assert report.passed, report.table()


def test_example_cache_bench_audit(run):
    _, kv_dir = run
    bench = find_bench()
    if bench is None:
        pytest.skip("certattn-bench not built (CERTATTN_BENCH=path/to/certattn-bench to run it)")
    r = subprocess.run([bench, "audit", "--kv", str(kv_dir / "kv_layer0.npy"), "--queries",
                        str(kv_dir / "queries_layer0.npy"), "--eps", "0.1", "--scale", "value_scale", "--quiet"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 of 1 rows fail" in r.stdout, r.stdout
