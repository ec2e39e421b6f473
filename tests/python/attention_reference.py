"""What the pytest suite compares with: an fp64 reference in torch, PyTorch's own attention in the
kernel's dtype, and flash-attention's acceptance rule.

The rule (flash-attention's tests use it): our largest error against the fp64 reference may be at
most twice PyTorch's own largest error, computed in the same dtype against the same reference,
plus twice the dtype's rounding at the reference's magnitude ((ref + 0.3 - 0.3) - ref in the
dtype), which covers a reference that PyTorch happens to round exactly. check_rule says where the
rounding term is larger: gradients that are zero in exact arithmetic, and fp32.
"""
import math
import os
import random
import zlib

import torch

# (kernel, our max error, PyTorch's, rounding) of every check_rule call: conftest.py writes the
# per-kernel summary when FA_RULE_CSV names a file.
CHECKS = []

SEED = int(os.environ.get("FA_TEST_SEED", random.SystemRandom().randrange(1 << 31)))


def generator(salt):
    """A CUDA generator seeded from the run's seed (printed on failure) and the test's salt."""
    g = torch.Generator(device="cuda")
    g.manual_seed((SEED * 1000003 + zlib.crc32(salt.encode())) % (1 << 62))
    return g


def randn(shape, dtype, g):
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def poisoned(shape, dtype):
    """An output buffer full of NaN: an element the kernel never writes stays NaN."""
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def visible_mask(seq_q, seq_kv, causal, device="cuda"):
    """[seq_q, seq_kv] bool: query i sees key j (bottom-right causal, as the kernels)."""
    if not causal:
        return torch.ones(seq_q, seq_kv, dtype=torch.bool, device=device)
    i = torch.arange(seq_q, device=device)[:, None]
    j = torch.arange(seq_kv, device=device)[None, :]
    return j <= i + (seq_kv - seq_q)


def expand_kv(t, heads_q):
    return t.repeat_interleave(heads_q // t.shape[1], dim=1)


def reference(q, k, v, causal, scale=None):
    """O and LSE in float64. A row that sees no key: O = 0, LSE = -inf."""
    q, k, v = q.double(), expand_kv(k.double(), q.shape[1]), expand_kv(v.double(), q.shape[1])
    scale = scale or q.shape[-1] ** -0.5
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~visible_mask(q.shape[2], k.shape[2], causal), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return p @ v, lse


def reference_autograd(q, k, v, d_o, causal, scale=None):
    """dQ, dK, dV of the float64 reference (through torch.autograd), GQA heads summed."""
    q, k, v = (t.double().detach().requires_grad_() for t in (q, k, v))
    o, _ = reference(q, k, v, causal, scale)
    o.backward(d_o.double())
    return q.grad, k.grad, v.grad


def pytorch_attention(q, k, v, causal, scale=None):
    """PyTorch's scaled_dot_product_attention in q's dtype, with the kernels' bottom-right causal
    mask; rows that see no key come back as 0 (SDPA gives NaN there)."""
    import torch.nn.functional as F

    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    seq_q, seq_kv = q.shape[2], k.shape[2]
    if not causal:
        o = F.scaled_dot_product_attention(q, k, v, scale=scale)
    elif seq_q == seq_kv:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    else:
        from torch.nn.attention.bias import causal_lower_right

        o = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(seq_q, seq_kv), scale=scale)
    return o.nan_to_num(0.0)


def rounding(ref, dtype):
    r = ref.to(dtype)
    return 2 * ((r + 0.3 - 0.3) - r).double().abs().max().item()


def max_error(x, ref):
    return (x.double() - ref).abs().max().item()


def check_rule(what, ours, pytorch, ref, dtype, terms):
    """flash-attention's rule; returns our error and PyTorch's.

    A tensor whose fp64 reference is zero everywhere (dQ and dK when every row sees one key: the
    softmax of a single score has no gradient) holds only the residue of a cancellation, ours and
    PyTorch's alike, and twice one residue says nothing about the other. There the rounding term
    is at least head_dim unit roundoffs of the dtype: the rounding of the d-term dot products
    whose difference cancels.

    In fp32 the output's own rounding is not the largest rounding: a kernel's error, and
    PyTorch's, is that of sums of `terms` float products (the longer sequence), which grows like
    sqrt(terms) unit roundoffs, and the maximum of two such noises over a tensor swings by more
    than the rule's factor 2 from seed to seed. There the rounding term is at least
    2 sqrt(terms) unit roundoffs at the reference's magnitude."""
    assert torch.isfinite(ours).all(), f"{what}: not every element is finite (a NaN-poisoned element was never written?)"
    finite = torch.isfinite(pytorch)  # SDPA's NaN on rows that see no key is not its error
    ours_err, round_err = max_error(ours, ref), rounding(ref, dtype)
    pt_err = max_error(pytorch[finite], ref[finite])
    unit = torch.finfo(dtype).eps / 2
    if not ref.any():
        round_err = max(round_err, unit * ref.shape[-1])
    if dtype == torch.float32:
        round_err = max(round_err, 2 * unit * math.sqrt(terms) * ref.abs().max().item())
    CHECKS.append((what.split()[0], ours_err, pt_err, round_err))
    assert ours_err <= 2 * pt_err + round_err, (
        f"{what}: max error {ours_err:.3g} > 2 x PyTorch's {pt_err:.3g} + rounding {round_err:.3g} (seed {SEED})")
    return ours_err, pt_err
