// Chapter 08 program: build/bin/ch08_paged_attention --help
//
// A small serving step. --batch sequences come in groups of (up to) 4 parallel samples of one
// prompt. Each group's prompt is written into the paged cache once (the cache-write kernel),
// the samples fork it, then every sample generates its own tokens one step at a time: the
// block manager hands out blocks and asks for copy-on-write copies (the copy kernel), and the
// new tokens' K/V are scattered into their slots. The GPU cache is compared byte for byte with
// the same steps done on the CPU, the block counts with and without sharing are printed, and
// then the decode kernels run one step over the cache against the fp64 oracle, timed, with each
// launch's peak device memory (the cache's whole pool, sized for the step without sharing, is
// part of it).
#include <cstdio>
#include <exception>
#include <iostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "algorithm.h"
#include "block_manager.h"
#include "chapter_main.h"
#include "cli.h"
#include "cuda_check.h"
#include "decode_runner.h"
#include "paged_kernels.h"
#include "random.h"
#include "registry.h"

namespace fa::paged {
namespace {

constexpr int kSamples = 4;      // parallel samples per prompt
constexpr int kGenerated = 100;  // tokens each sample generates (at most; half the context when shorter)

/// The serving step's block manager, and how each sample's context splits into its shared
/// prompt and the tokens it generates.
struct Serving {
  BlockManager manager;
  int prompt = 0, generated = 0;
};

/// A pool big enough for the step without any sharing.
Serving plan_serving(int sequences, int context, int query_len, int block_size) {
  const int generated = std::max(query_len, std::min(kGenerated, context / 2));
  if (context < generated)
    throw std::invalid_argument("the context (--seq-kv " + std::to_string(context) + ") must be at least --seq-q (" +
                                std::to_string(query_len) + ")");
  const int64_t blocks = int64_t(sequences) * ((context + block_size - 1) / block_size + 1) + 1;
  if (blocks > (int64_t(1) << 30)) throw std::invalid_argument("the cache would need more than 2^30 blocks");
  return Serving{BlockManager(int(blocks), block_size), context - generated, generated};
}

/// Chapter 08's run: the serving step on the block manager (and on the GPU's cache, checked byte
/// for byte against its CPU mirror), then one decode step of each variant against the oracle.
int run_chapter(const CliOptions& opt, int argc, const char* const* argv,
                const std::vector<const DecodeKernel*>& kernels) {
  // This chapter's defaults for what the command line did not set.
  AttentionShape shape = opt.shape;
  if (!flag_given(argc, argv, "--batch")) shape.batch = 8;
  if (!flag_given(argc, argv, "--heads")) shape.heads_q = 32;
  if (!flag_given(argc, argv, "--heads-kv")) shape.heads_kv = flag_given(argc, argv, "--heads") ? shape.heads_q : 8;
  if (!flag_given(argc, argv, "--seq-q") && !flag_given(argc, argv, "--seq")) shape.seq_q = 1;
  if (!flag_given(argc, argv, "--seq-kv")) shape.seq_kv = 8192;
  if (!flag_given(argc, argv, "--dim")) shape.head_dim = 128;
  shape.validate();
  const uint64_t seed = opt.seed_given ? opt.seed : std::random_device{}();
  const int block_size = 16, sequences = shape.batch, context = shape.seq_kv, query_len = shape.seq_q;
  std::printf(
      "chapter 8: paged attention\nserving step: %d sequences (groups of up to %d samples sharing a prompt), context %d, "
      "%d query token%s each, heads %d/%d, head_dim %d, block size %d, seed %llu  (--seed %llu repeats it)\n",
      sequences, kSamples, context, query_len, query_len == 1 ? "" : "s", shape.heads_q, shape.heads_kv, shape.head_dim,
      block_size, (unsigned long long)seed, (unsigned long long)seed);

  // ---- the block manager's side: the serving step, with and without sharing ----------------
  Serving serving = plan_serving(sequences, context, query_len, block_size);
  DecodeShape layout;
  layout.num_seqs = sequences;
  layout.heads_q = shape.heads_q;
  layout.heads_kv = shape.heads_kv;
  layout.head_dim = shape.head_dim;
  layout.query_len = query_len;
  layout.block_size = block_size;
  layout.num_blocks = serving.manager.total_blocks();
  layout.max_blocks_per_seq = (context + block_size - 1) / block_size;
  layout.max_context = context;
  layout.validate();
  const GpuInfo& gpu = detect_gpu();
  const bool on_gpu = gpu.available;
  if (!on_gpu)
    std::printf(
        "no GPU (%s): the block manager's side only; the kernels need a GPU, algorithm.h is checked by the CPU tests\n",
        gpu.reason.c_str());

  // The cache as the CPU mirror holds it (float, NaN = never written) and as the GPU holds it.
  const int64_t cache_elems = layout.cache_elems();
  PagedKvView view;
  view.num_blocks = layout.num_blocks;
  view.block_size = block_size;
  view.heads_kv = layout.heads_kv;
  view.head_dim = layout.head_dim;
  std::vector<float> k_mirror, v_mirror;
  DeviceBuffer k_cache, v_cache;
  const DType dtype = DType::BF16;  // the cache the serving step writes; fp16 kernels get their own copy below
  if (on_gpu) {
    k_mirror.assign(std::size_t(cache_elems), NAN);
    v_mirror.assign(std::size_t(cache_elems), NAN);
    k_cache = DeviceBuffer(std::size_t(cache_elems) * 2);
    v_cache = DeviceBuffer(std::size_t(cache_elems) * 2);
    k_cache.poison();
    v_cache.poison();
  }
  const int64_t row = int64_t(layout.heads_kv) * layout.head_dim;  // one token's K (or V), all K/V heads
  uint64_t next_token = 0;
  int64_t copies_done = 0, tokens_written = 0;
  // One step: `tokens[i]` more tokens for sequence ids[i]; copies first, then the writes.
  auto step = [&](const std::vector<int>& ids, const std::vector<int>& tokens) {
    std::vector<int64_t> slots;
    std::vector<std::pair<int, int>> where;  // (sequence index, position) per new token
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const int start = serving.manager.length(ids[i]);
      serving.manager.append(ids[i], tokens[i]);
      for (int pos = start; pos < start + tokens[i]; ++pos) where.push_back({int(i), pos});
    }
    const std::vector<BlockCopy> copies = serving.manager.take_copies();
    copies_done += int64_t(copies.size());
    tokens_written += int64_t(where.size());
    if (!on_gpu) return;
    if (!copies.empty()) {
      std::vector<int> pairs;
      for (const BlockCopy& c : copies) pairs.insert(pairs.end(), {c.from, c.to});
      DeviceBuffer d_pairs(pairs.size() * sizeof(int));
      d_pairs.upload(pairs.data(), pairs.size() * sizeof(int));
      launch_copy_blocks(layout, d_pairs.as<int>(), int(copies.size()), k_cache.get(), v_cache.get());
      copy_blocks(k_mirror, v_mirror, view, copies);
    }
    std::vector<float> k_new(where.size() * row), v_new(k_new.size());
    for (std::size_t n = 0; n < where.size(); ++n, ++next_token) {
      for (int64_t x = 0; x < row; ++x) {
        k_new[n * row + x] = round_to_dtype(random_normal(seed, 1, next_token * row + x), dtype);
        v_new[n * row + x] = round_to_dtype(random_normal(seed, 2, next_token * row + x), dtype);
      }
      const std::vector<int>& table = serving.manager.block_table(ids[where[n].first]);
      const int pos = where[n].second;
      slots.push_back(int64_t(table[pos / block_size]) * block_size + pos % block_size);
      write_token(k_mirror, v_mirror, view, table, pos, &k_new[n * row], &v_new[n * row]);
    }
    std::vector<uint16_t> k_raw(k_new.size()), v_raw(k_new.size());
    encode_elements(dtype, k_new.data(), k_raw.data(), k_new.size());
    encode_elements(dtype, v_new.data(), v_raw.data(), v_new.size());
    DeviceBuffer d_k(k_raw.size() * 2), d_v(v_raw.size() * 2), d_slots(slots.size() * sizeof(int64_t));
    d_k.upload(k_raw.data(), k_raw.size() * 2);
    d_v.upload(v_raw.data(), v_raw.size() * 2);
    d_slots.upload(slots.data(), slots.size() * sizeof(int64_t));
    launch_write_kv_cache(layout, d_k.get(), d_v.get(), d_slots.as<int64_t>(), int(slots.size()), k_cache.get(),
                          v_cache.get());
    CUDA_CHECK(cudaDeviceSynchronize());
  };
  // Prompts (one write each), forks, then the samples' tokens: one per step, the last step
  // query_len tokens (the ones the attention below is for).
  std::vector<int> prompts, samples;
  for (int first = 0; first < sequences; first += kSamples) prompts.push_back(serving.manager.add_sequence());
  step(prompts, std::vector<int>(prompts.size(), serving.prompt));
  for (std::size_t g = 0; g < prompts.size(); ++g) {
    samples.push_back(prompts[g]);
    for (int i = int(g) * kSamples + 1; i < std::min(sequences, int(g + 1) * kSamples); ++i)
      samples.push_back(serving.manager.fork(prompts[g]));
  }
  for (int t = 0; t < serving.generated - query_len; ++t) step(samples, std::vector<int>(samples.size(), 1));
  step(samples, std::vector<int>(samples.size(), query_len));
  int unshared = 0;
  for (int id : samples) unshared += serving.manager.blocks_needed(id);
  const int used = serving.manager.used_blocks();
  std::printf(
      "blocks: %d with prompts shared, %d without (%.0f%% saved); %lld copy-on-write copies, %lld tokens written\n",
      used, unshared, 100.0 * (unshared - used) / unshared, (long long)copies_done, (long long)tokens_written);
  if (!on_gpu) return 0;

