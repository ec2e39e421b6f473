"""Every registered backward kernel (chapter 07), paired with a forward kernel of its dtype
through attention_kernels.attention and torch.autograd, against the fp64 reference's gradients
and PyTorch's SDPA backward in the same dtype."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

import attention_kernels as ak  # noqa: E402
from attention_reference import (  # noqa: E402
    check_rule,
    generator,
    poisoned,
    pytorch_attention,
    randn,
    reference,
    reference_autograd,
)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# (batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, causal)
CASES = [
    (1, 2, 2, 1, 1, 64, False),
    (2, 4, 1, 1, 239, 64, True),
    (1, 2, 2, 113, 203, 64, True),
    (1, 2, 2, 113, 203, 128, False),
    (1, 2, 2, 128, 217, 128, True),
    (1, 2, 2, 108, 256, 64, False),
    (2, 8, 2, 256, 512, 64, True),  # GQA
    (1, 6, 2, 256, 512, 128, True),  # GQA
    (1, 2, 2, 300, 200, 64, True),  # the first 100 rows see no key
    (1, 4, 1, 256, 256, 128, False),  # MQA
    (1, 2, 2, 1023, 1024, 128, True),
    (1, 2, 2, 1024, 1023, 64, False),
]

KERNELS = ak.list_kernels("backward")
FORWARDS = {k.name: k for k in ak.list_kernels("forward")}


def case_id(case):
    b, hq, hkv, sq, sk, d, causal = case
    return f"b{b}h{hq}-{hkv}q{sq}k{sk}d{d}{'c' if causal else ''}"


def forward_for(kernel, d):
    """The fastest forward kernel of the backward kernel's dtype that runs here and takes d."""
    for name in reversed(list(FORWARDS)):
        f = FORWARDS[name]
        if f.dtype == kernel.dtype and not f.unavailable and not f.coarse_arithmetic and d in f.head_dims:
            return f
    return None


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.name)
def test_backward(kernel, case):
    b, hq, hkv, sq, sk, d, causal = case
    if kernel.unavailable:
        pytest.skip(f"{kernel.name}: {kernel.unavailable}")
    if d not in kernel.head_dims:
        pytest.skip(f"{kernel.name} takes head_dim {kernel.head_dims}, not {d}")
    fwd = forward_for(kernel, d)
    assert fwd is not None, f"no forward kernel of {kernel.dtype} for head_dim {d}"
    dtype = DTYPES[kernel.dtype]
    g = generator(f"{kernel.name}/{case_id(case)}")
    q, k, v = randn((b, hq, sq, d), dtype, g), randn((b, hkv, sk, d), dtype, g), randn((b, hkv, sk, d), dtype, g)
    d_o = randn((b, hq, sq, d), dtype, g)
    dq_ref, dk_ref, dv_ref = reference_autograd(q, k, v, d_o, causal)

    # Ours, through autograd: forward kernel, then the backward kernel on the saved O and LSE.
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = ak.attention(*leaves, causal=causal, kernel=fwd.name, backward_kernel=kernel.name)
    o.backward(d_o)
    # PyTorch in the same dtype.
    pt_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    pytorch_attention(*pt_leaves, causal).backward(d_o)
    torch.cuda.synchronize()
    for what, ours, pt, ref in zip(("dQ", "dK", "dV"), leaves, pt_leaves, (dq_ref, dk_ref, dv_ref)):
        check_rule(f"{kernel.name} (forward {fwd.name}) {what}", ours.grad, pt.grad, ref, dtype, max(sq, sk))


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.name)
def test_backward_writes_every_element(kernel):
    """Through attention_kernels.backward with NaN-poisoned dQ, dK, dV: every element written."""
    if kernel.unavailable:
        pytest.skip(f"{kernel.name}: {kernel.unavailable}")
    d = 64 if 64 in kernel.head_dims else kernel.head_dims[0]
    fwd = forward_for(kernel, d)
    dtype = DTYPES[kernel.dtype]
    g = generator(f"{kernel.name}/poison")
    q, k, v = randn((2, 4, 130, d), dtype, g), randn((2, 2, 190, d), dtype, g), randn((2, 2, 190, d), dtype, g)
    d_o = randn(q.shape, dtype, g)
    o, lse = ak.forward(q, k, v, causal=True, kernel=fwd.name)
    dq, dk, dv = poisoned(q.shape, dtype), poisoned(k.shape, dtype), poisoned(v.shape, dtype)
    ak.backward(q, k, v, o, lse, d_o, causal=True, kernel=kernel.name, dq=dq, dk=dk, dv=dv)
    torch.cuda.synchronize()
    refs = reference_autograd(q, k, v, d_o, True)
    pt_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    pytorch_attention(*pt_leaves, True).backward(d_o)
    for what, ours, pt, ref in zip(("dQ", "dK", "dV"), (dq, dk, dv), pt_leaves, refs):
        check_rule(f"{kernel.name} {what}", ours, pt.grad, ref, dtype, 190)


def test_deterministic_kernels_repeat_bitwise():
    for kernel in KERNELS:
        if kernel.unavailable or not kernel.deterministic:
            continue
        fwd = forward_for(kernel, 64)
        dtype = DTYPES[kernel.dtype]
        g = generator(f"{kernel.name}/repeat")
        q, k, v, d_o = (randn((1, 4, 300, 64), dtype, g) for _ in range(4))
        o, lse = ak.forward(q, k, v, kernel=fwd.name)
        first = ak.backward(q, k, v, o, lse, d_o, kernel=kernel.name)
        second = ak.backward(q, k, v, o, lse, d_o, kernel=kernel.name)
        for a, b in zip(first, second):
            assert torch.equal(a, b), f"{kernel.name} promises bitwise-identical gradients"
