// Chapter 10 on GPUs: one rank of ring attention, in the process that owns that GPU, with NCCL
// carrying the blocks. algorithm.h is the same algorithm on the CPU with every rank in one
// process; read it first: this file keeps its names (split, chunks, source_rank, classify).
//
// Layout. A rank's shard of Q, K, V, O and their gradients is CHUNK-MAJOR: the rows of each of
// its chunks (one chunk for the contiguous split, two for zigzag) form a packed [batch, heads,
// chunk rows, head_dim] tensor of their own, one after the other. A (query chunk, key chunk)
// pair is then an ordinary attention problem that any registered kernel takes as it is, and a
// rank's K/V block travels as one buffer. LSE is chunk-major too ([batch, heads, chunk rows]
// per chunk).
//
// Packed documents (cu_seqlens, algorithm.h's Documents). Each pair is then one of chapter 09's
// variable-length problems (packed_pairs_for): its sequences are the documents that reach into
// either chunk, and the launch carries their boundaries; chapter 09's kernels take them.
//
// Two CUDA streams per rank. The compute stream runs the attention launches and the merges; the
// comm stream runs NCCL. While the compute stream works on the block it holds (step t), the comm
// stream sends that block on to rank r + 1 and receives the next one from rank r - 1 into the
// other of two buffers; CUDA events order the two streams where they share a buffer.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "algorithm.h"
#include "cuda_check.h"
#include "dtype.h"
#include "registry.h"
#include "ring_kernels.h"
#include "tensor.h"

