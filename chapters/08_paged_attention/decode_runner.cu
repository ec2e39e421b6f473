// See decode_runner.h.
#include "decode_runner.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>

#include "block_manager.h"
#include "cuda_check.h"
#include "random.h"
#include "runner.h"
#include "timing.h"

namespace fa {

namespace {

/// Element `element` of the K (which = 1) or V (which = 2) cache: one of the 128 multiples of
/// 1/64 in [-1, 1), which fp16 and bf16 both hold exactly (so host and GPU agree to the bit).
__host__ __device__ inline float cache_value(uint64_t seed, int which, int64_t element) {
  const uint64_t r = splitmix64(splitmix64(seed * 4 + uint64_t(which)) + uint64_t(element));
  return float(int(r >> 57) - 64) * (1.0f / 64.0f);
}

__global__ void fill_cache_kernel(uint16_t* cache, int64_t n, uint64_t seed, int which, const int* filled,
                                  int slots_per_block, int head_dim, int heads_kv, bool bf16) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = e / head_dim;  // ((block * heads_kv + h) * block_size + slot)
    const int slot = int(row % slots_per_block);
    const int64_t block = row / slots_per_block / heads_kv;
    if (slot < filled[block]) {
      const float x = cache_value(seed, which, e);
      cache[e] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
    } else {
      cache[e] = bf16 ? 0x7FC0 : 0x7E00;  // NaN: nobody wrote this slot
    }
  }
}

}  // namespace

float decode_cache_value(uint64_t seed, int which, int64_t element) { return cache_value(seed, which, element); }

double DecodeProblem::kv_bytes() const {
  double tokens = 0;
  for (int len : lens) tokens += len;
  return tokens * shape.heads_kv * shape.head_dim * 2.0 * dtype_size(dtype);
}

DecodeProblem make_decode_problem(const DecodeSpec& spec, uint64_t seed, DType dtype) {
  if (spec.contexts.empty()) throw std::invalid_argument("a decode problem needs at least one sequence");
  if (spec.samples < 1) throw std::invalid_argument("samples must be >= 1, got " + std::to_string(spec.samples));
  if (dtype != DType::F16 && dtype != DType::BF16)
    throw std::invalid_argument(std::string("paged caches hold fp16 or bf16, got ") + dtype_name(dtype));
  DecodeProblem p;
  p.seed = seed;
  p.dtype = dtype;
  DecodeShape& s = p.shape;
  s.num_seqs = int(spec.contexts.size());
  s.heads_q = spec.heads_q;
  s.heads_kv = spec.heads_kv;
  s.head_dim = spec.head_dim;
  s.query_len = spec.query_len;
  s.block_size = spec.block_size;
  int64_t worst = spec.spare_blocks + 1;
  for (int len : spec.contexts) {
    if (len < 0) throw std::invalid_argument("context lengths must be >= 0, got " + std::to_string(len));
    worst += (len + spec.block_size - 1) / spec.block_size + 1;
  }
  if (worst > (int64_t(1) << 30)) throw std::invalid_argument("the pool would need more than 2^30 blocks");
  paged::BlockManager manager(int(worst), spec.block_size);
  std::vector<int> ids;
  for (std::size_t first = 0; first < spec.contexts.size(); first += spec.samples) {
    const std::size_t end = std::min(spec.contexts.size(), first + spec.samples);
    const int parent = manager.add_sequence();
    int prompt = 0;
    if (end - first > 1) {
      prompt = spec.shared_prompt;
      for (std::size_t i = first; i < end; ++i)
        if (spec.contexts[i] < prompt)
          throw std::invalid_argument("sequence " + std::to_string(i) + " has " + std::to_string(spec.contexts[i]) +
                                      " tokens, fewer than its shared prompt of " + std::to_string(prompt));
      manager.append(parent, prompt);
    }
    ids.push_back(parent);
    for (std::size_t i = first + 1; i < end; ++i) ids.push_back(manager.fork(parent));
    for (std::size_t i = first; i < end; ++i) manager.append(ids[i], spec.contexts[i] - prompt);
  }
  // Physical blocks relabeled in a random order: consecutive tokens land far apart in memory.
  std::vector<int> relabel(manager.total_blocks());
  std::iota(relabel.begin(), relabel.end(), 0);
  std::shuffle(relabel.begin(), relabel.end(), std::mt19937_64(seed));
  s.num_blocks = manager.total_blocks();
  p.filled.assign(s.num_blocks, 0);
  std::vector<char> used(s.num_blocks, 0);
  s.max_blocks_per_seq = 1;
  for (int id : ids) {
    std::vector<int> table = manager.block_table(id);
    const int len = manager.length(id);
    for (std::size_t j = 0; j < table.size(); ++j) {
      table[j] = relabel[table[j]];
      p.filled[table[j]] =
          std::max<int>(p.filled[table[j]], std::min<int64_t>(s.block_size, len - int64_t(j) * s.block_size));
      used[table[j]] = 1;
    }
    s.max_blocks_per_seq = std::max<int>(s.max_blocks_per_seq, int(table.size()));
    s.max_context = std::max(s.max_context, len);
    p.blocks_unshared += manager.blocks_needed(id);
    p.tables.push_back(std::move(table));
    p.lens.push_back(len);
  }
  p.blocks_used = int(std::count(used.begin(), used.end(), 1));
  s.validate();

  p.q.resize(std::size_t(s.q_elems()));
  for (std::size_t i = 0; i < p.q.size(); ++i) p.q[i] = round_to_dtype(3.0f * random_normal(seed, 0, i), dtype);

  // The oracle, on a compact host copy of the blocks the checked sequences reach.
  p.checked_seqs = spec.check_seqs < 0 ? s.num_seqs : std::min(spec.check_seqs, s.num_seqs);
  if (p.checked_seqs == 0) return p;
  std::map<int, int> compact;
  std::vector<std::vector<int>> tables;
  for (int i = 0; i < p.checked_seqs; ++i) {
    std::vector<int> table = p.tables[i];
    for (int& b : table) b = compact.emplace(b, int(compact.size())).first->second;
    tables.push_back(std::move(table));
  }
  PagedKvView view;
  view.num_blocks = int(compact.size());
  view.block_size = s.block_size;
  view.heads_kv = s.heads_kv;
  view.head_dim = s.head_dim;
  const int64_t block_elems = int64_t(s.heads_kv) * s.block_size * s.head_dim;
  std::vector<float> k(std::size_t(view.num_blocks * block_elems)), v(k.size());
  for (const auto& [physical, local] : compact)
    for (int64_t e = 0; e < block_elems; ++e) {
      const int slot = int(e / s.head_dim % s.block_size);
      const int64_t element = physical * block_elems + e;
      const bool written = slot < p.filled[physical];
      k[std::size_t(local * block_elems + e)] = written ? cache_value(seed, 1, element) : NAN;
      v[std::size_t(local * block_elems + e)] = written ? cache_value(seed, 2, element) : NAN;
    }
  view.k = k.data();
  view.v = v.data();
  const std::vector<int> lens(p.lens.begin(), p.lens.begin() + p.checked_seqs);
  p.ref = reference_paged_decode(view, s.heads_q, p.q.data(), tables, lens, s.query_len);
  return p;
}