  // ---- the GPU cache against the CPU mirror, bit for bit -------------------------------------
  {
    const std::vector<unsigned char> k_raw = k_cache.download(), v_raw = v_cache.download();
    int64_t bad = 0;
    for (int which = 0; which < 2; ++which) {
      const std::vector<float>& mirror = which == 0 ? k_mirror : v_mirror;
      const uint16_t* got = reinterpret_cast<const uint16_t*>((which == 0 ? k_raw : v_raw).data());
      for (int64_t e = 0; e < cache_elems; ++e) {
        uint16_t want = 0xFFFF;  // never written: the poison is still there
        if (!std::isnan(mirror[e])) encode_elements(dtype, &mirror[e], &want, 1);
        bad += got[e] != want;
      }
    }
    std::printf("cache: the GPU's writes and copies %s the CPU's (%lld of %lld elements differ)\n",
                bad ? "DIFFER from" : "match", (long long)bad, (long long)(2 * cache_elems));
    if (bad) return 1;
  }

  // ---- one decode (or prefill-chunk) step over the cache -----------------------------------
  DecodeProblem problem;
  problem.shape = layout;
  problem.seed = seed;
  problem.dtype = dtype;
  for (int id : samples) {
    problem.tables.push_back(serving.manager.block_table(id));
    problem.lens.push_back(serving.manager.length(id));
  }
  problem.blocks_used = used;
  problem.blocks_unshared = unshared;
  problem.q.resize(std::size_t(layout.q_elems()));
  for (std::size_t i = 0; i < problem.q.size(); ++i) problem.q[i] = round_to_dtype(random_normal(seed, 0, i), dtype);
  // The oracle on every sequence when that is quick, else on the first two.
  const double oracle_work = double(layout.q_elems()) * context;
  problem.checked_seqs = !opt.check ? 0 : (opt.full_check || oracle_work < 4e8) ? sequences : std::min(2, sequences);
  if (problem.checked_seqs > 0) {
    view.k = k_mirror.data();
    view.v = v_mirror.data();
    const std::vector<std::vector<int>> tables(problem.tables.begin(), problem.tables.begin() + problem.checked_seqs);
    const std::vector<int> lens(problem.lens.begin(), problem.lens.begin() + problem.checked_seqs);
    problem.ref = reference_paged_decode(view, layout.heads_q, problem.q.data(), tables, lens, query_len);
  }
  DecodeDeviceInputs inputs;
  {
    std::vector<uint16_t> q_raw(problem.q.size());
    encode_elements(dtype, problem.q.data(), q_raw.data(), q_raw.size());
    inputs.q = DeviceBuffer(q_raw.size() * 2);
    inputs.q.upload(q_raw.data(), q_raw.size() * 2);
    std::vector<int> tables(std::size_t(sequences) * layout.max_blocks_per_seq, -1);
    for (int i = 0; i < sequences; ++i)
      std::copy(problem.tables[i].begin(), problem.tables[i].end(),
                tables.begin() + std::size_t(i) * layout.max_blocks_per_seq);
    inputs.tables = DeviceBuffer(tables.size() * sizeof(int));
    inputs.tables.upload(tables.data(), tables.size() * sizeof(int));
    inputs.lens = DeviceBuffer(problem.lens.size() * sizeof(int));
    inputs.lens.upload(problem.lens.data(), problem.lens.size() * sizeof(int));
    inputs.k_cache = std::move(k_cache);
    inputs.v_cache = std::move(v_cache);
  }
  std::printf("oracle: %s; K/V read per step: %.1f MB\n\n",
              problem.checked_seqs == sequences ? "every sequence"
              : problem.checked_seqs > 0        ? "the first two sequences (--full-check: all)"
                                                : "none (--no-check)",
              problem.kv_bytes() / 1e6);
  std::printf("%-22s %-5s %-8s %9s %9s %10s  %s\n", "kernel", "dtype", "status", "time ms", "GB/s", "memory MiB",
              "O and LSE vs fp64");
  bool all_passed = true;
  for (const DecodeKernel* k : kernels) {
    if (!variant_matches(*k, opt.variant)) continue;
    if (k->dtype != dtype) continue;  // the serving step wrote a bf16 cache
    const DecodeRunResult r = run_decode(*k, problem, inputs, opt.iters);
    if (!r.ran) {
      std::printf("%-22s %-5s %-8s  %s\n", k->name.c_str(), dtype_name(k->dtype), r.error.empty() ? "skipped" : "error",
                  (r.error.empty() ? r.skipped : r.error).c_str());
      all_passed = all_passed && r.error.empty();
      continue;
    }
    all_passed = all_passed && r.passed;
    std::printf("%-22s %-5s %-8s %9.3f %9.0f %10.1f  %s\n", k->name.c_str(), dtype_name(k->dtype),
                r.passed ? "ok" : "FAILED", r.time_ms, r.gbps, r.device_mib, r.summary().c_str());
    if (!r.passed && r.report.checked > 0) std::printf("%s", r.report.details().c_str());
  }
  std::printf("\n(fp16 kernels: fa_bench --decode and the GPU tests run them; this step's cache is bf16.)\n");
  return all_passed ? 0 : 1;
}

}  // namespace
}  // namespace fa::paged

