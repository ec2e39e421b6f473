"""The kernels as PyTorch operators: torch.library.opcheck on each, torch.compile (fullgraph and
default) through attention() forward and backward, and CUDA graph capture and replay. Fresh
random inputs each run; outputs poisoned with NaN where a test writes into them."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import attention_kernels as ak  # noqa: E402
from attention_kernels import _ops  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")


def qkv(b=2, hq=4, hkv=2, s=128, d=64, dtype=torch.bfloat16, grad=False):
    make = lambda h: torch.randn(b, h, s, d, dtype=dtype, device="cuda", requires_grad=grad)  # noqa: E731
    return make(hq), make(hkv), make(hkv)


def sdpa(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                            enable_gqa=True).to(q.dtype)


def close(a, b, tol=2e-2):
    err = (a.float() - b.float()).norm() / b.float().norm()
    assert err < tol, f"relative error {err:.3g} > {tol}"


def test_opcheck_forward_and_backward():
    q, k, v = qkv(grad=True)
    torch.library.opcheck(_ops.forward, (q, k, v, True, None, None, None, True))
    o, lse = _ops.forward(q.detach(), k.detach(), v.detach(), True, None, None, None, False)
    d_o = torch.randn_like(o)
    torch.library.opcheck(_ops.backward, (q.detach(), k.detach(), v.detach(), o, lse, d_o, True, None, None))


def test_opcheck_decode():
    torch.manual_seed(1)
    seqs, hq, hkv, d, block, blocks = 3, 4, 2, 64, 16, 12
    q = torch.randn(seqs, hq, 1, d, dtype=torch.bfloat16, device="cuda")
    k_cache = torch.randn(blocks, hkv, block, d, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.randn_like(k_cache)
    table = torch.randperm(blocks, device="cuda", dtype=torch.int32)[: seqs * 4].reshape(seqs, 4)
    lens = torch.tensor([5, 64, 37], dtype=torch.int32, device="cuda")
    torch.library.opcheck(_ops.decode, (q, k_cache, v_cache, table, lens, None, 64, True))


@pytest.mark.parametrize("causal", [False, True])
def test_compile_fullgraph_forward_and_backward(causal):
    q, k, v = qkv(grad=True)
    f = lambda q, k, v: ak.attention(q, k, v, causal=causal)  # noqa: E731
    compiled = torch.compile(f, fullgraph=True)
    o = compiled(q, k, v)
    o_eager = f(q, k, v)
    assert torch.equal(o, o_eager), "the compiled forward differs from the eager one"
    close(o, sdpa(q, k, v, causal))
    d_o = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), d_o)
    grads_eager = torch.autograd.grad(o_eager, (q, k, v), d_o)
    for g, ge in zip(grads, grads_eager):
        assert torch.equal(g, ge), "the compiled backward differs from the eager one"


def test_compile_default_in_a_module():
    q, k, v = qkv(s=96, d=128, grad=True)

    class Block(torch.nn.Module):
        def forward(self, q, k, v):
            return ak.attention(q * 1.0, k, v, causal=True).sum(dim=-1)

    out = torch.compile(Block())(q, k, v)
    ref = ak.attention(q, k, v, causal=True).sum(dim=-1)
    close(out, ref, 1e-2)
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad.float()).all()


def test_bshd_layout_compiles():
    q, k, v = (t.transpose(1, 2).contiguous() for t in qkv())
    compiled = torch.compile(lambda q, k, v: ak.attention(q, k, v, causal=True, layout="bshd"), fullgraph=True)
    o = compiled(q, k, v)
    assert o.shape == q.shape
    close(o.transpose(1, 2), sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True))


def test_cuda_graph_capture_and_replay():
    q, k, v = qkv()
    static_q, static_k, static_v = q.clone(), k.clone(), v.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up outside the capture: library loading, the kernel's first launch
            ak.attention(static_q, static_k, static_v, causal=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_o = ak.attention(static_q, static_k, static_v, causal=True)
    for _ in range(2):
        q2, k2, v2 = qkv()
        static_q.copy_(q2)
        static_k.copy_(k2)
        static_v.copy_(v2)
        static_o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_o, ak.attention(q2, k2, v2, causal=True)), "the replay differs from a launch"


def test_lse_has_no_gradient():
    q, k, v = qkv(grad=True)
    o, lse = _ops.forward(q, k, v, False, None, None, None, True)
    assert o.requires_grad and not lse.requires_grad