DecodeDeviceInputs upload_decode_problem(const DecodeProblem& p) {
  const DecodeShape& s = p.shape;
  DecodeDeviceInputs in;
  std::vector<unsigned char> raw(p.q.size() * dtype_size(p.dtype));
  encode_elements(p.dtype, p.q.data(), raw.data(), p.q.size());
  in.q = DeviceBuffer(raw.size());
  in.q.upload(raw.data(), raw.size());
  std::vector<int> tables(std::size_t(s.num_seqs) * s.max_blocks_per_seq, -1);  // -1: never read
  for (int i = 0; i < s.num_seqs; ++i)
    std::copy(p.tables[i].begin(), p.tables[i].end(), tables.begin() + std::size_t(i) * s.max_blocks_per_seq);
  in.tables = DeviceBuffer(tables.size() * sizeof(int));
  in.tables.upload(tables.data(), tables.size() * sizeof(int));
  in.lens = DeviceBuffer(p.lens.size() * sizeof(int));
  in.lens.upload(p.lens.data(), p.lens.size() * sizeof(int));
  DeviceBuffer filled(p.filled.size() * sizeof(int));
  filled.upload(p.filled.data(), p.filled.size() * sizeof(int));
  const int64_t n = s.cache_elems();
  for (int which : {1, 2}) {
    DeviceBuffer& cache = which == 1 ? in.k_cache : in.v_cache;
    cache = DeviceBuffer(std::size_t(n) * 2);
    fill_cache_kernel<<<4096, 256>>>(cache.as<uint16_t>(), n, p.seed, which, filled.as<int>(), s.block_size, s.head_dim,
                                     s.heads_kv, p.dtype == DType::BF16);
    CUDA_CHECK_LAUNCH();
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  return in;
}

DecodeParams decode_params(const DecodeProblem& problem, const DecodeDeviceInputs& in, void* o, float* lse,
                           void* workspace) {
  DecodeParams params;
  params.shape = problem.shape;
  params.q = in.q.get();
  params.k_cache = in.k_cache.get();
  params.v_cache = in.v_cache.get();
  params.block_tables = in.tables.as<int>();
  params.context_lens = in.lens.as<int>();
  params.o = o;
  params.lse = lse;
  params.workspace = workspace;
  return params;
}

std::string DecodeRunResult::summary() const {
  std::ostringstream s;
  if (report.checked > 0) s << report.summary();
  else s << "not compared (no sequence checked)";
  if (unchecked_bad > 0) s << "; " << unchecked_bad << " outputs of unchecked sequences unwritten or not finite";
  return s.str();
}

DecodeRunResult run_decode(const DecodeKernel& kernel, const DecodeProblem& problem, const DecodeDeviceInputs& in,
                           int iters, bool flush_l2) {
  DecodeRunResult r;
  const GpuInfo& gpu = detect_gpu();
  if (!gpu.available) {
    r.skipped = "no GPU: " + gpu.reason;
    return r;
  }
  if (kernel.dtype != problem.dtype) {
    r.error = std::string("kernel ") + kernel.name + " takes " + dtype_name(kernel.dtype) + ", the problem holds " +
              dtype_name(problem.dtype);
    return r;
  }
  const DecodeShape& s = problem.shape;
  r.skipped = support_reason(kernel, s);
  if (!r.skipped.empty()) return r;
  try {
    // Peak device memory: the inputs the caller holds (the whole K/V pool, spare and shared blocks
    // included), and whatever the outputs, the workspace and the launch itself add (every device
    // allocation is a DeviceBuffer).
    const std::size_t input_bytes = in.bytes();
    DeviceBuffer::reset_peak();
    const std::size_t before = DeviceBuffer::live_bytes();
    DeviceBuffer o(std::size_t(s.q_elems()) * dtype_size(problem.dtype)),
        lse(std::size_t(s.lse_elems()) * sizeof(float));
    DeviceBuffer workspace(kernel.workspace_bytes ? kernel.workspace_bytes(s) : 0);
    const DecodeParams params = decode_params(problem, in, o.get(), lse.as<float>(), workspace.get());
    auto launch_poisoned = [&] {
      o.poison();
      lse.poison();
      workspace.poison();
      kernel.launch(params);
      CUDA_CHECK(cudaDeviceSynchronize());
      return std::make_pair(o.download(), lse.download());
    };
    const auto [o_raw, lse_raw] = launch_poisoned();
    r.device_mib = double(input_bytes + DeviceBuffer::peak_bytes() - before) / (1 << 20);
    r.ran = true;
    std::vector<float> lse_values(lse_raw.size() / sizeof(float));
    std::memcpy(lse_values.data(), lse_raw.data(), lse_raw.size());

    // The checked sequences are the leading [checked, heads_q, query_len] rows of O and LSE.
    AttentionShape checked = s.output_layout();
    checked.batch = problem.checked_seqs;
    if (problem.checked_seqs > 0) {
      const CheckPlan plan = full_check_plan(checked);  // by sequence, head, then row
      ForwardReference ref;
      const std::size_t rows = s.query_len, d = s.head_dim;
      for (std::size_t e = 0; e < plan.heads.size(); ++e) {
        const std::size_t first = (std::size_t(plan.heads[e].batch) * s.heads_q + plan.heads[e].head) * rows;
        ref.o.emplace_back(problem.ref.o.begin() + first * d, problem.ref.o.begin() + (first + rows) * d);
        ref.lse.emplace_back(problem.ref.lse.begin() + first, problem.ref.lse.begin() + first + rows);
      }
      r.report = compare_forward(checked, problem.dtype, o_raw, lse_values, plan, ref);
    }
    // The rest: written, finite (LSE may be -inf for an empty context, never NaN or poison).
    const std::size_t o_first = std::size_t(checked.o_elems()), lse_first = std::size_t(checked.lse_elems());
    std::vector<float> values(o_raw.size() / dtype_size(problem.dtype));
    decode_elements(problem.dtype, o_raw.data(), values.data(), values.size());
    for (std::size_t i = o_first; i < values.size(); ++i)
      r.unchecked_bad += is_poison(problem.dtype, o_raw.data(), i) || !std::isfinite(values[i]);
    for (std::size_t i = lse_first; i < lse_values.size(); ++i)
      r.unchecked_bad +=
          is_poison(DType::F32, lse_values.data(), i) || std::isnan(lse_values[i]) || lse_values[i] == INFINITY;
    r.passed = (problem.checked_seqs == 0 || r.report.passed()) && r.unchecked_bad == 0;

    const auto again = launch_poisoned();
    r.repeat_identical = again.first == o_raw && again.second == lse_raw;

    TimingOptions timing;
    timing.warmup = 2;
    timing.repeats = iters;
    timing.flush_l2 = flush_l2;
    r.time_ms = time_launches([&] { kernel.launch(params); }, timing).median_ms;
    r.gbps = r.time_ms > 0 ? problem.kv_bytes() / (r.time_ms * 1e-3) / 1e9 : 0;
  } catch (const std::exception& e) {
    r.error = e.what();
    r.passed = false;
  }
  return r;
}

}  // namespace fa
