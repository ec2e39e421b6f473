// The grader's CPU runner: one chapter's algorithm.h (the student's code) and nothing else. It
// reads one request from stdin (protocol.h), computes the outputs with the chapter's functions
// and writes them to stdout. It holds no oracle and no other chapter's code: tools/grade.py
// builds it once per chapter with g++, -DFA_RUNNER_CHAPTER=N, from the grader's copy of the
// tree, where only the exercises' regions come from the student.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "problem.h"
#include "protocol.h"

#if FA_RUNNER_CHAPTER == 1
#include "../../chapters/01_naive_attention/algorithm.h"
#elif FA_RUNNER_CHAPTER == 2
#include "../../chapters/02_safe_softmax/algorithm.h"
#elif FA_RUNNER_CHAPTER == 3
#include "../../chapters/03_online_softmax/algorithm.h"
#elif FA_RUNNER_CHAPTER == 4
#include "../../chapters/04_flash_attention_v1/algorithm.h"
#elif FA_RUNNER_CHAPTER == 5
#include "../../chapters/05_flash_attention_v2/algorithm.h"
#elif FA_RUNNER_CHAPTER == 6
#include "../../chapters/06_flash_attention_v3/algorithm.h"
#elif FA_RUNNER_CHAPTER == 7
#include "../../chapters/07_backward/algorithm.h"
#elif FA_RUNNER_CHAPTER == 8
#include "../../chapters/08_paged_attention/algorithm.h"
#include "../../chapters/08_paged_attention/block_manager.h"
#else
#error "FA_RUNNER_CHAPTER must be 1 to 8"
#endif

