"""Bad calls: each raises one exception whose message names the value and what is allowed."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import attention_kernels as ak  # noqa: E402

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")


def qkv(dtype=torch.bfloat16, device="cuda", d=64, heads_kv=2):
    return (torch.randn(1, 4, 32, d, dtype=dtype, device=device), torch.randn(1, heads_kv, 32, d, dtype=dtype, device=device),
            torch.randn(1, heads_kv, 32, d, dtype=dtype, device=device))


def test_cpu_tensor():
    q, k, v = qkv(device="cpu")
    with pytest.raises(ValueError, match=r"^q is on device 'cpu'; the kernels run on a CUDA device: move it with q.cuda\(\)$"):
        ak.attention(q, k, v)


def test_not_a_tensor():
    with pytest.raises(TypeError, match="^q must be a torch.Tensor, got list$"):
        ak.attention([1.0], None, None)


@needs_gpu
def test_wrong_dtype():
    q, k, v = qkv(dtype=torch.float64)
    with pytest.raises(TypeError, match=r"^q has dtype torch.float64; allowed: torch.float32, torch.float16, torch.bfloat16$"):
        ak.attention(q, k, v)


@needs_gpu
def test_dtype_the_kernel_does_not_take():
    q, k, v = qkv(dtype=torch.float16)
    with pytest.raises(TypeError, match=r"^kernel 'ch05_tuned_bf16' takes torch.bfloat16 tensors, got torch.float16 "
                                        r"\(try 'ch05_tuned_fp16'\)$"):
        ak.attention(q, k, v, kernel="ch05_tuned_bf16")
    with pytest.raises(TypeError, match=r"^kernel 'ch06_pingpong' comes in torch.bfloat16 only, got torch.float16 tensors$"):
        ak.attention(q, k, v, kernel="ch06_pingpong")


@needs_gpu
def test_mixed_dtypes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="^q, k and v must have one dtype, got torch.bfloat16, torch.float16, torch.bfloat16$"):
        ak.attention(q, k.half(), v)


@needs_gpu
def test_output_a_kernel_cannot_write():
    q, k, v = qkv()
    out = torch.empty(1, 32, 4, 64 * 2, dtype=q.dtype, device=q.device)[..., ::2].transpose(1, 2)  # head_dim strided
    with pytest.raises(ValueError, match=r"^out has strides \(\d+, 128, 512, 2\) that ch06_pingpong_bf16 cannot "
                                         r"write; pass a new tensor$"):
        ak.forward(q, k, v, kernel="ch06_pingpong_bf16", out=out)


@needs_gpu
def test_misaligned_view():
    q, k, v = qkv()
    # Dense, but starting one element into its storage: the library refuses it before any launch.
    q_off = torch.empty(q.numel() + 1, dtype=q.dtype, device=q.device)[1:].view(q.shape)
    q_off.copy_(q)
    with pytest.raises(ak.InvalidArgumentError, match=r"^q must be 16-byte aligned, got an address 2 bytes past a "
                                                      r"16-byte boundary$"):
        ak.attention(q_off, k, v)
    torch.cuda.synchronize()  # the CUDA context is still usable
    assert torch.isfinite(ak.attention(q, k, v)).all()


@needs_gpu
def test_unsupported_head_dim():
    q, k, v = qkv(d=80)
    with pytest.raises(ak.UnsupportedError, match=r"^ch05_tuned_bf16 does not take b1 h4/2 q32 k32 d80: head_dim must be 64, "
                                                  r"96, 128 or 256, got 80$"):
        ak.attention(q, k, v, kernel="ch05_tuned_bf16")
    assert issubclass(ak.UnsupportedError, ValueError)


@needs_gpu
def test_unknown_kernel():
    q, k, v = qkv()
    with pytest.raises(ak.UnknownKernelError, match=r"^unknown forward kernel 'ch99_fastest'; registered: ch01_naive, "):
        ak.attention(q, k, v, kernel="ch99_fastest")
    with pytest.raises(ak.UnknownKernelError, match=r"^unknown backward kernel 'ch99_slowest'; registered: ch07_fp32, "):
        ak.attention(*(t.requires_grad_() for t in (q, k, v)), backward_kernel="ch99_slowest")


@needs_gpu
def test_kernel_name_not_a_string():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="^kernel must be a kernel name \\(str\\) or None, got list$"):
        ak.attention(q, k, v, kernel=["ch05_tuned_bf16"])


@needs_gpu
def test_heads_not_grouped():
    q, k, v = qkv(heads_kv=3)
    with pytest.raises(ValueError, match=r"^q's heads \(4\) must be a multiple of k's heads \(3\) \(GQA/MQA\)$"):
        ak.attention(q, k, v)


@needs_gpu
def test_wrong_rank_and_layout():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"^q must have 4 dimensions \[batch, heads, seq, head_dim\], got shape \(4, 32, 64\)$"):
        ak.attention(q[0], k, v)
    with pytest.raises(ValueError, match="^layout must be 'bhsd' .* got 'sbhd'$"):
        ak.attention(q, k, v, layout="sbhd")


@needs_gpu
def test_bad_scale():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"^scale must be a finite number > 0 or None \(1/sqrt\(head_dim\)\), got -0.5$"):
        ak.attention(q, k, v, scale=-0.5)


@needs_gpu
def test_decode_errors():
    q = torch.randn(2, 8, 1, 64, dtype=torch.bfloat16, device="cuda")
    cache = torch.randn(4, 2, 16, 64, dtype=torch.bfloat16, device="cuda")
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda")
    lens = torch.tensor([20, 5], dtype=torch.int32, device="cuda")
    with pytest.raises(TypeError, match="^block_table has dtype torch.int64; allowed: torch.int32$"):
        ak.decode(q, cache, cache, table.long(), lens)
    with pytest.raises(ValueError, match=r"^block_table\[1, 0\] is 9; entries in use must be between 0 and num_blocks - 1 \(3\)$"):
        ak.decode(q, cache, cache, torch.tensor([[0, 1], [9, 3]], dtype=torch.int32, device="cuda"), lens)
    with pytest.raises(ValueError, match=r"^context_lens must be between 0 and max_context \(20\), got -1..20$"):
        ak.decode(q, cache, cache, table, torch.tensor([20, -1], dtype=torch.int32, device="cuda"))
    with pytest.raises(ak.InvalidArgumentError, match="^max_context must be between 0 and max_blocks_per_seq"):
        ak.decode(q, cache, cache, table, torch.tensor([20, 40], dtype=torch.int32, device="cuda"))


@needs_gpu
def test_gpu_kernel_that_this_gpu_cannot_run_says_why():
    unavailable = [k for k in ak.list_kernels("forward") if k.unavailable]
    if not unavailable:
        pytest.skip("this GPU runs every forward kernel")
    q, k, v = qkv(dtype={"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[unavailable[0].dtype])
    with pytest.raises(ak.UnsupportedError, match="needs an sm_"):
        ak.attention(q, k, v, kernel=unavailable[0].name)
