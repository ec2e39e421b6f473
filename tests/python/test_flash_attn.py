"""flash-attn's interface (flash_attn_func, flash_attn_varlen_func) against an fp64 reference with
flash-attn's semantics: (batch, seq, heads, head_dim) tensors, bottom-right causal alignment,
window_size (left, right) with -1 for no limit, softcap, ALiBi, packed batches, GQA; the forward,
the LSE (return_attn_probs) and the gradients; the documented differences (LSE -inf for a row
with no key, dropout refused, other ALiBi slopes refused); torch.compile and opcheck on the
features operators. Fresh random inputs each run (the seed is in the header)."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import attention_kernels as ak  # noqa: E402
from attention_kernels import _ops  # noqa: E402
from attention_reference import generator, randn  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")


def visible(seq_q, seq_k, causal, window):
    """flash-attn's mask: query i (aligned so the last query meets the last key) sees key j when
    i + seq_k - seq_q - left <= j <= i + seq_k - seq_q + right, right = 0 under causal."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(seq_q, device="cuda")[:, None] + (seq_k - seq_q)
    j = torch.arange(seq_k, device="cuda")[None, :]
    ok = torch.ones(seq_q, seq_k, dtype=torch.bool, device="cuda")
    if right >= 0:
        ok &= j <= i + right
    if left >= 0:
        ok &= j >= i - left
    return ok


def reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, alibi=None, scale=None):
    """O [b, s, h, d] and LSE [b, h, s] in float64 from (batch, seq, heads, head_dim) tensors.
    A row with no key: O = 0, LSE = -inf (this library's convention)."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))
    heads = q.shape[1]
    k, v = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (k, v))
    scale = scale or q.shape[-1] ** -0.5
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    seq_q, seq_k = q.shape[2], k.shape[2]
    if alibi is not None:  # the slopes, [heads] or [batch, heads]
        slopes = alibi.double().expand(q.shape[0], heads)[:, :, None, None]
        i = torch.arange(seq_q, device="cuda")[:, None] + (seq_k - seq_q)
        j = torch.arange(seq_k, device="cuda")[None, :]
        s = s - slopes * (i - j).abs()
    s = s.masked_fill(~visible(seq_q, seq_k, causal, window), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return (p @ v).transpose(1, 2), lse


def close(ours, ref, dtype, what):
    err = (ours.double() - ref).abs().max().item()
    limit = 2e-2 if dtype == torch.bfloat16 else 5e-3
    assert err < limit * max(1.0, ref.abs().max().item()), f"{what}: max error {err:.3g}"


CASES = [  # (batch, seq_q, seq_k, heads_q, heads_kv, d, causal, window, softcap, alibi)
    (2, 128, 128, 4, 4, 64, False, (-1, -1), 0.0, False),
    (2, 200, 333, 4, 2, 128, True, (-1, -1), 0.0, False),
    (1, 256, 256, 4, 1, 64, True, (64, 0), 0.0, False),
    (2, 300, 300, 4, 2, 128, False, (32, 48), 0.0, False),
    (1, 256, 256, 8, 8, 64, True, (-1, -1), 30.0, False),
    (2, 192, 192, 12, 4, 64, True, (-1, -1), 0.0, True),
    (1, 100, 400, 4, 4, 128, True, (128, 0), 20.0, True),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}_q{c[1]}_k{c[2]}_h{c[3]}x{c[4]}_d{c[5]}_"
                         f"{'causal' if c[6] else 'full'}_w{c[7][0]}_{c[7][1]}_cap{c[8]:g}_alibi{int(c[9])}")
def test_forward_and_backward(case, dtype):
    b, sq, sk, hq, hkv, d, causal, window, softcap, alibi = case
    g = generator(f"flash_attn/{case}/{dtype}")
    q, k, v = randn((b, sq, hq, d), dtype, g), randn((b, sk, hkv, d), dtype, g), randn((b, sk, hkv, d), dtype, g)
    # Caller-given slopes, as flash-attn takes them: per head, or per (batch, head) when b > 1.
    slopes = None
    if alibi:
        slopes = (torch.rand((hq,) if b == 1 else (b, hq), generator=g, device="cuda") * 0.4 + 0.05).float()
    for t in (q, k, v):
        t.requires_grad_(True)
    out, lse, probs = ak.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                         alibi_slopes=slopes, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (b, hq, sq) and probs is None
    ref_q, ref_k, ref_v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref_o, ref_lse = reference(ref_q, ref_k, ref_v, causal, window, softcap, slopes)
    close(out, ref_o, dtype, "O")
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen), "LSE must be -inf exactly where a row sees no key"
    assert (lse[~seen] == float("-inf")).all()
    close(lse[seen], ref_lse[seen], torch.float16, "LSE")
    d_o = randn(out.shape, dtype, g)
    out.backward(d_o)
    ref_o.backward(d_o.double())
    for name, ours, ref in (("dQ", q.grad, ref_q.grad), ("dK", k.grad, ref_k.grad), ("dV", v.grad, ref_v.grad)):
        close(ours, ref, dtype, name)


@pytest.mark.parametrize("causal,window,softcap", [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0),
                                                   (True, (40, 0), 0.0), (False, (-1, -1), 25.0)])
def test_varlen_matches_each_sequence(causal, window, softcap):
    g = generator(f"flash_attn/varlen/{causal}/{window}/{softcap}")
    lens_q, lens_k = [37, 128, 1, 200], [37, 150, 64, 200]
    hq, hkv, d, dtype = 4, 2, 64, torch.bfloat16
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device="cuda")
    q = randn((sum(lens_q), hq, d), dtype, g).requires_grad_(True)
    k = randn((sum(lens_k), hkv, d), dtype, g).requires_grad_(True)
    v = randn((sum(lens_k), hkv, d), dtype, g).requires_grad_(True)
    out, lse, _ = ak.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                            window_size=window, softcap=softcap, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (hq, sum(lens_q))
    d_o = randn(out.shape, dtype, g)
    out.backward(d_o)
    for i in range(len(lens_q)):
        qs, ks = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        rq, rk, rv = (t.detach()[sl].double().unsqueeze(0).requires_grad_(True) for t, sl in ((q, qs), (k, ks), (v, ks)))
        ref_o, ref_lse = reference(rq, rk, rv, causal, window, softcap)
        close(out[qs], ref_o[0], dtype, f"O of sequence {i}")
        seen = torch.isfinite(ref_lse[0])
        close(lse[:, qs][seen], ref_lse[0][seen], torch.float16, f"LSE of sequence {i}")
        ref_o.backward(d_o[qs].double().unsqueeze(0))
        close(q.grad[qs], rq.grad[0], dtype, f"dQ of sequence {i}")
        close(k.grad[ks], rk.grad[0], dtype, f"dK of sequence {i}")
        close(v.grad[ks], rv.grad[0], dtype, f"dV of sequence {i}")


def test_documented_differences_and_errors():
    g = generator("flash_attn/errors")
    q = randn((1, 64, 4, 64), torch.bfloat16, g)
    with pytest.raises(ValueError, match="dropout_p must be 0.0"):
        ak.flash_attn_func(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match=r"^alibi_slopes must be float32 \(4,\) or \(1, 4\), got torch.float32 \(3,\)$"):
        ak.flash_attn_func(q, q, q, alibi_slopes=torch.full((3,), 0.3, device="cuda"))
    with pytest.raises(ValueError, match=r"window_size\[0\] must be an int >= -1"):
        ak.flash_attn_func(q, q, q, window_size=(-2, 0))
    with pytest.raises(ValueError, match="block_table"):
        cu = torch.tensor([0, 64], dtype=torch.int32, device="cuda")
        ak.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 64, 64, block_table=cu)
    # A window that leaves the first rows no key: O = 0 there (as flash-attn), LSE = -inf (not +inf).
    k = randn((1, 64, 4, 64), torch.bfloat16, g)
    short_q = randn((1, 4, 4, 64), torch.bfloat16, g)
    out, lse, _ = ak.flash_attn_func(short_q, k[:, :2], k[:, :2], causal=True, return_attn_probs=True)
    # seq_q 4 > seq_k 2, bottom-right aligned: queries 0 and 1 see no key.
    assert (out[:, :2] == 0).all() and (lse[..., :2] == float("-inf")).all()
    assert torch.isfinite(lse[..., 2:]).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_deterministic_backward_is_bitwise_repeatable(dtype):
    # bf16 on sm_90: the default backward (ch07_wgmma_bf16) is deterministic; fp16 (and bf16
    # elsewhere): chapter 07's deterministic variant is picked instead of the atomic default.
    g = generator(f"flash_attn/deterministic/{dtype}")
    q, k, v = (randn((2, 256, 4, 64), dtype, g).requires_grad_(True) for _ in range(3))
    grads = []
    for _ in range(2):
        for t in (q, k, v):
            t.grad = None
        ak.flash_attn_func(q, k, v, causal=True, deterministic=True).sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v)])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    reference = [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ak.flash_attn_func(q, k, v, causal=True).sum().backward()  # the default kernel: the same gradients
    for a, b in zip(reference, (q.grad, k.grad, v.grad)):
        assert (a.float() - b.float()).abs().max().item() <= 0.05 * b.float().abs().max().item()
    with pytest.raises(ValueError, match="deterministic=True"):
        ak.flash_attn_func(q, k, v, window_size=(32, 0), deterministic=True).sum().backward()


def test_compile_fullgraph_and_opcheck():
    g = generator("flash_attn/compile")
    q, k, v = (randn((2, 128, 4, 64), torch.bfloat16, g).requires_grad_(True) for _ in range(3))

    def f(q, k, v):
        return ak.flash_attn_func(q, k, v, causal=True, window_size=(32, 0), softcap=20.0)

    compiled = torch.compile(f, fullgraph=True)
    eager = f(q, k, v)
    out = compiled(q, k, v)
    assert torch.equal(out, eager)
    out.sum().backward()
    qh, kh, vh = (t.detach().transpose(1, 2).contiguous() for t in (q, k, v))
    args = (qh, kh, vh, True, None, 32, 0, 20.0, False, None, None, None, 0, 0, None, None, None, True)
    torch.library.opcheck(_ops.features_forward, args)
    o, lse = _ops.features_forward(*args[:-1], False)
    torch.library.opcheck(_ops.features_backward,
                          (qh, kh, vh, o, lse, torch.randn_like(o), True, None, 32, 0, 20.0, False, None, None,
                           None, 0, 0, None, None))
