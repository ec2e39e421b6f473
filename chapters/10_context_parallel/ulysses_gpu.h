// Chapter 10 on GPUs, the other way: one rank of DeepSpeed-Ulysses (ulysses.h on the CPU). An
// all-to-all over NCCL turns this rank's sequence shards (chunk-major, as in ring_gpu.h) into
// the whole sequence of its share of the heads, in global order; chapter 06's kernel (07's for the
// backward) runs once on that, a plain attention problem with a plain causal mask; a second
// all-to-all brings the outputs back to the sequence shards.
//
// One all-to-all is N - 1 ncclSend/ncclRecv pairs in one group (a rank's part for itself is a
// local copy). The pieces are cut and placed with cudaMemcpy2DAsync: a rank's rows of a chunk
// for some heads are, for each batch, one strided block of rows.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "algorithm.h"
#include "cuda_check.h"
#include "dtype.h"
#include "registry.h"
#include "ring_gpu.h"
#include "tensor.h"

namespace fa::context_parallel {

/// "" when Ulysses on GPUs can split these heads over `ranks` ranks, else why not. (The CPU
/// model also copies a K/V head to several ranks when ranks exceed heads_kv; here each rank
/// must own whole K/V heads.)
inline std::string ulysses_gpu_reason(const AttentionShape& s, int ranks) {
  if (s.heads_q % ranks != 0)
    return "heads_q (" + std::to_string(s.heads_q) + ") is not a multiple of ranks (" + std::to_string(ranks) + ")";
  if (s.heads_kv % ranks != 0)
    return "heads_kv (" + std::to_string(s.heads_kv) + ") is not a multiple of ranks (" + std::to_string(ranks) + ")";
  // The pieces are moved by cudaMemcpy2DAsync, whose pitch (a chunk's rows of every head, or the
  // whole sequence of a head, in float at most) must stay below 2^31 bytes.
  const double pitch = double(std::max(s.seq_q, 1)) * std::max(s.heads_q, 1) * s.head_dim * 4.0;
  if (pitch >= 2147483648.0)
    return "the sequence is too long for the copies' pitch (" + std::to_string(s.seq_q) + " tokens x " +
           std::to_string(s.heads_q) + " heads x head_dim " + std::to_string(s.head_dim) +
           " must stay under 2^31 bytes)";
  return "";
}

class UlyssesRank {
 public:
  UlyssesRank(ncclComm_t comm, int rank, const AttentionShape& global, const SequenceSplit& split,
              const ForwardKernel& forward, const BackwardKernel* backward)
      : comm_(comm), rank_(rank), n_(split.ranks), s_(global), split_(split), fwd_(forward), bwd_(backward) {
    const std::string why = ulysses_gpu_reason(s_, n_);
    if (!why.empty()) throw std::invalid_argument("Ulysses on " + std::to_string(n_) + " GPUs: " + why);
    local_ = s_;
    local_.heads_q = s_.heads_q / n_;
    local_.heads_kv = s_.heads_kv / n_;
    local_.scale = s_.softmax_scale();
    std::string reason = support_reason(fwd_, local_, {});
    if (!reason.empty())
      throw std::invalid_argument(fwd_.name + " cannot take a " + local_.to_string() + ": " + reason);
    if (bwd_) {
      reason = support_reason(*bwd_, local_, {});
      if (!reason.empty())
        throw std::invalid_argument(bwd_->name + " cannot take a " + local_.to_string() + ": " + reason);
    }
    const std::size_t el = dtype_size(forward.dtype);
    const int64_t q_full = int64_t(s_.batch) * local_.heads_q * s_.seq_q * s_.head_dim;
    const int64_t kv_full = int64_t(s_.batch) * local_.heads_kv * s_.seq_q * s_.head_dim;
    int max_rows = 0;
    for (int r = 0; r < n_; ++r) max_rows = std::max(max_rows, split.rows(r));
    for (auto* b : {&q_, &o_, &do_, &dq_}) *b = DeviceBuffer(std::size_t(q_full) * el);
    for (auto* b : {&k_, &v_, &dk_, &dv_}) *b = DeviceBuffer(std::size_t(kv_full) * el);
    lse_ = DeviceBuffer(std::size_t(s_.batch) * local_.heads_q * s_.seq_q * sizeof(float));
    // Staging for one all-to-all of the widest tensor (Q's heads, head_dim wide) each way.
    // Staging for one all-to-all each way: the larger of a rank's rows of every head (the way
    // in) and the whole sequence of its heads (the way back), for the widest tensor.
    const std::size_t staging =
        std::max(std::size_t(s_.batch) * s_.heads_q * max_rows * s_.head_dim, std::size_t(q_full)) * el;
    send_ = DeviceBuffer(staging);
    recv_ = DeviceBuffer(staging);
    if (fwd_.workspace_bytes) fwd_work_ = DeviceBuffer(fwd_.workspace_bytes(local_));
    if (bwd_ && bwd_->workspace_bytes) bwd_work_ = DeviceBuffer(bwd_->workspace_bytes(local_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~UlyssesRank() { cudaStreamDestroy(stream_); }
  UlyssesRank(const UlyssesRank&) = delete;
  UlyssesRank& operator=(const UlyssesRank&) = delete;

  cudaStream_t compute_stream() const { return stream_; }

  //! [ulysses_forward]
  void forward(const void* q, const void* k, const void* v, void* o, float* lse) {
    const std::size_t el = dtype_size(fwd_.dtype);
    to_heads(q, s_.heads_q, s_.head_dim, el, q_.get());  // all-to-all: sequence shards -> head shards
    to_heads(k, s_.heads_kv, s_.head_dim, el, k_.get());
    to_heads(v, s_.heads_kv, s_.head_dim, el, v_.get());
    ForwardParams p;  // plain attention over the whole sequence, for this rank's heads
    p.shape = local_;
    p.q = q_.get();
    p.k = k_.get();
    p.v = v_.get();
    p.o = o_.get();
    p.lse = lse_.as<float>();
    p.workspace = fwd_work_.get();
    p.stream = stream_;
    fwd_.launch(p);
    CUDA_CHECK_LAUNCH();
    from_heads(o_.get(), s_.heads_q, s_.head_dim, el, o);  // and back
    from_heads(lse_.get(), s_.heads_q, 1, sizeof(float), lse);
  }
  //! [ulysses_forward]

  void backward(const void* q, const void* k, const void* v, const void* o, const float* lse, const void* d_o, void* dq,
                void* dk, void* dv) {
    if (!bwd_) throw std::logic_error("UlyssesRank::backward without a backward kernel");
    const std::size_t el = dtype_size(bwd_->dtype);
    to_heads(q, s_.heads_q, s_.head_dim, el, q_.get());
    to_heads(k, s_.heads_kv, s_.head_dim, el, k_.get());
    to_heads(v, s_.heads_kv, s_.head_dim, el, v_.get());
    to_heads(o, s_.heads_q, s_.head_dim, el, o_.get());
    to_heads(d_o, s_.heads_q, s_.head_dim, el, do_.get());
    to_heads(lse, s_.heads_q, 1, sizeof(float), lse_.get());
    BackwardParams p;
    p.shape = local_;
    p.q = q_.get();
    p.k = k_.get();
    p.v = v_.get();
    p.o = o_.get();
    p.d_o = do_.get();
    p.lse = lse_.as<float>();
    p.dq = dq_.get();
    p.dk = dk_.get();
    p.dv = dv_.get();
    p.workspace = bwd_work_.get();
    p.stream = stream_;
    bwd_->launch(p);
    CUDA_CHECK_LAUNCH();
    from_heads(dq_.get(), s_.heads_q, s_.head_dim, el, dq);
    from_heads(dk_.get(), s_.heads_kv, s_.head_dim, el, dk);
    from_heads(dv_.get(), s_.heads_kv, s_.head_dim, el, dv);
  }

 private:
  /// Bytes of `rows` rows of `width` elements.
  static std::size_t row_bytes(int rows, int width, std::size_t el) { return std::size_t(rows) * width * el; }

  /// Sequence shard (chunk-major [chunk][batch][heads][rows][width]) to this rank's head shard
  /// [batch][heads / N][seq][width], every row at its global position.
  void to_heads(const void* shard, int heads, int width, std::size_t el, void* full) {
    const int h = heads / n_;
    const ShardLayout mine(split_.chunks[rank_]);
    char* send = send_.as<char>();
    char* recv = recv_.as<char>();
    std::vector<std::size_t> send_at(n_ + 1, 0), recv_at(n_ + 1, 0);
    for (int j = 0; j < n_; ++j) {  // pack: for rank j, its heads of each of my chunks
      send_at[j + 1] = send_at[j] + std::size_t(s_.batch) * h * mine.rows * width * el;
      recv_at[j + 1] = recv_at[j] + std::size_t(s_.batch) * h * split_.rows(j) * width * el;
      std::size_t at = send_at[j];
      for (int c = 0; c < int(mine.chunks.size()); ++c) {
        const int len = mine.chunks[c].length;
        if (len == 0) continue;
        const char* src = static_cast<const char*>(shard) + mine.offset(c, s_, heads, width) * el +
                          row_bytes(len, width, el) * std::size_t(j) * h;
        CUDA_CHECK(cudaMemcpy2DAsync(send + at, row_bytes(h * len, width, el), src, row_bytes(heads * len, width, el),
                                     row_bytes(h * len, width, el), s_.batch, cudaMemcpyDeviceToDevice, stream_));
        at += std::size_t(s_.batch) * row_bytes(h * len, width, el);
      }
    }
    exchange(send, send_at, recv, recv_at);
    for (int j = 0; j < n_; ++j) {  // place: rank j's rows of my heads at their positions
      const ShardLayout theirs(split_.chunks[j]);
      std::size_t at = recv_at[j];
      for (int c = 0; c < int(theirs.chunks.size()); ++c) {
        const Chunk chunk = theirs.chunks[c];
        if (chunk.length == 0) continue;
        for (int b = 0; b < s_.batch; ++b) {
          char* dst = static_cast<char*>(full) + (std::size_t(b) * h * s_.seq_q + chunk.start) * width * el;
          CUDA_CHECK(cudaMemcpy2DAsync(dst, row_bytes(s_.seq_q, width, el), recv + at,
                                       row_bytes(chunk.length, width, el), row_bytes(chunk.length, width, el), h,
                                       cudaMemcpyDeviceToDevice, stream_));
          at += std::size_t(h) * row_bytes(chunk.length, width, el);
        }
      }
    }
  }

  /// The way back: this rank's head shard to the sequence shards; each rank's rows of these heads
  /// go home into its chunk-major shard.
  void from_heads(const void* full, int heads, int width, std::size_t el, void* shard) {
    const int h = heads / n_;
    const ShardLayout mine(split_.chunks[rank_]);
    char* send = send_.as<char>();
    char* recv = recv_.as<char>();
    std::vector<std::size_t> send_at(n_ + 1, 0), recv_at(n_ + 1, 0);
    for (int j = 0; j < n_; ++j) {  // pack: rank j's rows of my heads, chunk by chunk
      const ShardLayout theirs(split_.chunks[j]);
      send_at[j + 1] = send_at[j] + std::size_t(s_.batch) * h * theirs.rows * width * el;
      recv_at[j + 1] = recv_at[j] + std::size_t(s_.batch) * h * mine.rows * width * el;
      std::size_t at = send_at[j];
      for (const Chunk& chunk : theirs.chunks) {
        if (chunk.length == 0) continue;
        for (int b = 0; b < s_.batch; ++b) {
          const char* src = static_cast<const char*>(full) + (std::size_t(b) * h * s_.seq_q + chunk.start) * width * el;
          CUDA_CHECK(cudaMemcpy2DAsync(send + at, row_bytes(chunk.length, width, el), src,
                                       row_bytes(s_.seq_q, width, el), row_bytes(chunk.length, width, el), h,
                                       cudaMemcpyDeviceToDevice, stream_));
          at += std::size_t(h) * row_bytes(chunk.length, width, el);
        }
      }
    }
    exchange(send, send_at, recv, recv_at);
    for (int j = 0; j < n_; ++j) {  // place: rank j's heads of my chunks
      std::size_t at = recv_at[j];
      for (int c = 0; c < int(mine.chunks.size()); ++c) {
        const int len = mine.chunks[c].length;
        if (len == 0) continue;
        char* dst = static_cast<char*>(shard) + mine.offset(c, s_, heads, width) * el +
                    row_bytes(len, width, el) * std::size_t(j) * h;
        CUDA_CHECK(cudaMemcpy2DAsync(dst, row_bytes(heads * len, width, el), recv + at, row_bytes(h * len, width, el),
                                     row_bytes(h * len, width, el), s_.batch, cudaMemcpyDeviceToDevice, stream_));
        at += std::size_t(s_.batch) * row_bytes(h * len, width, el);
      }
    }
  }

  /// One all-to-all: bytes [send_at[j], send_at[j+1]) go to rank j, which puts them at its
  /// [recv_at[me], ...); this rank's own part is a local copy.
  void exchange(char* send, const std::vector<std::size_t>& send_at, char* recv,
                const std::vector<std::size_t>& recv_at) {
    FA_NCCL_CHECK(ncclGroupStart());
    for (int j = 0; j < n_; ++j) {
      if (j == rank_) continue;
      if (send_at[j + 1] > send_at[j])
        FA_NCCL_CHECK(ncclSend(send + send_at[j], send_at[j + 1] - send_at[j], ncclUint8, j, comm_, stream_));
      if (recv_at[j + 1] > recv_at[j])
        FA_NCCL_CHECK(ncclRecv(recv + recv_at[j], recv_at[j + 1] - recv_at[j], ncclUint8, j, comm_, stream_));
    }
    FA_NCCL_CHECK(ncclGroupEnd());
    if (send_at[rank_ + 1] > send_at[rank_])
      CUDA_CHECK(cudaMemcpyAsync(recv + recv_at[rank_], send + send_at[rank_], send_at[rank_ + 1] - send_at[rank_],
                                 cudaMemcpyDeviceToDevice, stream_));
  }

  ncclComm_t comm_;
  int rank_, n_;
  AttentionShape s_, local_;
  SequenceSplit split_;
  const ForwardKernel& fwd_;
  const BackwardKernel* bwd_;
  DeviceBuffer q_, k_, v_, o_, do_, dq_, dk_, dv_, lse_, send_, recv_, fwd_work_, bwd_work_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace fa::context_parallel
