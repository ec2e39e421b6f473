"""attention()'s eager operator in C++ (libfa_torch.so, python/csrc/eager_attention.cpp): it is
loaded whenever the build made it, and it gives what the Python path gives, forward and
backward, in every layout (the same kernels: O bitwise, gradients bitwise for the deterministic
backward kernels, and both near the fp32 reference), with the outputs laid out the same way.
Fresh random inputs each run."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import attention_kernels as ak  # noqa: E402
from attention_kernels import _library, _torch  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")


def torch_library_path():
    return Path(_library.load().path).with_name("libfa_torch.so")


@pytest.fixture
def python_path(monkeypatch):
    """attention() with the C++ operator switched off (FA_EAGER_PYTHON=1), then on again."""

    def switch(python):
        if python:
            monkeypatch.setenv(_torch.EAGER_PYTHON_VARIABLE, "1")
        else:
            monkeypatch.delenv(_torch.EAGER_PYTHON_VARIABLE, raising=False)
        _torch.eager_ops.cache_clear()
        _torch._PLANS.clear()

    yield switch
    switch(False)


def test_the_operator_is_loaded_when_built():
    if not torch_library_path().is_file():
        pytest.skip(f"{torch_library_path()} was not built (CMake did not find torch)")
    ops = _torch.eager_ops()
    assert not isinstance(ops, str), ops
    assert hasattr(torch.ops.attention_kernels, "eager_attention")


def reference(q, k, v, causal):
    """fp32 SDPA on [batch, heads, seq, head_dim] views (GQA expanded), differentiable."""
    rep = q.shape[1] // k.shape[1]
    kf, vf = (t.float().repeat_interleave(rep, dim=1) for t in (k, v))
    return torch.nn.functional.scaled_dot_product_attention(q.float(), kf, vf, is_causal=causal)


def make_inputs(layout, b, hq, hkv, s, d, dtype):
    """q, k, v as [batch, heads, seq, head_dim] views in one of three layouts, requiring grad."""
    g = lambda *shape: torch.randn(*shape, device="cuda", dtype=dtype)  # noqa: E731
    if layout == "bhsd":
        q, k, v = g(b, hq, s, d), g(b, hkv, s, d), g(b, hkv, s, d)
        leaves = [q, k, v]
    elif layout == "bshd":
        q, k, v = g(b, s, hq, d), g(b, s, hkv, d), g(b, s, hkv, d)
        leaves = [q, k, v]
    else:  # "qkv": slices of one projection [batch, seq, (hq + 2 hkv) * d]
        qkv = g(b, s, (hq + 2 * hkv) * d)
        leaves = [qkv]
    for t in leaves:
        t.requires_grad_()
    if layout == "bhsd":
        return leaves, (q, k, v)
    if layout == "bshd":
        return leaves, tuple(t.transpose(1, 2) for t in (q, k, v))
    qkv = leaves[0].view(b, s, hq + 2 * hkv, d)
    q, k, v = qkv[:, :, :hq], qkv[:, :, hq:hq + hkv], qkv[:, :, hq + hkv:]
    return leaves, tuple(t.transpose(1, 2) for t in (q, k, v))


CASES = [
    # layout, b, hq, hkv, s, d, dtype, forward kernel, backward kernel, causal
    ("bhsd", 2, 4, 4, 256, 64, torch.bfloat16, None, None, True),
    ("bshd", 2, 4, 2, 200, 128, torch.bfloat16, None, None, True),
    ("qkv", 1, 4, 2, 192, 64, torch.bfloat16, None, None, False),
    ("bshd", 2, 4, 2, 128, 64, torch.bfloat16, "ch05_tuned", "ch07_mma", True),  # packed only: copies
    ("bhsd", 1, 4, 1, 160, 64, torch.float16, None, None, True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}_h{c[2]}kv{c[3]}_s{c[4]}_d{c[5]}_{c[6]}_{c[7]}")
def test_same_results_as_the_python_path(case, python_path):
    if isinstance(_torch.eager_ops(), str):
        pytest.skip(_torch.eager_ops())
    layout, b, hq, hkv, s, d, dtype, kernel, backward_kernel, causal = case
    torch.manual_seed(torch.seed() % 2**31)
    leaves, (q, k, v) = make_inputs(layout, b, hq, hkv, s, d, dtype)
    d_o = torch.randn(q.shape, device="cuda", dtype=dtype)
    runs = {}
    for python in (False, True):
        python_path(python)
        try:
            o = ak.attention(q, k, v, causal=causal, kernel=kernel, backward_kernel=backward_kernel)
        except (ak.UnsupportedError, TypeError) as e:  # the kernel is not built for this GPU or dtype
            pytest.skip(str(e))
        for t in leaves:
            t.grad = None
        o.backward(d_o)
        runs[python] = (o.detach(), o.stride(), [t.grad.clone() for t in leaves])
    (o_cpp, stride_cpp, g_cpp), (o_py, stride_py, g_py) = runs[False], runs[True]
    assert stride_cpp == stride_py, f"O's strides: C++ {stride_cpp}, Python {stride_py}"
    assert torch.equal(o_cpp, o_py), "the C++ operator's O differs from the Python path's (same kernel)"
    # the reference, and the gradients of both paths against it
    ref_leaves = [t.detach().float().requires_grad_() for t in leaves]
    if layout == "qkv":
        qkv = ref_leaves[0].view(b, s, hq + 2 * hkv, d)
        rq, rk, rv = (t.transpose(1, 2) for t in (qkv[:, :, :hq], qkv[:, :, hq:hq + hkv], qkv[:, :, hq + hkv:]))
    elif layout == "bshd":
        rq, rk, rv = (t.transpose(1, 2) for t in ref_leaves)
    else:
        rq, rk, rv = ref_leaves
    ro = reference(rq, rk, rv, causal)
    ro.backward(d_o.float())
    err = (o_cpp.float() - ro).norm() / ro.norm()
    assert err < 2e-2, f"O's relative error against fp32 SDPA: {err:.3g}"
    for name, a, p, r in zip(("grad 0", "grad 1", "grad 2"), g_cpp, g_py, ref_leaves):
        for path, g in (("C++", a), ("Python", p)):
            err = (g.float() - r.grad).norm() / r.grad.norm()
            assert err < 3e-2, f"{path} path's {name} relative error against fp32 SDPA: {err:.3g}"
        info = _library.load().find(_library.BACKWARD, _torch._resolve(
            _library.BACKWARD, backward_kernel, _torch._DTYPE_NAMES[dtype], "backward_kernel").name)
        if info.deterministic:
            assert torch.equal(a, p), f"{name}: the C++ operator's differs from the Python path's ({info.name})"


def test_no_grad_and_inference_calls(python_path):
    if isinstance(_torch.eager_ops(), str):
        pytest.skip(_torch.eager_ops())
    q, k, v = (torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        o = ak.attention(q, k, v, causal=True)
    assert not o.requires_grad
    with torch.inference_mode():
        o2 = ak.attention(q.detach(), k.detach(), v.detach(), causal=True)
    assert torch.equal(o, o2)
    err = (o.float() - reference(q, k, v, True)).norm() / o.float().norm()
    assert err < 2e-2, f"relative error {err:.3g}"


def test_opcheck():
    if isinstance(_torch.eager_ops(), str):
        pytest.skip(_torch.eager_ops())
    q, k, v = (torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    ak.attention(q, k, v, causal=True)  # makes the plan
    plan = [p for key, p in _torch._PLANS.items() if key[0] == "eager" and key[1] == q.shape and key[-1]][-1]
    torch.library.opcheck(torch.ops.attention_kernels.eager_attention.default, (q, k, v, plan))
    o, lse = torch.ops.attention_kernels.eager_attention.default(q.detach(), k.detach(), v.detach(), plan)
    args = (q.detach(), k.detach(), v.detach(), o, lse, torch.randn_like(o), plan)
    torch.library.opcheck(torch.ops.attention_kernels.eager_attention_backward.default, args)


def test_a_bad_plan_id_is_refused():
    """A bad plan id and a bad plan, each a RuntimeError with its message. In a process of its
    own, so that a crash shows as this test's failure, with its trace."""
    if isinstance(_torch.eager_ops(), str):
        pytest.skip(_torch.eager_ops())
    code = ("import torch, attention_kernels as ak\n"
            "from attention_kernels import _torch\n"
            "_torch.eager_ops()\n"
            "q = torch.randn(1, 1, 64, 64, device='cuda', dtype=torch.bfloat16)\n"
            "ak.attention(q, q, q)\n"
            "try:\n"
            "    torch.ops.attention_kernels.eager_attention(q, q, q, 99999999)\n"
            "except RuntimeError as e:\n"
            "    print('refused:', e)\n"
            "try:\n"
            "    torch.ops.attention_kernels.eager_plan('a', 'b', [1, 2], 1.0, False, False, 0, 0)\n"
            "except RuntimeError as e:\n"
            "    print('plan refused:', e)\n")
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, f"exit status {done.returncode}: {done.stderr[-3000:]}"
    assert "refused: eager_attention: plan 99999999 does not exist" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "plan refused: eager_plan: shape has 7 fields" in done.stdout, done.stdout + done.stderr[-2000:]
