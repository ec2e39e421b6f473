// The checker's cases for chapter 08's exercises: the block manager's copy-on-write (its trace
// against the instructor's BlockManager), and split-KV decoding with the exact merge of its
// partitions on the CPU and in the merge kernel, against the oracle's paged decode.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "../../../chapters/08_paged_attention/block_manager.h"
#include "../answers.h"
#include "../cases.h"
#include "compare.h"
#include "reference.h"

namespace fa::grader {
namespace {

std::vector<Case> block_manager_cases(Rng& rng) {
  std::vector<Case> cases;
  for (int round = 0; round < 4; ++round) {
    // A weighted script must make the instructor's manager copy on write at least once: without
    // a copy, a stub that throws on the copy (or skips it) gives the same trace. Scripts are
    // drawn until one does; block_size 1 never copies (a block is full after one token).
    Case c;
    int copies_made = 0;
    do {
      c = Case{};
      copies_made = 0;
      const int blocks = round == 0 ? 4 : uniform(rng, 6, 40), block_size = 1 << uniform(rng, round == 0 ? 0 : 1, 4);
      const int ops = round == 0 ? 2 : uniform(rng, 60, 200);
      c.header.task = "block_manager";
      c.header.args = {
          {"blocks", std::to_string(blocks)}, {"block_size", std::to_string(block_size)}, {"ops", std::to_string(ops)}};
      c.name = "block_manager blocks=" + std::to_string(blocks) + " block_size=" + std::to_string(block_size) +
               " ops=" + std::to_string(ops);
      c.weight = round == 0 ? 0 : 1;
      // The trace the instructor's BlockManager gives for the same script.
      paged::BlockManager bm(blocks, block_size);
      std::vector<float> want;
      int next_id = 0;
      for (int i = 0; i < ops; ++i) {
        int op = round == 0 ? (i == 0 ? 0 : 2) : uniform(rng, 0, 9);
        op = op == 0 ? 0 : op <= 2 ? 1 : op <= 7 ? 2 : 3;
        if (next_id == 0) op = 0;
        const int a = next_id ? uniform(rng, 0, next_id - 1) : 0,
                  b = round == 0 ? 1 : uniform(rng, 0, 2 * block_size + 1);
        c.input.insert(c.input.end(), {float(op), float(a), float(b)});
        try {
          if (op == 0) next_id = bm.add_sequence() + 1;
          else if (op == 1) next_id = bm.fork(a) + 1;
          else if (op == 2) bm.append(a, b);
          else bm.release(a);
          want.push_back(1.0f);
        } catch (const std::exception&) {
          want.push_back(0.0f);
        }
        if (op == 2) {
          const auto copies = bm.take_copies();
          copies_made += int(copies.size());
          want.push_back(float(copies.size()));
          for (const auto& cp : copies) want.insert(want.end(), {float(cp.from), float(cp.to)});
        }
      }
      for (int seq : bm.sequences()) {
        want.insert(want.end(), {float(seq), float(bm.length(seq)), float(bm.block_table(seq).size())});
        for (int b : bm.block_table(seq)) want.push_back(float(b));
      }
      want.push_back(float(bm.free_blocks()));
      c.expect_values = 0;  // the trace's length depends on what happened
      c.judge = [=](const std::vector<float>& out) -> std::string {
        const std::size_t n = std::min(out.size(), want.size());
        for (std::size_t i = 0; i < n; ++i)
          if (out[i] != want[i])
            // The expected trace is the solution's own: where it differs is said, not what it holds.
            return "the trace differs from the expected one at value " + std::to_string(i) + " (got " + fmt(out[i]) +
                   "): tables, copies or free blocks are not what fork/append/release give";
        if (out.size() != want.size())
          return "the trace has " + std::to_string(out.size()) + " values, not the expected number";
        return "";
      };
    } while (round > 0 && copies_made == 0);
    cases.push_back(c);
  }
  return cases;
}

/// One decode batch on a paged cache; q_magnitude: Q drawn that much larger than the cache
/// (kLargeScores: each partition's LSE past exp's float range, so a merge that does not take
/// the largest out first overflows).
Case decode_case(Rng& rng, const std::string& kernel, DType dtype, int d, int max_len, bool trivial,
                 double q_magnitude = 1) {
  Case c;
  const int block_size = 16, seqs = trivial ? 1 : uniform(rng, 2, 5), heads_kv = uniform(rng, 1, 2);
  const int heads_q = heads_kv * (trivial ? 1 : uniform(rng, 1, 4));
  std::vector<int> lens(seqs);
  for (int s = 0; s < seqs; ++s) lens[s] = trivial ? 1 : (s == 0 ? 0 : s == 1 ? 1 : uniform(rng, 2, max_len));
  int max_blocks = 1, total_blocks = 0, max_context = 0;
  for (int len : lens) {
    max_blocks = std::max(max_blocks, (len + block_size - 1) / block_size);
    total_blocks += (len + block_size - 1) / block_size;
    max_context = std::max(max_context, len);
  }
  const int num_blocks = std::max(1, total_blocks + 3);
  std::vector<int> pool(num_blocks);
  for (int i = 0; i < num_blocks; ++i) pool[i] = i;
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<std::vector<int>> tables(seqs);
  std::vector<float> table_in;
  int next = 0;
  for (int s = 0; s < seqs; ++s) {
    for (int b = 0; b < max_blocks; ++b) {
      const bool used = b < (lens[s] + block_size - 1) / block_size;
      const int block = used ? pool[next++] : 0;
      if (used) tables[s].push_back(block);
      table_in.push_back(float(block));
    }
  }
  const std::size_t cache = std::size_t(num_blocks) * heads_kv * block_size * d;
  const std::vector<float> q = rounded(normal(rng, std::size_t(seqs) * heads_q * d, float(q_magnitude)), dtype),
                           kc = rounded(normal(rng, cache), dtype), vc = rounded(normal(rng, cache), dtype);
  c.header.task = "decode";
  if (!kernel.empty()) c.header.args["kernel"] = kernel;
  c.header.args.insert({{"seqs", std::to_string(seqs)},
                        {"hq", std::to_string(heads_q)},
                        {"hkv", std::to_string(heads_kv)},
                        {"d", std::to_string(d)},
                        {"block_size", std::to_string(block_size)},
                        {"blocks", std::to_string(num_blocks)},
                        {"max_blocks", std::to_string(max_blocks)},
                        {"max_context", std::to_string(max_context)},
                        {"partition", std::to_string(block_size * uniform(rng, 1, 8))}});
  c.input = q;
  for (const std::vector<float>* part : std::initializer_list<const std::vector<float>*>{&kc, &vc, &table_in})
    c.input.insert(c.input.end(), part->begin(), part->end());
  for (int len : lens) c.input.push_back(float(len));
  c.expect_values = std::size_t(seqs) * heads_q * (d + 1);
  c.name = (kernel.empty() ? std::string("decode") : kernel) + " seqs=" + std::to_string(seqs) + " h" +
           std::to_string(heads_q) + "/" + std::to_string(heads_kv) + " d" + std::to_string(d) +
           " ctx<=" + std::to_string(max_context) + (q_magnitude != 1 ? ", scores past exp's float range" : "");
  c.weight = trivial ? 0 : 1;
  // Large scores are judged at bf16's tolerance (their rounding grows with them; what they check
  // is that the merge stays finite).
  const double tol = dtype == DType::BF16 || q_magnitude != 1 ? 2e-2 : dtype == DType::F32 ? 1e-5 : 4e-3;
  c.judge = [=](const std::vector<float>& out) -> std::string {
    PagedKvView view;
    view.num_blocks = num_blocks;
    view.block_size = block_size;
    view.heads_kv = heads_kv;
    view.head_dim = d;
    view.k = kc.data();
    view.v = vc.data();
    const DecodeReference ref = reference_paged_decode(view, heads_q, q.data(), tables, lens);
    const std::size_t no = std::size_t(seqs) * heads_q * d;
    for (std::size_t r = 0; r < std::size_t(seqs) * heads_q; ++r) {
      const float got = out[no + r];
      const double want = ref.lse[r];
      if (want == -INFINITY) {
        if (got != -INFINITY) return "row " + std::to_string(r) + " sees no key: LSE must be -inf, got " + fmt(got);
        for (int x = 0; x < d; ++x)
          if (out[r * d + x] != 0.0f) return "row " + std::to_string(r) + " sees no key: O must be 0";
      } else if (!(std::fabs(got - want) <= 1e-2)) {
        return "row " + std::to_string(r) + ": LSE = " + fmt(got) + ", expected " + fmt(want);
      }
    }
    return close_enough("O", out.data(), ref.o.data(), no, tol);
  };
  return c;
}

std::vector<Case> merge_cases(Rng& rng, bool gpu) {
  const std::string kernel = gpu ? "ch08_split_kv_bf16" : "";
  const DType dtype = gpu ? DType::BF16 : DType::F32;
  std::vector<Case> cases = {decode_case(rng, kernel, dtype, 64, 1, true)};
  for (int i = 0; i < 4; ++i)
    cases.push_back(decode_case(rng, kernel, dtype, i % 2 ? 128 : 64, gpu ? 9000 : 700, false));
  cases.push_back(decode_case(rng, kernel, dtype, 64, gpu ? 9000 : 700, false, kLargeScores));
  cases.back().gates = kUnsafeSoftmax;
  return cases;
}

/// The merge alone, on partitions the checker draws: LSEs within +-8 of a center drawn at +-(100
/// to 300), past exp's float range (88.7) either way, so a merge that does not take the largest
/// out first overflows or underflows to 0/0; one partition, none (an empty context). Every partition holds keys, as
/// in split_kv_decode_cpu. An answer that recomputes the row from the cache instead of merging
/// has no cache here.
Case merge_step_case(Rng& rng, int parts, int d) {
  Case c;
  c.header.task = "merge";
  c.header.args = {{"parts", std::to_string(parts)}, {"d", std::to_string(d)}};
  c.name = "merge of " + std::to_string(parts) + " partitions, d" + std::to_string(d);
  c.is_step = true;
  c.weight = parts == 0 ? 0 : 1;  // no partition: a trivial shape (an answer that returns -inf passes it)
  std::vector<float> lse(static_cast<std::size_t>(parts)), o = normal(rng, static_cast<std::size_t>(parts) * d);
  const float center = float(uniform(rng, 100, 300) * (uniform(rng, 0, 1) ? 1 : -1));
  std::uniform_real_distribution<float> spread(-8.0f, 8.0f);
  for (int p = 0; p < parts; ++p) lse[std::size_t(p)] = center + spread(rng);
  c.input = lse;
  c.input.insert(c.input.end(), o.begin(), o.end());
  c.expect_values = std::size_t(d) + 1;
  // The exact merge in fp64 (answers.h).
  std::vector<double> want;
  double total = 0;
  merge_answer(lse, o, parts, d, want, total);
  c.from_answers = true;
  c.judge = [=](const std::vector<float>& out) -> std::string {
    const float got = out[std::size_t(d)];
    if (total == -INFINITY) {
      if (got != -INFINITY) return "no partition saw a key: LSE must be -inf, got " + fmt(got);
      for (int x = 0; x < d; ++x)
        if (out[std::size_t(x)] != 0.0f) return "no partition saw a key: O must be 0";
      return "";
    }
    if (!(std::fabs(got - total) <= 1e-4 * std::max(1.0, std::fabs(total))))
      return "LSE = " + fmt(got) + ", expected " + fmt(total);
    // An LSE of a few hundred is held in float to |LSE| 2^-24, and every weight e^(LSE_p - LSE)
    // inherits that error: O can be no closer than a few of those.
    return close_enough("O", out.data(), want.data(), std::size_t(d), std::max(1e-5, 4 * std::fabs(total) * 0x1p-24));
  };
  return c;
}

std::vector<Case> merge_cpu_cases(Rng& rng) {
  std::vector<Case> steps = {merge_step_case(rng, 0, 64), merge_step_case(rng, 1, 64)};
  for (int i = 0; i < 4; ++i) steps.push_back(merge_step_case(rng, uniform(rng, 2, 12), i % 2 ? 128 : 64));
  return gated(std::move(steps), merge_cases(rng, false));
}

std::vector<Case> merge_kernel_cases(Rng& rng) { return merge_cases(rng, true); }

}  // namespace

// The trace's expected values are the instructor's own BlockManager's.
FA_EXERCISE_CASES("ch08_cow_cpu", block_manager_cases, Answers::FromSolution);
FA_EXERCISE_CASES("ch08_merge_cpu", merge_cpu_cases);
FA_EXERCISE_CASES("ch08_merge", merge_kernel_cases);

}  // namespace fa::grader
