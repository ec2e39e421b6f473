// Chapter 10's other way across GPUs: DeepSpeed-Ulysses. Where the ring (algorithm.h) keeps each
// rank's queries and moves K and V past them, Ulysses trades the sequence split for a head split:
// one all-to-all gives every rank the whole sequence of some heads, each rank runs ordinary
// attention (and its backward) on those heads, and a second all-to-all gives the output back by
// sequence. The ranks are simulated in one process as in algorithm.h, whose split, shards and
// block loops this file uses.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "algorithm.h"

namespace fa::context_parallel {

/// A contiguous range of heads [first, first + count).
struct HeadRange {
  int first = 0;
  int count = 0;
};

/// Throws std::invalid_argument unless Ulysses can split these heads over `ranks` ranks.
inline void check_ulysses_heads(const AttentionShape& s, int ranks) {
  if (s.heads_q % ranks != 0) {
    std::string allowed;
    for (int n = 1; n <= s.heads_q; ++n)  // the rank counts both rules allow
      if (s.heads_q % n == 0 && (s.heads_kv % n == 0 || n % s.heads_kv == 0))
        allowed += (allowed.empty() ? "" : ", ") + std::to_string(n);
    throw std::invalid_argument("Ulysses splits the query heads over the ranks: heads_q (" + std::to_string(s.heads_q) +
                                ") must be a multiple of ranks (" + std::to_string(ranks) +
                                "); allowed ranks: " + allowed);
  }
  if (s.heads_kv % ranks != 0 && ranks % s.heads_kv != 0)
    throw std::invalid_argument(
        "Ulysses splits the K/V heads over the ranks, or copies each to several ranks: "
        "heads_kv (" +
        std::to_string(s.heads_kv) + ") and ranks (" + std::to_string(ranks) + ") must divide one another");
}

/// The query heads rank `rank` owns between the two all-to-alls ...
inline HeadRange ulysses_q_heads(const AttentionShape& s, int ranks, int rank) {
  return {rank * (s.heads_q / ranks), s.heads_q / ranks};
}
/// ... and the K/V heads those query heads read: heads_kv / N of them when N divides heads_kv,
/// else the one K/V head of their group, which then lives on N / heads_kv ranks (a copy each).
inline HeadRange ulysses_kv_heads(const AttentionShape& s, int ranks, int rank) {
  if (s.heads_kv % ranks == 0) return {rank * (s.heads_kv / ranks), s.heads_kv / ranks};
  return {s.kv_head(ulysses_q_heads(s, ranks, rank).first), 1};
}

/// One all-to-all: outbox[src][dst] is what rank src sends to rank dst; returns inbox[dst][src].
/// (With NCCL: one ncclSend and one ncclRecv per pair of ranks inside one group call.) A rank's
/// message to itself is a local copy and is not counted as sent.
inline std::vector<Shards> all_to_all(std::vector<Shards> outbox, std::vector<int64_t>& floats_sent) {
  const int n = int(outbox.size());
  std::vector<Shards> inbox(n, Shards(n));
  for (int src = 0; src < n; ++src)
    for (int dst = 0; dst < n; ++dst) {
      if (src != dst) floats_sent[src] += int64_t(outbox[src][dst].size());
      inbox[dst][src] = std::move(outbox[src][dst]);
    }
  return inbox;
}

/// Sequence shards [batch, heads, rows(r), width] to head shards [batch, range(r).count, seq,
/// width]: rank src sends to rank dst its rows of the heads dst owns, and dst puts each row at
/// its global position.
template <class Range>
inline Shards sequence_to_heads(const Shards& shards, int batch, int heads, int width, const SequenceSplit& split,
                                Range range, std::vector<int64_t>& floats_sent) {
  const int n = split.ranks;
  std::vector<Shards> outbox(n, Shards(n));
  for (int src = 0; src < n; ++src) {
    const int64_t rows = split.rows(src);
    for (int dst = 0; dst < n; ++dst) {
      const HeadRange heads_dst = range(dst);
      for (int b = 0; b < batch; ++b) {  // [batch, heads_dst, rows, width]: contiguous per head
        const float* from = shards[src].data() + (int64_t(b) * heads + heads_dst.first) * rows * width;
        outbox[src][dst].insert(outbox[src][dst].end(), from, from + heads_dst.count * rows * width);
      }
    }
  }
  const std::vector<Shards> inbox = all_to_all(std::move(outbox), floats_sent);
  Shards out(n);
  for (int dst = 0; dst < n; ++dst) {
    const int count = range(dst).count;
    out[dst].resize(int64_t(batch) * count * split.seq * width);
    for (int src = 0; src < n; ++src) {
      const std::vector<int> pos = split.positions(src);
      const float* from = inbox[dst][src].data();
      for (int64_t bh = 0; bh < int64_t(batch) * count; ++bh)
        for (int pos_i : pos) {
          std::copy_n(from, width, out[dst].begin() + (bh * split.seq + pos_i) * width);
          from += width;
        }
    }
  }
  return out;
}

/// The way back: head shards [batch, range(r).count, seq, width] to sequence shards [batch,
/// heads, rows(r), width]. It ADDS what it receives: a row of O arrives once, but the dK and dV
/// of a K/V head that was copied to several ranks arrive once per copy, each the partial sum of
/// that rank's query heads, and the way back is where they are summed.
template <class Range>
inline Shards heads_to_sequence(const Shards& shards, int batch, int heads, int width, const SequenceSplit& split,
                                Range range, std::vector<int64_t>& floats_sent) {
  const int n = split.ranks;
  std::vector<Shards> outbox(n, Shards(n));
  for (int src = 0; src < n; ++src) {
    const int count = range(src).count;
    for (int dst = 0; dst < n; ++dst)
      for (int64_t bh = 0; bh < int64_t(batch) * count; ++bh)
        for (int pos_i : split.positions(dst)) {
          const float* from = shards[src].data() + (bh * split.seq + pos_i) * width;
          outbox[src][dst].insert(outbox[src][dst].end(), from, from + width);
        }
  }
  const std::vector<Shards> inbox = all_to_all(std::move(outbox), floats_sent);
  Shards out(n);
  for (int dst = 0; dst < n; ++dst) {
    const int64_t rows = split.rows(dst);
    out[dst].assign(int64_t(batch) * heads * rows * width, 0.0f);
    for (int src = 0; src < n; ++src) {
      const HeadRange heads_src = range(src);
      const float* from = inbox[dst][src].data();
      for (int b = 0; b < batch; ++b) {
        float* to = out[dst].data() + (int64_t(b) * heads + heads_src.first) * rows * width;
        for (int64_t i = 0; i < heads_src.count * rows * width; ++i) to[i] += *from++;
      }
    }
  }
  return out;
}

struct UlyssesForward {
  Shards o, lse;                     // sequence shards, as ring_attention_forward returns them
  std::vector<int64_t> work;         // scores each rank computed (all batches and its heads)
  std::vector<int64_t> floats_sent;  // by each rank, over the five all-to-alls (Q, K, V in; O and LSE out)
};

//! [ulysses_forward]
/// DeepSpeed-Ulysses' forward: all-to-all Q, K, V from sequence shards to head shards, run
/// plain attention over the whole sequence on each rank's heads, all-to-all O and LSE back.
/// Any split works: the all-to-all puts every row at its global position. Between the two
/// exchanges the causal work is balanced by construction (every rank has the whole sequence).
inline UlyssesForward ulysses_attention_forward(const AttentionShape& s, const SequenceSplit& split, const Shards& q,
                                                const Shards& k, const Shards& v) {
  check_problem(s, split, {{&q, s.heads_q}, {&k, s.heads_kv}, {&v, s.heads_kv}});
  const int n = split.ranks, d = s.head_dim;
  check_ulysses_heads(s, n);
  auto q_range = [&](int r) { return ulysses_q_heads(s, n, r); };
  auto kv_range = [&](int r) { return ulysses_kv_heads(s, n, r); };
  UlyssesForward out;
  out.work.assign(n, 0);
  out.floats_sent.assign(n, 0);
  const Shards q_heads = sequence_to_heads(q, s.batch, s.heads_q, d, split, q_range, out.floats_sent);
  const Shards k_heads = sequence_to_heads(k, s.batch, s.heads_kv, d, split, kv_range, out.floats_sent);
  const Shards v_heads = sequence_to_heads(v, s.batch, s.heads_kv, d, split, kv_range, out.floats_sent);
  const std::vector<Chunk> whole{{0, s.seq_q}};
  const int64_t seq = s.seq_q;
  Shards o_heads(n), lse_heads(n);
  for (int r = 0; r < n; ++r) {  // on GPUs: any single-GPU attention kernel, on heads_q / N heads
    const HeadRange qh = q_range(r), kvh = kv_range(r);
    o_heads[r].resize(q_heads[r].size());
    lse_heads[r].resize(int64_t(s.batch) * qh.count * seq);
    for (int b = 0; b < s.batch; ++b)
      for (int h = 0; h < qh.count; ++h) {
        const int64_t bh = int64_t(b) * qh.count + h;
        const int64_t kvo = (int64_t(b) * kvh.count + s.kv_head(qh.first + h) - kvh.first) * seq * d;
        out.work[r] += block_forward(q_heads[r].data() + bh * seq * d, whole, k_heads[r].data() + kvo,
                                     v_heads[r].data() + kvo, whole, d, float(s.softmax_scale()), s.causal,
                                     o_heads[r].data() + bh * seq * d, lse_heads[r].data() + bh * seq);
      }
  }
  out.o = heads_to_sequence(o_heads, s.batch, s.heads_q, d, split, q_range, out.floats_sent);
  out.lse = heads_to_sequence(lse_heads, s.batch, s.heads_q, 1, split, q_range, out.floats_sent);
  return out;
}
//! [ulysses_forward]

struct UlyssesBackward {
  Shards dq, dk, dv;                 // sequence shards, as ring_attention_backward returns them
  std::vector<int64_t> floats_sent;  // by each rank: Q, K, V, O, dO, LSE in; dQ, dK, dV out
};

//! [ulysses_backward]
/// DeepSpeed-Ulysses' backward: the same exchange around chapter 07's backward. All-to-all Q, K,
/// V, O, dO and LSE to head shards, each rank's backward over the whole sequence for its heads
/// (block_backward with one block), all-to-all dQ, dK and dV back, adding the copies of a K/V
/// head's dK/dV when heads_kv < N.
inline UlyssesBackward ulysses_attention_backward(const AttentionShape& s, const SequenceSplit& split, const Shards& q,
                                                  const Shards& k, const Shards& v, const Shards& o, const Shards& lse,
                                                  const Shards& d_o) {
  check_problem(s, split, {{&q, s.heads_q}, {&k, s.heads_kv}, {&v, s.heads_kv}, {&o, s.heads_q}, {&d_o, s.heads_q}});
  const int n = split.ranks, d = s.head_dim;
  check_ulysses_heads(s, n);
  auto q_range = [&](int r) { return ulysses_q_heads(s, n, r); };
  auto kv_range = [&](int r) { return ulysses_kv_heads(s, n, r); };
  UlyssesBackward out;
  out.floats_sent.assign(n, 0);
  auto to_heads = [&](const Shards& x, int heads, int width, auto range) {
    return sequence_to_heads(x, s.batch, heads, width, split, range, out.floats_sent);
  };
  const Shards q_h = to_heads(q, s.heads_q, d, q_range), k_h = to_heads(k, s.heads_kv, d, kv_range);
  const Shards v_h = to_heads(v, s.heads_kv, d, kv_range), o_h = to_heads(o, s.heads_q, d, q_range);
  const Shards do_h = to_heads(d_o, s.heads_q, d, q_range), lse_h = to_heads(lse, s.heads_q, 1, q_range);
  const std::vector<Chunk> whole{{0, s.seq_q}};
  const int64_t seq = s.seq_q;
  Shards dq_h(n), dk_h(n), dv_h(n);
  std::vector<float> delta(seq);
  for (int r = 0; r < n; ++r) {
    const HeadRange qh = q_range(r), kvh = kv_range(r);
    dq_h[r].assign(q_h[r].size(), 0.0f);
    dk_h[r].assign(k_h[r].size(), 0.0f);
    dv_h[r].assign(v_h[r].size(), 0.0f);
    for (int b = 0; b < s.batch; ++b)
      for (int h = 0; h < qh.count; ++h) {
        const int64_t qo = (int64_t(b) * qh.count + h) * seq * d;
        const int64_t kvo = (int64_t(b) * kvh.count + s.kv_head(qh.first + h) - kvh.first) * seq * d;
        for (int64_t i = 0; i < seq; ++i) delta[i] = dot(do_h[r].data() + qo + i * d, o_h[r].data() + qo + i * d, d);
        block_backward(q_h[r].data() + qo, do_h[r].data() + qo, lse_h[r].data() + qo / d, delta.data(), whole,
                       k_h[r].data() + kvo, v_h[r].data() + kvo, whole, d, float(s.softmax_scale()), s.causal,
                       dq_h[r].data() + qo, dk_h[r].data() + kvo, dv_h[r].data() + kvo);
      }
  }
  out.dq = heads_to_sequence(dq_h, s.batch, s.heads_q, d, split, q_range, out.floats_sent);
  out.dk = heads_to_sequence(dk_h, s.batch, s.heads_kv, d, split, kv_range, out.floats_sent);
  out.dv = heads_to_sequence(dv_h, s.batch, s.heads_kv, d, split, kv_range, out.floats_sent);
  return out;
}
//! [ulysses_backward]

}  // namespace fa::context_parallel
