"""Every registered forward kernel against the fp64 reference and PyTorch's SDPA, on
flash-attention's own odd shapes, through attention_kernels.forward (outputs NaN-poisoned)."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

import attention_kernels as ak  # noqa: E402
from attention_reference import check_rule, generator, poisoned, pytorch_attention, randn, reference  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# (batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, causal)
CASES = [
    (1, 2, 2, 1, 1, 64, False),
    (2, 2, 2, 1, 1, 128, True),
    (2, 4, 1, 1, 239, 64, False),  # one query over many keys, MQA
    (1, 2, 2, 113, 203, 64, True),
    (1, 2, 2, 113, 203, 128, False),
    (1, 2, 2, 128, 217, 64, False),
    (1, 2, 2, 113, 211, 128, True),
    (1, 2, 2, 108, 256, 128, True),
    (2, 8, 2, 256, 512, 64, True),  # GQA
    (1, 6, 2, 512, 256, 128, False),  # GQA, more queries than keys
    (1, 4, 1, 512, 256, 64, True),  # MQA; the first 256 rows see no key
    (1, 2, 2, 1023, 1024, 128, True),
    (1, 2, 2, 1024, 1023, 64, True),
    (1, 2, 2, 1023, 1024, 64, False),
    (1, 1, 1, 2048, 2048, 128, True),
]

KERNELS = ak.list_kernels("forward")


def case_id(case):
    b, hq, hkv, sq, sk, d, causal = case
    return f"b{b}h{hq}-{hkv}q{sq}k{sk}d{d}{'c' if causal else ''}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.name)
def test_forward(kernel, case):
    b, hq, hkv, sq, sk, d, causal = case
    if kernel.unavailable:
        pytest.skip(f"{kernel.name}: {kernel.unavailable}")
    if d not in kernel.head_dims:
        pytest.skip(f"{kernel.name} takes head_dim {kernel.head_dims}, not {d}")
    dtype = DTYPES[kernel.dtype]
    g = generator(f"{kernel.name}/{case_id(case)}")
    q, k, v = randn((b, hq, sq, d), dtype, g), randn((b, hkv, sk, d), dtype, g), randn((b, hkv, sk, d), dtype, g)
    out, lse = poisoned(q.shape, dtype), poisoned(q.shape[:3], torch.float32)
    ak.forward(q, k, v, causal=causal, kernel=kernel.name, out=out, lse=lse)
    torch.cuda.synchronize()
    o_ref, lse_ref = reference(q, k, v, causal)
    # LSE: rows that see no key are -inf; the others within the C++ tests' LSE tolerance.
    lse_tol = kernel.tolerance[2]
    seen = torch.isfinite(lse_ref)
    assert not torch.isnan(lse).any(), f"{kernel.name}: LSE has NaN (never written?)"
    assert torch.equal(torch.isinf(lse) & (lse < 0), ~seen), f"{kernel.name}: LSE must be -inf exactly on rows with no key"
    lse_err = (lse.double() - lse_ref)[seen].abs().max().item() if seen.any() else 0.0
    assert lse_err <= lse_tol, f"{kernel.name}: LSE error {lse_err:.3g} > {lse_tol:g}"
    if kernel.coarse_arithmetic:
        # FP8 inside: PyTorch has no attention of that precision; held to its own tolerance.
        rel_fro, max_abs, _ = kernel.tolerance
        assert torch.isfinite(out).all()
        err = (out.double() - o_ref).abs().max().item()
        rel = ((out.double() - o_ref).norm() / o_ref.norm().clamp_min(1e-30)).item()
        assert err <= max_abs and rel <= rel_fro, f"{kernel.name}: max {err:.3g} (<= {max_abs}), rel {rel:.3g} (<= {rel_fro})"
        return
    check_rule(kernel.name, out, pytorch_attention(q, k, v, causal), o_ref, dtype, sk)


def test_every_kernel_ran_somewhere():
    """Each kernel this machine can run takes at least one of the cases."""
    for kernel in KERNELS:
        if not kernel.unavailable:
            assert any(c[5] in kernel.head_dims for c in CASES), kernel.name