namespace fa::grader {
namespace {

std::vector<float> run(const Header& h, const std::vector<float>& in) {
  std::vector<float> out;
#if FA_RUNNER_CHAPTER == 1
  if (h.task == "scores") {  // S of every head: [B * Hq][Nq][Nk]
    const AttentionShape s = shape_of(h);
    const auto p = pieces(in, {std::size_t(s.q_elems()), std::size_t(s.kv_elems())});
    const auto products = h.str("products") == "tiled" ? naive::Products::Tiled : naive::Products::PerThread;
    std::vector<float> scores;
    for (int bh = 0; bh < s.batch * s.heads_q; ++bh) {
      naive::scores_cpu(s, p[0] + s.q_head_offset(bh), p[1] + s.kv_head_offset(bh), scores, products);
      out.insert(out.end(), scores.begin(), scores.end());
    }
    return out;
  }
#elif FA_RUNNER_CHAPTER == 2
  if (h.task == "safe_row") {  // rows x n scores -> rows x n probabilities, then rows LSEs
    const int rows = int(h.num("rows")), n = int(h.num("n"));
    pieces(in, {std::size_t(rows) * n});
    out.assign(in.begin(), in.begin() + std::size_t(rows) * n);
    std::vector<float> lse(rows);
    for (int r = 0; r < rows; ++r) lse[r] = safe::safe_softmax_row(out.data() + std::size_t(r) * n, n);
    out.insert(out.end(), lse.begin(), lse.end());
    return out;
  }
#elif FA_RUNNER_CHAPTER == 3
  if (h.task == "online_update") {  // each row folded in one score at a time -> (m, l) per row
    const int rows = int(h.num("rows")), n = int(h.num("n"));
    pieces(in, {std::size_t(rows) * n});
    for (int r = 0; r < rows; ++r) {
      online::MaxSum state{-INFINITY, 0.0f};
      for (int j = 0; j < n; ++j) state = online::online_update(state, in[std::size_t(r) * n + j]);
      out.push_back(state.m);
      out.push_back(state.l);
    }
    return out;
  }
  if (h.task == "online_merge") {  // (m_a, l_a, m_b, l_b) per pair -> (m, l)
    const int pairs = int(h.num("pairs"));
    pieces(in, {std::size_t(pairs) * 4});
    for (int i = 0; i < pairs; ++i) {
      const float* x = in.data() + std::size_t(i) * 4;
      const online::MaxSum merged = online::online_merge({x[0], x[1]}, {x[2], x[3]});
      out.push_back(merged.m);
      out.push_back(merged.l);
    }
    return out;
  }
#elif FA_RUNNER_CHAPTER == 4 || FA_RUNNER_CHAPTER == 5
  if (h.task == "row_step") {
    // One call of the chapter's row step per row, each from a state the checker chose: per row
    // (m, l, o[d]), `cols` scores, the number of keys, and the tile's cols x d values of V in;
    // (m, l, o[d]) after the step out. Each call gets fresh copies, so a step can only compute
    // its answer from what it is given.
    const int rows = int(h.num("rows")), cols = int(h.num("cols")), d = int(h.num("d"));
    const auto p = pieces(
        in, {std::size_t(rows) * (2 + d), std::size_t(rows) * cols, std::size_t(rows), std::size_t(rows) * cols * d});
    for (int r = 0; r < rows; ++r) {
      const float* state = p[0] + std::size_t(r) * (2 + d);
      float m = state[0], l = state[1];
      std::vector<float> o(state + 2, state + 2 + d),
          row(p[1] + std::size_t(r) * cols, p[1] + std::size_t(r + 1) * cols);
      const std::vector<float> v(p[3] + std::size_t(r) * cols * d, p[3] + std::size_t(r + 1) * cols * d);
      float tile_max = -INFINITY;
      for (float x : row) tile_max = std::fmax(tile_max, x);
      const int keys = int(p[2][r]);
#if FA_RUNNER_CHAPTER == 4
      flash1::flash1_row_step(row.data(), cols, tile_max, m, l, o.data(), v.data(), keys, d);
#else
      flash2::flash2_row_step(row.data(), tile_max, m, l, o.data(), v.data(), keys, d);
#endif
      out.push_back(m);
      out.push_back(l);
      out.insert(out.end(), o.begin(), o.end());
    }
    return out;
  }
  if (h.task == "forward") {  // O [B,Hq,Nq,d] then LSE [B,Hq,Nq]
    const AttentionShape s = shape_of(h);
    const auto p = pieces(in, {std::size_t(s.q_elems()), std::size_t(s.kv_elems()), std::size_t(s.kv_elems())});
    std::vector<float> o(s.q_elems()), lse(s.lse_elems());
#if FA_RUNNER_CHAPTER == 4
    const auto order = h.str("order") == "q_outer" ? flash1::LoopOrder::QOuter : flash1::LoopOrder::KvOuter;
    flash1::flash_attention_v1_cpu(s, p[0], p[1], p[2], o.data(), lse.data(), order, flash1::choose_tiles(s.head_dim));
#else
    flash2::flash_attention_v2_cpu(s, p[0], p[1], p[2], o.data(), lse.data());
#endif
    out = o;
    out.insert(out.end(), lse.begin(), lse.end());
    return out;
  }
#elif FA_RUNNER_CHAPTER == 6
  if (h.task == "tail_pieces") {  // (blocks, slots, tiles) triples -> pieces
    const int n = int(h.num("n"));
    pieces(in, {std::size_t(n) * 3});
    for (int i = 0; i < n; ++i)
      out.push_back(float(flash3::tail_pieces(int(in[3 * i]), int(in[3 * i + 1]), int(in[3 * i + 2]))));
    return out;
  }
#elif FA_RUNNER_CHAPTER == 7
  if (h.task == "backward") {  // q, k, v, o, lse, dO in; dQ, dK, dV out
    const AttentionShape s = shape_of(h);
    const std::size_t nq = s.q_elems(), nk = s.kv_elems();
    const auto p = pieces(in, {nq, nk, nk, nq, std::size_t(s.lse_elems()), nq});
    std::vector<float> dq(nq), dk(nk), dv(nk);
    backward::flash_backward_cpu(s, p[0], p[1], p[2], p[3], p[4], p[5], dq.data(), dk.data(), dv.data());
    out = dq;
    out.insert(out.end(), dk.begin(), dk.end());
    out.insert(out.end(), dv.begin(), dv.end());
    return out;
  }
#elif FA_RUNNER_CHAPTER == 8
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
    return out;
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
    return out;
  }
#endif
  throw std::runtime_error("chapter " + std::to_string(FA_RUNNER_CHAPTER) + "'s runner has no task '" + h.task + "'");
}

}  // namespace
}  // namespace fa::grader

int main() {
  return fa::grader::serve([](const fa::grader::Header& h, const std::vector<float>& in) {
    return fa::grader::Answer{fa::grader::run(h, in)};
  });
}
