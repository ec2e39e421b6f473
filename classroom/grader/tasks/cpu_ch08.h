// Chapter 08's tasks for the CPU runner (runner_cpu.cpp, built with
// -DFA_RUNNER_TASKS="tasks/cpu_ch08.h"): split-KV decoding from a paged cache, and a block manager
// script's trace. It includes that chapter's code and nothing else.
#pragma once

#include <exception>
#include <vector>

#include "../../../chapters/08_paged_attention/algorithm.h"
#include "../../../chapters/08_paged_attention/block_manager.h"
#include "../protocol.h"

namespace fa::grader {

constexpr int kRunnerChapter = 8;

/// Computes the answer to `h` into `out`; false when this chapter has no such task.
inline bool run_chapter_task(const Header& h, const std::vector<float>& in, std::vector<float>& out) {
  if (h.task == "decode") {  // one query token per sequence from a paged cache, split-KV
    PagedKvView cache;
    cache.num_blocks = int(h.num("blocks"));
    cache.block_size = int(h.num("block_size"));
    cache.heads_kv = int(h.num("hkv"));
    cache.head_dim = int(h.num("d"));
    const int seqs = int(h.num("seqs")), heads_q = int(h.num("hq")), max_blocks = int(h.num("max_blocks"));
    const std::size_t cache_floats = std::size_t(cache.num_blocks) * cache.heads_kv * cache.block_size * cache.head_dim;
    const auto p = pieces(in, {std::size_t(seqs) * heads_q * cache.head_dim, cache_floats, cache_floats,
                               std::size_t(seqs) * max_blocks, std::size_t(seqs)});
    cache.k = p[1];
    cache.v = p[2];
    std::vector<std::vector<int> > tables(seqs);
    std::vector<int> lens(seqs);
    for (int s = 0; s < seqs; ++s) {
      lens[s] = int(p[4][s]);
      for (int b = 0; b < max_blocks; ++b) tables[s].push_back(int(p[3][std::size_t(s) * max_blocks + b]));
    }
    std::vector<float> o(std::size_t(seqs) * heads_q * cache.head_dim), lse(std::size_t(seqs) * heads_q);
    paged::split_kv_decode_cpu(cache, heads_q, p[0], tables, lens, int(h.num("partition")), o.data(), lse.data());
    out = o;
    out.insert(out.end(), lse.begin(), lse.end());
    return true;
  }
  if (h.task == "merge") {  // one row's partitions (LSE_p, then O_p of d values each) -> O (d values), LSE
    const int parts = int(h.num("parts")), d = int(h.num("d"));
    const auto p = pieces(in, {std::size_t(parts), std::size_t(parts) * d});
    const std::vector<float> partial_lse(p[0], p[0] + parts), partial_o(p[1], p[1] + std::size_t(parts) * d);
    out.assign(std::size_t(d) + 1, 0.0f);
    paged::merge_partitions_cpu(partial_o, partial_lse, d, out.data(), &out[std::size_t(d)]);
    return true;
  }
  if (h.task == "block_manager") {  // a script of (op, a, b) triples -> a trace of what happened
    // ops: 0 add_sequence, 1 fork(a), 2 append(a, b tokens), 3 release(a). Per op the trace holds
    // 1 (done) or 0 (threw), then, after an append, the copies it recorded (count, from, to ...);
    // at the end, per live sequence in id order: id, length, table size, the table; then the
    // free-block count.
    paged::BlockManager bm(int(h.num("blocks")), int(h.num("block_size")));
    const int ops = int(h.num("ops"));
    pieces(in, {std::size_t(ops) * 3});
    for (int i = 0; i < ops; ++i) {
      const int op = int(in[3 * i]), a = int(in[3 * i + 1]), b = int(in[3 * i + 2]);
      try {
        if (op == 0) bm.add_sequence();
        else if (op == 1) bm.fork(a);
        else if (op == 2) bm.append(a, b);
        else bm.release(a);
        out.push_back(1.0f);
      } catch (const std::exception&) {
        out.push_back(0.0f);
      }
      if (op == 2) {
        const auto copies = bm.take_copies();
        out.push_back(float(copies.size()));
        for (const auto& c : copies) {
          out.push_back(float(c.from));
          out.push_back(float(c.to));
        }
      }
    }
    for (int seq : bm.sequences()) {
      out.push_back(float(seq));
      out.push_back(float(bm.length(seq)));
      out.push_back(float(bm.block_table(seq).size()));
      for (int b : bm.block_table(seq)) out.push_back(float(b));
    }
    out.push_back(float(bm.free_blocks()));
    return true;
  }
  return false;
}

}  // namespace fa::grader