int main(int argc, char** argv) {
  using namespace fa;
  const std::vector<const DecodeKernel*> kernels = [] {
    std::vector<const DecodeKernel*> out;
    for (const DecodeKernel& k : decode_kernels())
      if (k.chapter == 8) out.push_back(&k);
    return out;
  }();
  ChapterBody body;
  body.help_notes =
      "\nIn this chapter --batch is the number of sequences (groups of up to 4 samples sharing a prompt),\n"
      "--seq-kv the context length, --seq-q the query tokens per sequence (1 = decode).\n"
      "Defaults: --batch 8 --heads 32 --heads-kv 8 --seq-q 1 --seq-kv 8192 --dim 128.\n";
  body.print_variants = [&] {
    for (const DecodeKernel* k : kernels)
      std::printf("  %d  %-12s %-22s %-5s %s\n", k->number, k->variant.c_str(), k->name.c_str(), dtype_name(k->dtype),
                  k->summary.c_str());
  };
  body.require_variant = [&](const std::string& variant) { require_known_variant(kernels, variant, 8); };
  body.run = [&](const CliOptions& opt, int argc_, const char* const* argv_) {
    return paged::run_chapter(opt, argc_, argv_, kernels);
  };
  return chapter_main(argc, argv,
                      {8, "ch08_paged_attention", "Paged attention: a serving step over a paged KV cache, then decode"},
                      body);
}