namespace fa::context_parallel {

#define FA_NCCL_CHECK(call)                                                                                \
  do {                                                                                                     \
    const ncclResult_t fa_nccl_status = (call);                                                            \
    if (fa_nccl_status != ncclSuccess)                                                                     \
      throw std::runtime_error(std::string("NCCL: ") + #call + ": " + ncclGetErrorString(fa_nccl_status)); \
  } while (0)

/// Where each chunk of a rank's rows starts in its chunk-major shard.
struct ShardLayout {
  std::vector<Chunk> chunks;
  std::vector<int> row0;  // rows of the chunks before this one
  int rows = 0;

  explicit ShardLayout(const std::vector<Chunk>& c) : chunks(c) {
    for (const Chunk& chunk : chunks) {
      row0.push_back(rows);
      rows += chunk.length;
    }
  }
  /// Element offset of chunk i in a shard with `heads` heads (width = head_dim; 1 for the LSE).
  int64_t offset(int i, const AttentionShape& s, int heads, int width) const {
    return int64_t(s.batch) * heads * row0[i] * width;
  }
};

/// One rank's ring attention: its shards (device pointers, chunk-major) in, its outputs out, all
/// enqueued on compute_stream(). `transfer` false runs the same launches on blocks that never
/// move (their values are not the neighbours'): the compute alone, for the benchmark.
class RingRank {
 public:
  RingRank(ncclComm_t comm, int rank, const AttentionShape& global, const SequenceSplit& split,
           const ForwardKernel& forward, const BackwardKernel* backward, bool transfer = true,
           const Documents* docs = nullptr)
      : comm_(comm),
        rank_(rank),
        ranks_(split.ranks),
        s_(global),
        split_(split),
        fwd_(forward),
        bwd_(backward),
        transfer_(transfer),
        dtype_(forward.dtype) {
    if (backward && backward->dtype != forward.dtype)
      throw std::invalid_argument("the forward and backward kernels must share a dtype");
    int max_rows = 0, max_chunk = 0;
    for (int r = 0; r < ranks_; ++r) {
      max_rows = std::max(max_rows, split.rows(r));
      for (const Chunk& c : split.chunks[r]) max_chunk = std::max(max_chunk, c.length);
    }
    plan_launches(docs);
    // Every launch of this rank, checked now: a kernel that cannot take one is named before
    // anything runs. The workspaces are sized for the largest.
    std::size_t fwd_work = 0, bwd_work = 0;
    for (const std::vector<Launch>& step : steps_)
      for (const Launch& l : step) {
        const AttentionShape& shape = l.pair.shape;
        std::string why = support_reason(fwd_, shape, l.features);
        if (!why.empty()) throw std::invalid_argument(fwd_.name + " cannot take a " + shape.to_string() + ": " + why);
        if (fwd_.workspace_bytes) fwd_work = std::max(fwd_work, fwd_.workspace_bytes(shape));
        if (bwd_) {
          why = support_reason(*bwd_, shape, l.features);
          if (!why.empty())
            throw std::invalid_argument(bwd_->name + " cannot take a " + shape.to_string() + ": " + why);
          if (bwd_->workspace_bytes) bwd_work = std::max(bwd_work, bwd_->workspace_bytes(shape));
        }
      }
    const std::size_t el = dtype_size(dtype_);
    const int64_t kv_elems = kv_elements(max_rows),
                  q_chunk_elems = int64_t(s_.batch) * s_.heads_q * max_chunk * s_.head_dim;
    const int64_t rows_q = int64_t(s_.batch) * s_.heads_q * split.rows(rank_);
    for (auto& b : kv_) b = DeviceBuffer(std::size_t(2 * kv_elems) * el);
    o_part_ = DeviceBuffer(std::size_t(q_chunk_elems) * el);
    lse_part_ = DeviceBuffer(std::size_t(s_.batch) * s_.heads_q * max_chunk * sizeof(float));
    acc_ = DeviceBuffer(std::size_t(rows_q) * s_.head_dim * sizeof(float));
    fwd_workspace_ = DeviceBuffer(fwd_work);
    if (bwd_) {
      const int64_t kv_chunk_elems = int64_t(s_.batch) * s_.heads_kv * max_chunk * s_.head_dim;
      for (auto& b : dkv_) b = DeviceBuffer(std::size_t(2 * kv_elems) * sizeof(float));
      dkv_local_ = DeviceBuffer(std::size_t(2 * kv_elems) * sizeof(float));
      dq_part_ = DeviceBuffer(std::size_t(q_chunk_elems) * el);
      dk_part_ = DeviceBuffer(std::size_t(kv_chunk_elems) * el);
      dv_part_ = DeviceBuffer(std::size_t(kv_chunk_elems) * el);
      bwd_workspace_ = DeviceBuffer(bwd_work);
    }
    // The stand-in block of a run without transfers: random K and V of their own (the kernels'
    // speed depends on the data: equal scores everywhere would skip work real blocks need).
    if (!transfer_) {
      stand_in_rows_ = max_rows;
      fill_uniform(dtype_, kv_[0].get(), 2 * kv_elems, 0x5eed0000u + uint64_t(rank), nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
    }
    CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    for (auto* set : {&computed_, &received_, &d_received_})
      for (auto& e : *set) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&start_, cudaEventDisableTiming));
    marks_.resize(4 * std::size_t(ranks_));  // at most two spans per step
    for (auto& e : marks_) CUDA_CHECK(cudaEventCreate(&e));
    CUDA_CHECK(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming));
  }
  ~RingRank() {
    for (auto* set : {&computed_, &received_, &d_received_})
      for (auto& e : *set) cudaEventDestroy(e);
    cudaEventDestroy(start_);
    for (auto& e : marks_) cudaEventDestroy(e);
    cudaEventDestroy(comm_done_);
    cudaStreamDestroy(compute_);
    cudaStreamDestroy(comm_stream_);
  }
  RingRank(const RingRank&) = delete;
  RingRank& operator=(const RingRank&) = delete;

  cudaStream_t compute_stream() const { return compute_; }

