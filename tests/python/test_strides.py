"""Tensors that are not packed [batch, heads, seq, head_dim]: flash-attn's [batch, seq, heads,
head_dim] layout and the Q, K, V slices of one projection. The strided kernels (KernelInfo.strided)
read and write them in place, the others get packed copies; either way the results are the same
kernel's results on packed copies of the inputs, bit for bit, and the kernel on packed inputs is
checked against the oracle by test_forward.py and test_backward.py."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import attention_kernels as ak  # noqa: E402
from attention_reference import generator, randn  # noqa: E402

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")

STRIDED_FORWARD = {"ch05_tuned_fp16", "ch05_tuned_bf16", "ch06_tma_bf16", "ch06_wgmma_bf16", "ch06_specialized_bf16",
                   "ch06_pingpong_bf16", "ch06_persistent_bf16", "ch06_lazy_bf16", "ch09_hopper_bf16"}
STRIDED_BACKWARD = {"ch07_mma_fp16", "ch07_mma_bf16", "ch07_deterministic_fp16", "ch07_deterministic_bf16",
                    "ch07_wgmma_bf16", "ch07_fused_bf16", "ch07_fused_bulk_bf16", "ch09_ampere_backward_fp16",
                    "ch09_ampere_backward_bf16", "ch09_hopper_backward_bf16"}


def test_which_kernels_are_strided():
    assert {k.name for k in ak.list_kernels("forward") if k.strided} == STRIDED_FORWARD
    assert {k.name for k in ak.list_kernels("backward") if k.strided} == STRIDED_BACKWARD


def available(kind, name):
    info = next(k for k in ak.list_kernels(kind) if k.name == name)
    if not info.available:
        pytest.skip(f"{name}: {info.unavailable}")
    return info


def projection(batch, seq, heads_q, heads_kv, d, salt):
    """Q, K, V as [batch, heads, seq, head_dim] views of one [batch, seq, heads_q + 2 heads_kv, d] tensor."""
    qkv = randn((batch, seq, heads_q + 2 * heads_kv, d), torch.bfloat16, generator(salt))
    q, k, v = qkv.split([heads_q, heads_kv, heads_kv], dim=2)
    return tuple(t.transpose(1, 2) for t in (q, k, v))


def bshd(batch, seq, heads, d, g):
    return randn((batch, seq, heads, d), torch.bfloat16, g).transpose(1, 2)


LAYOUTS = ("bshd", "projection")


def inputs(layout, causal):
    batch, seq, heads_q, heads_kv, d = 2, 200, 8, 2, 64
    if layout == "projection":
        return projection(batch, seq, heads_q, heads_kv, d, f"strides-{causal}")
    g = generator(f"strides-bshd-{causal}")
    return bshd(batch, seq, heads_q, d, g), bshd(batch, seq, heads_kv, d, g), bshd(batch, seq, heads_kv, d, g)


@needs_gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("kernel", sorted(k for k in STRIDED_FORWARD if "bf16" in k) + ["ch05_mma_bf16"])
def test_forward_on_views(kernel, causal, layout):
    info = available("forward", kernel)
    q, k, v = inputs(layout, causal)
    assert not q.is_contiguous()
    o, lse = ak.forward(q, k, v, causal=causal, kernel=kernel)
    o_ref, lse_ref = ak.forward(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal, kernel=kernel)
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
    # A strided kernel writes O laid out like Q's [batch, seq, heads, head_dim] (its transpose back
    # is free); a packed-only one writes packed O.
    assert o.transpose(1, 2).is_contiguous() if info.strided else o.is_contiguous()


@needs_gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("kernel", sorted(k for k in STRIDED_BACKWARD if "bf16" in k))  # every 16-bit backward
def test_backward_on_views(kernel, causal, layout):
    info = available("backward", kernel)
    q, k, v = inputs(layout, causal)
    o, lse = ak.forward(q, k, v, causal=causal)
    d_o = randn(o.transpose(1, 2).shape, torch.bfloat16, generator(f"strides-do-{causal}")).transpose(1, 2)
    grads = ak.backward(q, k, v, o, lse, d_o, causal=causal, kernel=kernel)
    packed = [t.contiguous() for t in (q, k, v, o, d_o)]
    grads_ref = ak.backward(*packed[:4], lse, packed[4], causal=causal, kernel=kernel)
    if info.deterministic:
        for name, ours, ref in zip(("dq", "dk", "dv"), grads, grads_ref):
            assert torch.equal(ours, ref), name
    else:  # dQ by atomics: the order of the additions differs from run to run
        for name, ours, ref in zip(("dq", "dk", "dv"), grads, grads_ref):
            assert torch.allclose(ours.float(), ref.float(), rtol=2e-2, atol=2e-2), name
    for ours, x in zip(grads, (q, k, v)):
        assert ours.shape == x.shape


@needs_gpu
def test_flash_attn_layout_trains_without_copies():
    """flash_attn_func on views of one projection: the gradient reaches the projection."""
    available("forward", "ch06_pingpong_bf16")
    available("backward", "ch07_wgmma_bf16")
    qkv = randn((2, 128, 3, 4, 64), torch.bfloat16, generator("strides-train")).requires_grad_()
    q, k, v = qkv.unbind(2)
    out = ak.flash_attn_func(q, k, v, causal=True)
    assert out.is_contiguous()  # [batch, seq, heads, head_dim] underneath: no copy on the way out
    out.float().square().sum().backward()
    ref = qkv.detach().clone().requires_grad_()
    qr, kr, vr = (t.transpose(1, 2).contiguous() for t in ref.unbind(2))
    o_ref = ak.attention(qr, kr, vr, causal=True)
    o_ref.transpose(1, 2).float().square().sum().backward()
    assert torch.equal(out, o_ref.transpose(1, 2))
    assert torch.equal(qkv.grad, ref.grad)
