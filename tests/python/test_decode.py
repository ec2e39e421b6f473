"""Every registered decode kernel (chapter 08) over a paged K/V cache, through
attention_kernels.decode, against the fp64 reference and PyTorch's SDPA on each sequence's
gathered K/V in the same dtype."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

import attention_kernels as ak  # noqa: E402
from attention_reference import check_rule, generator, poisoned, pytorch_attention, randn, reference  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# (heads_q, heads_kv, head_dim, query_len, block_size, context lengths)
CASES = [
    (32, 8, 128, 1, 16, [1, 17, 300, 1024, 3001]),  # decode, GQA 4
    (8, 8, 64, 1, 16, [0, 16, 33, 2048]),  # an empty context: O = 0, LSE = -inf
    (16, 1, 128, 1, 32, [5, 4097]),  # MQA
    (32, 8, 64, 7, 16, [7, 100, 1500]),  # a 7-token prefill chunk over the cache
    (8, 2, 128, 37, 8, [37, 64, 513]),
    (8, 2, 64, 5, 16, [3, 40]),  # a context shorter than the chunk: its first rows see no key
]

KERNELS = ak.list_kernels("decode")


def case_id(case):
    hq, hkv, d, ql, bs, lens = case
    return f"h{hq}-{hkv}d{d}q{ql}bs{bs}s{len(lens)}"


def paged_inputs(case, dtype, g):
    hq, hkv, d, ql, bs, lens = case
    blocks_per_seq = [(n + bs - 1) // bs for n in lens]
    max_blocks = max(blocks_per_seq) + 1  # one spare column: never read
    num_blocks = sum(blocks_per_seq) + 3  # and a few blocks no sequence owns
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(int(g.initial_seed() % (1 << 31))))
    table = torch.full((len(lens), max_blocks), 1 << 30, dtype=torch.int32)  # junk past each sequence's blocks
    used = 0
    for s, n in enumerate(blocks_per_seq):
        table[s, :n] = order[used:used + n].to(torch.int32)
        used += n
    k_cache = randn((num_blocks, hkv, bs, d), dtype, g)
    v_cache = randn((num_blocks, hkv, bs, d), dtype, g)
    q = randn((len(lens), hq, ql, d), dtype, g)
    return q, k_cache, v_cache, table.cuda(), torch.tensor(lens, dtype=torch.int32, device="cuda")


def gathered(cache, table_row, n):
    """[1, heads_kv, n, head_dim]: one sequence's first n tokens, in order."""
    bs = cache.shape[2]
    rows = [cache[int(table_row[t // bs]), :, t % bs, :] for t in range(n)]
    if not rows:
        return cache.new_zeros((1, cache.shape[1], 0, cache.shape[3]))
    return torch.stack(rows, dim=1)[None]


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.name)
def test_decode(kernel, case):
    hq, hkv, d, ql, bs, lens = case
    if kernel.unavailable:
        pytest.skip(f"{kernel.name}: {kernel.unavailable}")
    if d not in kernel.head_dims:
        pytest.skip(f"{kernel.name} takes head_dim {kernel.head_dims}, not {d}")
    dtype = DTYPES[kernel.dtype]
    g = generator(f"{kernel.name}/{case_id(case)}")
    q, k_cache, v_cache, table, context_lens = paged_inputs(case, dtype, g)
    out, lse = poisoned(q.shape, dtype), poisoned(q.shape[:3], torch.float32)
    ak.decode(q, k_cache, v_cache, table, context_lens, kernel=kernel.name, out=out, lse=lse)
    torch.cuda.synchronize()
    o_ref, lse_ref, o_pt = [], [], []
    cpu_table = table.cpu()
    for s, n in enumerate(lens):
        k_s, v_s = gathered(k_cache, cpu_table[s], n), gathered(v_cache, cpu_table[s], n)
        o, l = reference(q[s:s + 1], k_s, v_s, causal=True)
        o_ref.append(o)
        lse_ref.append(l)
        o_pt.append(pytorch_attention(q[s:s + 1], k_s, v_s, causal=True) if n > 0 else torch.full_like(q[s:s + 1], float("nan")))
    o_ref, lse_ref, o_pt = torch.cat(o_ref), torch.cat(lse_ref), torch.cat(o_pt)
    seen = torch.isfinite(lse_ref)
    assert not torch.isnan(lse).any(), f"{kernel.name}: LSE has NaN (never written?)"
    assert torch.equal(torch.isinf(lse) & (lse < 0), ~seen), f"{kernel.name}: LSE must be -inf exactly on rows with no key"
    lse_err = (lse.double() - lse_ref)[seen].abs().max().item()
    assert lse_err <= kernel.tolerance[2], f"{kernel.name}: LSE error {lse_err:.3g} > {kernel.tolerance[2]:g}"
    check_rule(kernel.name, out, o_pt, o_ref, dtype, max(lens))