  /// The compute stream's working time in the last forward or backward (ms, once it has
  /// finished): the sum over steps of the time from the moment a step had what it waits for
  /// (its block, then the block's running dK/dV) to the end of its launches. The rest of the
  /// run is waiting for a transfer, plus the start and the final rounding. A step's working time
  /// grows when the transfers beside it slow its kernels down (they share SMs and memory).
  double busy_ms() const {
    float total = 0;
    for (std::size_t i = 0; i + 1 < spans_; i += 2) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i], marks_[i + 1]));
      total += ms;
    }
    return total;
  }

  //! [gpu_ring_forward]
  /// O (chunk-major, the kernel's dtype) and LSE (chunk-major, float) of this rank's queries
  /// over the whole sequence.
  void forward(const void* q, const void* k, const void* v, void* o, float* lse) {
    const ShardLayout mine(split_.chunks[rank_]);
    const int64_t rows_q = int64_t(s_.batch) * s_.heads_q * mine.rows;
    float* o_acc = acc_.as<float>();
    fill_floats(o_acc, 0.0f, rows_q * s_.head_dim, compute_);
    fill_floats(lse, -INFINITY, rows_q, compute_);  // the merge's state: no key seen yet
    CUDA_CHECK(cudaEventRecord(start_, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, start_));  // the inputs are ready
    for (int t = 0; t < ranks_; ++t) {
      const int owner = source_rank(rank_, t, ranks_);
      const Block block = block_at(t, k, v, owner);
      if (t + 1 < ranks_) pass_block(t, block);  // the next block arrives while this one computes
      if (t > 0 && transfer_) CUDA_CHECK(cudaStreamWaitEvent(compute_, received_[(t - 1) % 2]));
      open_span(t == 0);
      const ShardLayout theirs(split_.chunks[owner]);
      for (const Launch& l : steps_[t]) {
        const PairLaunch& p = l.pair;
        ForwardParams params;
        params.shape = p.shape;
        params.features = l.features;
        params.extras = l.extras;
        params.q = at(q, mine.offset(p.q_chunk, s_, s_.heads_q, s_.head_dim));
        params.k = at(block.k, theirs.offset(p.kv_chunk, s_, s_.heads_kv, s_.head_dim));
        params.v = at(block.v, theirs.offset(p.kv_chunk, s_, s_.heads_kv, s_.head_dim));
        params.o = o_part_.get();
        params.lse = lse_part_.as<float>();
        params.workspace = fwd_workspace_.get();  // null when the kernel asks for none
        params.stream = compute_;
        fwd_.launch(params);
        CUDA_CHECK_LAUNCH();
        // Chapter 03's merge of this pair's (O, LSE) into the chunk's running state.
        const int64_t rows = int64_t(s_.batch) * s_.heads_q * p.shape.seq_q;
        merge_partial_rows(dtype_, o_acc + mine.offset(p.q_chunk, s_, s_.heads_q, s_.head_dim),
                           lse + mine.offset(p.q_chunk, s_, s_.heads_q, 1), o_part_.get(), lse_part_.as<float>(), rows,
                           s_.head_dim, compute_);
      }
      close_span();
      CUDA_CHECK(cudaEventRecord(computed_[t % 2], compute_));
    }
    round_to(dtype_, o, o_acc, rows_q * s_.head_dim, compute_);
    finish();
  }
  //! [gpu_ring_forward]

  //! [gpu_ring_backward]
  /// dQ (this rank's queries), dK and dV (this rank's keys) from the forward's O and LSE, all
  /// chunk-major. dK and dV of a block travel with it as float sums and come home after the
  /// N-th step; with a deterministic backward kernel the result repeats bit for bit.
  void backward(const void* q, const void* k, const void* v, const void* o, const float* lse, const void* d_o, void* dq,
                void* dk, void* dv) {
    if (!bwd_) throw std::logic_error("RingRank::backward without a backward kernel");
    const ShardLayout mine(split_.chunks[rank_]);
    const int64_t rows_q = int64_t(s_.batch) * s_.heads_q * mine.rows;
    float* dq_acc = acc_.as<float>();
    fill_floats(dq_acc, 0.0f, rows_q * s_.head_dim, compute_);
    CUDA_CHECK(cudaEventRecord(start_, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, start_));
    for (int t = 0; t < ranks_; ++t) {
      const int owner = source_rank(rank_, t, ranks_);
      const Block block = block_at(t, k, v, owner);
      if (t + 1 < ranks_) pass_block(t, block);
      if (t > 0 && transfer_) CUDA_CHECK(cudaStreamWaitEvent(compute_, received_[(t - 1) % 2]));
      open_span(t == 0);
      const ShardLayout theirs(split_.chunks[owner]);
      const int64_t block_kv = kv_elements(theirs.rows);
      // This step's terms of the block's dK and dV, summed here first: the running sums are
      // still on their way from rank r - 1 while the kernels run.
      float* d_local = dkv_local_.as<float>();
      fill_floats(d_local, 0.0f, 2 * block_kv, compute_);
      for (const Launch& l : steps_[t]) {
        const PairLaunch& p = l.pair;
        const int64_t q_off = mine.offset(p.q_chunk, s_, s_.heads_q, s_.head_dim);
        const int64_t kv_off = theirs.offset(p.kv_chunk, s_, s_.heads_kv, s_.head_dim);
        BackwardParams params;
        params.shape = p.shape;
        params.features = l.features;
        params.extras = l.extras;
        params.q = at(q, q_off);
        params.k = at(block.k, kv_off);
        params.v = at(block.v, kv_off);
        params.o = at(o, q_off);
        params.d_o = at(d_o, q_off);
        params.lse = lse + mine.offset(p.q_chunk, s_, s_.heads_q, 1);  // the FINAL LSE: P is exact
        params.dq = dq_part_.get();
        params.dk = dk_part_.get();
        params.dv = dv_part_.get();
        params.workspace = bwd_workspace_.get();
        params.stream = compute_;
        bwd_->launch(params);
        CUDA_CHECK_LAUNCH();
        const int64_t q_elems = int64_t(s_.batch) * s_.heads_q * p.shape.seq_q * s_.head_dim;
        const int64_t kv_elems = int64_t(s_.batch) * s_.heads_kv * p.shape.seq_kv * s_.head_dim;
        add_into(dtype_, dq_acc + q_off, dq_part_.get(), q_elems, compute_);
        add_into(dtype_, d_local + kv_off, dk_part_.get(), kv_elems, compute_);
        add_into(dtype_, d_local + block_kv + kv_off, dv_part_.get(), kv_elems, compute_);
      }
      // Add this step's terms into the block's running dK/dV (zero at its owner, step 0).
      float* d_running = dkv_[t % 2].as<float>();
      if (t == 0) {
        CUDA_CHECK(cudaMemcpyAsync(d_running, d_local, std::size_t(2 * block_kv) * sizeof(float),
                                   cudaMemcpyDeviceToDevice, compute_));
      } else {
        close_span();
        if (transfer_) CUDA_CHECK(cudaStreamWaitEvent(compute_, d_received_[t % 2]));
        open_span();
        add_into(DType::F32, d_running, d_local, 2 * block_kv, compute_);
      }
      close_span();
      CUDA_CHECK(cudaEventRecord(computed_[t % 2], compute_));
      if (ranks_ > 1 && transfer_) pass_gradients(t, block_kv);
    }
    // After N steps (and N hops of dK/dV) this rank's own block's sums are home.
    const int home = ranks_ > 1 && transfer_ ? ranks_ % 2 : (ranks_ - 1) % 2;
    if (ranks_ > 1 && transfer_) CUDA_CHECK(cudaStreamWaitEvent(compute_, d_received_[home]));
    const int64_t own_kv = kv_elements(mine.rows);
    round_to(dtype_, dq, dq_acc, rows_q * s_.head_dim, compute_);
    round_to(dtype_, dk, dkv_[home].as<float>(), own_kv, compute_);
    round_to(dtype_, dv, dkv_[home].as<float>() + own_kv, own_kv, compute_);
    finish();
  }
  //! [gpu_ring_backward]

 private:
  /// One kernel launch of a step: a (query chunk, key chunk) pair, with its documents' boundaries
  /// (on the device) when the sequence is packed.
  struct Launch {
    PairLaunch pair;
    AttentionFeatures features;
    AttentionExtras extras;
  };

  /// steps_[t]: the launches of step t, against the block of source_rank(rank_, t). Packed
  /// documents' boundaries go to the device once, here, for every launch of every step.
  //! [plan_launches]
  void plan_launches(const Documents* docs) {
    check_documents(s_, docs);
    std::vector<int> bounds;  // every launch's cu_q, then its cu_k
    std::vector<std::vector<PackedPairLaunch>> packed(ranks_);
    for (int t = 0; t < ranks_; ++t) {
      const int owner = source_rank(rank_, t, ranks_);
      if (!docs) {
        steps_.emplace_back();
        for (const PairLaunch& p : pairs_for(s_, split_, rank_, owner)) steps_.back().push_back({p, {}, {}});
        continue;
      }
      packed[t] = packed_pairs_for(s_, split_, rank_, owner, *docs);
      for (const PackedPairLaunch& p : packed[t]) {
        bounds.insert(bounds.end(), p.cu_q.begin(), p.cu_q.end());
        bounds.insert(bounds.end(), p.cu_k.begin(), p.cu_k.end());
      }
    }
    if (!docs) return;
    if (!bounds.empty()) {
      bounds_ = DeviceBuffer(bounds.size() * sizeof(int));
      CUDA_CHECK(cudaMemcpy(bounds_.get(), bounds.data(), bounds.size() * sizeof(int), cudaMemcpyHostToDevice));
    }
    const int* device = bounds_.as<int>();
    int64_t at_bound = 0;
    for (int t = 0; t < ranks_; ++t) {
      steps_.emplace_back();
      for (const PackedPairLaunch& p : packed[t]) {
        Launch l{p.pair, {}, {}};
        const int n = int(p.cu_q.size()) - 1;
        l.features.sequences = n;
        l.extras.cu_seqlens_q = device + at_bound;
        l.extras.cu_seqlens_k = device + at_bound + n + 1;
        for (int i = 0; i < n; ++i) {
          l.extras.max_seqlen_q = std::max(l.extras.max_seqlen_q, p.cu_q[i + 1] - p.cu_q[i]);
          l.extras.max_seqlen_k = std::max(l.extras.max_seqlen_k, p.cu_k[i + 1] - p.cu_k[i]);
        }
        at_bound += 2 * (n + 1);
        steps_.back().push_back(l);
      }
    }
  }
  //! [plan_launches]

  /// busy_ms()'s marks on the compute stream: a span opens once the step has what it waits for
  /// and closes after its launches (`first`: a new run starts).
  void open_span(bool first = false) {
    if (first) spans_ = 0;
    CUDA_CHECK(cudaEventRecord(marks_.at(spans_++), compute_));
  }
  void close_span() { CUDA_CHECK(cudaEventRecord(marks_.at(spans_++), compute_)); }

  struct Block {
    const void* k;
    const void* v;
  };

  int64_t kv_elements(int rows) const { return int64_t(s_.batch) * s_.heads_kv * rows * s_.head_dim; }
  const void* at(const void* base, int64_t elements) const {
    return static_cast<const char*>(base) + elements * int64_t(dtype_size(dtype_));
  }

  /// The K/V block held at step t: this rank's own at step 0, else the one received into
  /// buffer (t - 1) % 2 during step t - 1 (K first, then V).
  Block block_at(int t, const void* k, const void* v, int owner) const {
    if (t == 0) return {k, v};
    const char* base = static_cast<const char*>(kv_[transfer_ ? (t - 1) % 2 : 0].get());
    const int rows = transfer_ ? split_.rows(owner) : stand_in_rows_;
    return {base, base + kv_elements(rows) * int64_t(dtype_size(dtype_))};
  }

  /// Step t's hop on the comm stream: send the block in hand to r + 1, receive step t + 1's
  /// block from r - 1 into buffer t % 2, once step t - 1 (which read that buffer) is done.
  void pass_block(int t, const Block& block) {
    if (!transfer_) return;
    if (t > 0) CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, computed_[(t - 1) % 2]));
    const std::size_t el = dtype_size(dtype_);
    const std::size_t send = std::size_t(kv_elements(split_.rows(source_rank(rank_, t, ranks_)))) * el;
    const std::size_t recv = std::size_t(kv_elements(split_.rows(source_rank(rank_, t + 1, ranks_)))) * el;
    char* into = kv_[t % 2].as<char>();
    FA_NCCL_CHECK(ncclGroupStart());
    FA_NCCL_CHECK(ncclSend(block.k, send, ncclUint8, (rank_ + 1) % ranks_, comm_, comm_stream_));
    FA_NCCL_CHECK(ncclSend(block.v, send, ncclUint8, (rank_ + 1) % ranks_, comm_, comm_stream_));
    FA_NCCL_CHECK(ncclRecv(into, recv, ncclUint8, (rank_ + ranks_ - 1) % ranks_, comm_, comm_stream_));
    FA_NCCL_CHECK(ncclRecv(into + recv, recv, ncclUint8, (rank_ + ranks_ - 1) % ranks_, comm_, comm_stream_));
    FA_NCCL_CHECK(ncclGroupEnd());
    CUDA_CHECK(cudaEventRecord(received_[t % 2], comm_stream_));
  }

  /// After step t's compute: the block's running dK/dV go on to r + 1, and the next block's
  /// arrive from r - 1 into the other buffer (free: its last send is earlier on this stream).
  void pass_gradients(int t, int64_t block_kv) {
    CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, computed_[t % 2]));
    const int64_t next_kv = kv_elements(split_.rows(source_rank(rank_, t + 1, ranks_)));
    FA_NCCL_CHECK(ncclGroupStart());
    FA_NCCL_CHECK(
        ncclSend(dkv_[t % 2].get(), std::size_t(2 * block_kv), ncclFloat, (rank_ + 1) % ranks_, comm_, comm_stream_));
    FA_NCCL_CHECK(ncclRecv(dkv_[(t + 1) % 2].get(), std::size_t(2 * next_kv), ncclFloat, (rank_ + ranks_ - 1) % ranks_,
                           comm_, comm_stream_));
    FA_NCCL_CHECK(ncclGroupEnd());
    CUDA_CHECK(cudaEventRecord(d_received_[(t + 1) % 2], comm_stream_));
  }

  /// The compute stream waits for everything on the comm stream: when it is done, so are the
  /// sends that read the caller's K and V.
  void finish() {
    CUDA_CHECK(cudaEventRecord(comm_done_, comm_stream_));
    CUDA_CHECK(cudaStreamWaitEvent(compute_, comm_done_));
  }

  ncclComm_t comm_;
  int rank_, ranks_;
  AttentionShape s_;
  SequenceSplit split_;
  const ForwardKernel& fwd_;
  const BackwardKernel* bwd_;
  bool transfer_;
  DType dtype_;
  int stand_in_rows_ = 0;  // rows of K (then of V) in the stand-in block, without transfers
  std::vector<std::vector<Launch>> steps_;
  DeviceBuffer bounds_;  // packed documents' boundaries, every launch's (plan_launches)
  std::array<DeviceBuffer, 2> kv_, dkv_;
  DeviceBuffer o_part_, lse_part_, acc_, fwd_workspace_, dkv_local_, dq_part_, dk_part_, dv_part_, bwd_workspace_;
  cudaStream_t compute_ = nullptr, comm_stream_ = nullptr;
  std::array<cudaEvent_t, 2> computed_{}, received_{}, d_received_{};
  cudaEvent_t start_ = nullptr, comm_done_ = nullptr;
  std::vector<cudaEvent_t> marks_;
  std::size_t spans_ = 0;  // marks recorded in the last run
};

}  // namespace fa::context_parallel
