// Chapter 10 program: build/bin/ch10_context_parallel --help
//
// One process per GPU. The program starts one child process per rank (before any CUDA call, so
// each child owns one GPU from its start); rank 0 makes the NCCL id and hands it to the others
// through a pipe; every rank runs ring_gpu.h's RingRank on its shards; the parent, which never
// touches CUDA, collects what the ranks wrote into shared memory and judges it.
//
//   (default)  the check: the whole sequence's forward and backward against the fp64 oracle, on
//              each split, with the fastest backward and with the deterministic one (run twice:
//              the bytes must repeat);
//   --bench    the benchmark: one rank against N ranks (contiguous and zigzag), forward and
//              backward, the compute alone (no transfer) and one hop of the link alone.
// With fewer than two GPUs it says so and runs algorithm.h's simulated ranks on the CPU against
// the same oracle (or, with --gpu-only, exits 77: the tests' "skipped").
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "algorithm.h"
#include "backward_runner.h"
#include "chapter_main.h"
#include "cli.h"
#include "compare.h"
#include "cuda_check.h"
#include "reference.h"
#include "ring_gpu.h"
#include "ring_kernels.h"
#include "tensor.h"
#include "ulysses_gpu.h"

namespace fa::context_parallel {
namespace {

/// Which way across the GPUs: ring_gpu.h or ulysses_gpu.h.
enum class Method { Ring, Ulysses };

/// Chapter 10's own flags, taken off the command line before the shared ones are parsed.
struct RingOptions {
  int ranks = 0;  // 0: every GPU there is
  std::vector<Split> splits{Split::Contiguous, Split::Zigzag};
  bool bench = false;
  bool gpu_only = false;
  int tokens_per_rank = 65536;
  int documents = 0;  // the check's sequence packed as this many documents (0: one sequence)
};
RingOptions ring_options;

const char* kHelp = R"(
Chapter 10's flags:
  --ranks N              ranks (one GPU each); default: every GPU there is
  --split KIND           contiguous, zigzag or both (default both)
  --bench                the benchmark instead of the check: 1 rank vs N ranks, causal, at
                         --tokens-per-rank tokens on each rank (default 65536); shape flags set
                         batch, heads and head_dim (default 1 x 16 x 128, bf16)
  --tokens-per-rank T    the benchmark's tokens on each rank
  --gpu-only             with fewer than two GPUs, exit 77 (skipped) instead of running the
                         simulated ranks on the CPU
  --documents N          the check packs the sequence as N documents of random lengths (some
                         empty; a query sees keys of its own document only; needs --batch 1):
                         the ring runs chapter 09's variable-length kernels
The check runs the ring (with the fastest backward, and with the deterministic one twice) and
Ulysses against the fp64 oracle. Its default problem: batch 2, 8 query heads over 2 K/V heads,
1001 tokens, head_dim 128, causal; the sequence is split across the ranks (--seq sets its length).
--bench --csv FILE writes the benchmark's rows to FILE.
)";

std::vector<const char*> take_ring_flags(int argc, const char* const* argv) {
  std::vector<const char*> rest{argv[0]};
  auto value = [&](int& i, const std::string& flag) -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    return argv[++i];
  };
  auto positive = [&](const std::string& flag, const std::string& text) {
    std::size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != text.size() || n < 1)
      throw std::invalid_argument(flag + " takes a positive integer, got '" + text + "'");
    return n;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--ranks") {
      ring_options.ranks = positive(arg, value(i, arg));
    } else if (arg == "--tokens-per-rank") {
      ring_options.tokens_per_rank = positive(arg, value(i, arg));
    } else if (arg == "--split") {
      const std::string kind = value(i, arg);
      if (kind == "contiguous") ring_options.splits = {Split::Contiguous};
      else if (kind == "zigzag") ring_options.splits = {Split::Zigzag};
      else if (kind == "both") ring_options.splits = {Split::Contiguous, Split::Zigzag};
      else throw std::invalid_argument("--split takes contiguous, zigzag or both, got '" + kind + "'");
    } else if (arg == "--bench") {
      ring_options.bench = true;
    } else if (arg == "--gpu-only") {
      ring_options.gpu_only = true;
    } else if (arg == "--documents") {
      ring_options.documents = positive(arg, value(i, arg));
    } else {
      rest.push_back(argv[i]);
    }
  }
  return rest;
}

// ---------------------------------------------------------------------------------------------
// Processes: one per rank, and memory they share with the parent.

/// How many GPUs this machine has, asked in a child process: the parent must not start CUDA,
/// or the rank processes it forks afterwards could not use it.
int count_gpus() {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(std::min(n, 100));
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

/// Anonymous memory shared by the parent and the rank processes it forks afterwards.
template <class T>
class Shared {
 public:
  explicit Shared(std::size_t count, T fill = T{}) : count_(count) {
    void* p = mmap(nullptr, std::max<std::size_t>(1, count * sizeof(T)), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap of " + std::to_string(count * sizeof(T)) + " bytes failed");
    data_ = static_cast<T*>(p);
    std::fill_n(data_, count_, fill);
  }
  ~Shared() { munmap(data_, std::max<std::size_t>(1, count_ * sizeof(T))); }
  Shared(const Shared&) = delete;
  Shared& operator=(const Shared&) = delete;
  T* data() const { return data_; }
  T& operator[](std::size_t i) const { return data_[i]; }
  std::vector<T> copy() const { return std::vector<T>(data_, data_ + count_); }

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

/// Runs body(rank, comm) in `ranks` child processes, rank r on GPU r, joined by one NCCL
/// communicator. Returns 0 when every rank returned 0; a rank's exception is printed with its
/// rank and counts as a failure.
int run_ranks(int ranks, const std::function<int(int, ncclComm_t)>& body) {
  int id_pipe[2];
  if (pipe(id_pipe) != 0) throw std::runtime_error("pipe failed");
  std::fflush(nullptr);
  std::vector<pid_t> children;
  for (int rank = 0; rank < ranks; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {  // the ranks already started would wait in NCCL for the missing one
      for (pid_t child : children) kill(child, SIGKILL);
      for (pid_t child : children) waitpid(child, nullptr, 0);
      throw std::runtime_error("fork failed for rank " + std::to_string(rank));
    }
    if (pid > 0) {
      children.push_back(pid);
      continue;
    }
    int rc = 1;
    try {
      CUDA_CHECK(cudaSetDevice(rank));
      ncclUniqueId id;
      if (rank == 0) {
        FA_NCCL_CHECK(ncclGetUniqueId(&id));
        for (int r = 1; r < ranks; ++r)
          if (write(id_pipe[1], &id, sizeof id) != ssize_t(sizeof id)) throw std::runtime_error("pipe write failed");
      } else if (read(id_pipe[0], &id, sizeof id) != ssize_t(sizeof id)) {
        throw std::runtime_error("rank " + std::to_string(rank) + " got no NCCL id");
      }
      ncclComm_t comm = nullptr;
      FA_NCCL_CHECK(ncclCommInitRank(&comm, ranks, id, rank));
      rc = body(rank, comm);
      CUDA_CHECK(cudaDeviceSynchronize());
      ncclCommDestroy(comm);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
      rc = 1;
    }
    std::fflush(nullptr);
    _exit(rc);
  }
  close(id_pipe[0]);
  close(id_pipe[1]);
  // A rank that fails leaves the others waiting in NCCL for a message that never comes: the
  // first failure ends them all.
  int failed = 0;
  for (std::size_t done = 0; done < children.size(); ++done) {
    int status = 0;
    pid_t pid = -1;
    do pid = waitpid(-1, &status, 0);
    while (pid < 0 && errno == EINTR);
    if (pid < 0) throw std::runtime_error("waitpid failed while ranks were running");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (failed++ == 0)
        for (pid_t other : children)
          if (other != pid) kill(other, SIGKILL);
    }
  }
  return failed == 0 ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// Shards: the global [batch, heads, seq, width] tensor and a rank's chunk-major shard.

std::vector<float> to_chunk_major(const std::vector<float>& global, const AttentionShape& s, int heads, int width,
                                  const std::vector<Chunk>& chunks) {
  std::vector<float> shard;
  for (const Chunk& c : chunks)
    for (int64_t bh = 0; bh < int64_t(s.batch) * heads; ++bh)
      for (int i = 0; i < c.length; ++i) {
        const float* row = global.data() + (bh * s.seq_q + c.start + i) * width;
        shard.insert(shard.end(), row, row + width);
      }
  return shard;
}

/// Writes a chunk-major shard's rows back to their global places in `global`.
template <class T>
void from_chunk_major(const T* shard, T* global, const AttentionShape& s, int heads, int width,
                      const std::vector<Chunk>& chunks) {
  int64_t at = 0;
  for (const Chunk& c : chunks)
    for (int64_t bh = 0; bh < int64_t(s.batch) * heads; ++bh)
      for (int i = 0; i < c.length; ++i, at += width)
        std::copy_n(shard + at, width, global + (bh * s.seq_q + c.start + i) * width);
}

/// Raw bytes of `dtype` elements (DeviceBuffer::download) as floats.
std::vector<float> decoded(DType dtype, const std::vector<unsigned char>& raw) {
  std::vector<float> out(raw.size() / dtype_size(dtype));
  decode_elements(dtype, raw.data(), out.data(), out.size());
  return out;
}

/// A poisoned buffer (NaN in every float type: unwritten shows), finished before the ring's
/// streams (which do not wait for the default stream) use it.
DeviceBuffer poisoned(std::size_t bytes) {
  DeviceBuffer b(bytes);
  b.poison();
  CUDA_CHECK(cudaDeviceSynchronize());
  return b;
}

// ---------------------------------------------------------------------------------------------
// The kernels a rank launches.

/// Chapter 06's ping-pong kernel (chapter 05's tuned one off Hopper); on packed documents,
/// chapter 09's variable-length kernels (its Hopper one, else its Ampere one).
const ForwardKernel& pick_forward(DType dtype, bool hopper, bool packed = false) {
  const std::vector<std::string> names = packed ? std::vector<std::string>{"ch09_hopper_bf16", "ch09_ampere_bf16"}
                                                : std::vector<std::string>{"ch06_pingpong_bf16", "ch05_tuned_bf16"};
  for (const std::string& name : names) {
    if (!hopper && (name == "ch06_pingpong_bf16" || name == "ch09_hopper_bf16")) continue;
    for (const ForwardKernel& k : forward_kernels())
      if (k.name == name && k.dtype == dtype) return k;
  }
  throw std::runtime_error("no forward kernel for chapter 10 (chapters 05, 06 and 09 are not linked)");
}

/// Whether `kernel` takes every (query chunk, key chunk) pair of every rank of `split`.
bool takes_every_pair(const BackwardKernel& kernel, const AttentionShape& s, const SequenceSplit& split) {
  for (int r = 0; r < split.ranks; ++r)
    for (int t = 0; t < split.ranks; ++t)
      for (const PairLaunch& p : pairs_for(s, split, r, source_rank(r, t, split.ranks)))
        if (!support_reason(kernel, p.shape, {}).empty()) return false;
  return true;
}

/// Chapter 07's fastest backward that takes every block (its variants 6, 4 and 2 in that order,
/// the first two on Hopper only), or its deterministic one; on packed documents, chapter 09's.
const BackwardKernel& pick_backward(bool deterministic, bool hopper, const AttentionShape& s,
                                    const SequenceSplit& split, bool packed = false) {
  const std::vector<std::string> names =
      packed          ? std::vector<std::string>{"ch09_ampere_backward_bf16"}
      : deterministic ? std::vector<std::string>{"ch07_deterministic_bf16"}
                      : std::vector<std::string>{"ch07_fused_bulk_bf16", "ch07_wgmma_bf16", "ch07_mma_bf16"};
  for (const std::string& name : names) {
    if (!hopper && (name == "ch07_fused_bulk_bf16" || name == "ch07_wgmma_bf16")) continue;
    for (const BackwardKernel& k : backward_kernels())
      if (k.name == name && takes_every_pair(k, s, split)) return k;
  }
  throw std::runtime_error("no backward kernel of chapter 07 takes every block of " + s.to_string());
}

bool is_hopper() {
  int major = 0;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));  // this rank's GPU
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major == 9;
}

// ---------------------------------------------------------------------------------------------
// The check.

/// What the ranks of one check run leave for the parent, in the global layout.
struct CheckOutputs {
  Shared<unsigned char> o_raw;
  Shared<float> lse, dq, dk, dv;
  Shared<int> repeat_identical;  // per rank: 1 when the second backward wrote the same bytes
  CheckOutputs(const AttentionShape& s, DType dtype, int ranks)
      : o_raw(std::size_t(s.batch) * s.heads_q * s.seq_q * s.head_dim * dtype_size(dtype), kPoisonByte),
        lse(std::size_t(s.batch) * s.heads_q * s.seq_q, NAN),
        dq(std::size_t(s.batch) * s.heads_q * s.seq_q * s.head_dim, NAN),
        dk(std::size_t(s.batch) * s.heads_kv * s.seq_kv * s.head_dim, NAN),
        dv(std::size_t(s.batch) * s.heads_kv * s.seq_kv * s.head_dim, NAN),
        repeat_identical(std::size_t(ranks), 0) {}
};

/// A rank of either method (packed documents: the ring only).
template <class Rank>
Rank make_rank(ncclComm_t comm, int rank, const AttentionShape& s, const SequenceSplit& split, const ForwardKernel& fwd,
               const BackwardKernel& bwd, bool transfer, const Documents* docs = nullptr);
template <>
RingRank make_rank<RingRank>(ncclComm_t comm, int rank, const AttentionShape& s, const SequenceSplit& split,
                             const ForwardKernel& fwd, const BackwardKernel& bwd, bool transfer,
                             const Documents* docs) {
  return RingRank(comm, rank, s, split, fwd, &bwd, transfer, docs);
}
template <>
UlyssesRank make_rank<UlyssesRank>(ncclComm_t comm, int rank, const AttentionShape& s, const SequenceSplit& split,
                                   const ForwardKernel& fwd, const BackwardKernel& bwd, bool, const Documents* docs) {
  if (docs) throw std::invalid_argument("ulysses_gpu.h does not take packed documents");
  return UlyssesRank(comm, rank, s, split, fwd, &bwd);
}

/// One rank of a check: upload its shards, run the ring's forward and backward, write its
/// rows of O, LSE, dQ, dK and dV to `out`.
template <class Rank>
int check_rank(int rank, ncclComm_t comm, const BackwardProblem& problem, const SequenceSplit& split,
               bool deterministic, const Documents* docs, CheckOutputs& out) {
  const AttentionShape& s = problem.shape;
  const std::vector<Chunk>& chunks = split.chunks[rank];
  const DType dtype = problem.dtype;
  const bool hopper = is_hopper();
  const ForwardKernel& fwd = pick_forward(dtype, hopper, docs != nullptr);
  const BackwardKernel& bwd = pick_backward(deterministic, hopper, s, split, docs != nullptr);
  const int rows = split.rows(rank), d = s.head_dim;
  const std::size_t q_elems = std::size_t(s.batch) * s.heads_q * rows * d;
  const std::size_t kv_elems = std::size_t(s.batch) * s.heads_kv * rows * d;
  const std::size_t lse_elems = std::size_t(s.batch) * s.heads_q * rows;
  const DeviceBuffer q = upload_as(dtype, to_chunk_major(problem.q, s, s.heads_q, d, chunks));
  const DeviceBuffer k = upload_as(dtype, to_chunk_major(problem.k, s, s.heads_kv, d, chunks));
  const DeviceBuffer v = upload_as(dtype, to_chunk_major(problem.v, s, s.heads_kv, d, chunks));
  const DeviceBuffer d_o = upload_as(dtype, to_chunk_major(problem.d_o, s, s.heads_q, d, chunks));
  const std::size_t el = dtype_size(dtype);
  DeviceBuffer o = poisoned(q_elems * el), lse = poisoned(lse_elems * sizeof(float));

  Rank ring = make_rank<Rank>(comm, rank, s, split, fwd, bwd, true, docs);
  ring.forward(q.get(), k.get(), v.get(), o.get(), lse.as<float>());
  CUDA_CHECK(cudaStreamSynchronize(ring.compute_stream()));
  const std::vector<unsigned char> o_raw = o.download();
  const std::vector<float> lse_host = decoded(DType::F32, lse.download());
  // O's rows are width head_dim x element bytes when moved as bytes.
  from_chunk_major(o_raw.data(), out.o_raw.data(), s, s.heads_q, int(d * el), chunks);
  from_chunk_major(lse_host.data(), out.lse.data(), s, s.heads_q, 1, chunks);

  std::array<std::vector<unsigned char>, 3> first;  // dQ, dK, dV of the first run
  for (int run = 0; run < (deterministic ? 2 : 1); ++run) {
    DeviceBuffer dq = poisoned(q_elems * el), dk = poisoned(kv_elems * el), dv = poisoned(kv_elems * el);
    ring.backward(q.get(), k.get(), v.get(), o.get(), lse.as<float>(), d_o.get(), dq.get(), dk.get(), dv.get());
    CUDA_CHECK(cudaStreamSynchronize(ring.compute_stream()));
    const std::array<std::vector<unsigned char>, 3> bytes{dq.download(), dk.download(), dv.download()};
    if (run == 0) {
      first = bytes;
      from_chunk_major(decoded(dtype, bytes[0]).data(), out.dq.data(), s, s.heads_q, d, chunks);
      from_chunk_major(decoded(dtype, bytes[1]).data(), out.dk.data(), s, s.heads_kv, d, chunks);
      from_chunk_major(decoded(dtype, bytes[2]).data(), out.dv.data(), s, s.heads_kv, d, chunks);
    } else {
      out.repeat_identical[rank] = bytes == first ? 1 : 0;
    }
  }
  return 0;
}

/// ||got - want|| / ||want|| over the whole tensor; NaN (unwritten or not finite) anywhere makes it NaN.
double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return NAN;
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

std::string fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

/// ", N documents" when the check packs its sequence (--documents), else "".
std::string documents_note() {
  return ring_options.documents ? ", " + std::to_string(ring_options.documents) + " documents" : "";
}

/// The check's problem and its oracle: one sequence, or (--documents N) the sequence packed as N
/// documents of random lengths, some empty, the same boundaries for queries and keys.
struct CheckProblem {
  BackwardProblem problem;
  Documents docs;
  ForwardReference fwd_ref;
  const Documents* packed() const { return docs.starts.empty() ? nullptr : &docs; }
};

CheckProblem make_check_problem(const AttentionShape& shape, uint64_t seed, DType dtype) {
  CheckProblem c;
  if (ring_options.documents == 0) {
    c.problem = make_backward_problem(shape, seed, dtype, 0);
  } else {
    AttentionFeatures features;
    features.sequences = ring_options.documents;
    c.problem = make_backward_problem(shape, seed, dtype, -1, features);  // the inputs; the oracle below
    c.problem.packing.cu_k = c.problem.packing.cu_q;                      // self-attention: one set of documents
    c.docs.starts = c.problem.packing.cu_q;
  }
  const AttentionExtras extras = c.problem.host_extras();
  if (c.packed())
    c.problem.ref = reference_backward(shape, c.problem.q.data(), c.problem.k.data(), c.problem.v.data(),
                                       c.problem.d_o.data(), c.problem.features, &extras);
  c.fwd_ref = reference_forward(shape, c.problem.q.data(), c.problem.k.data(), c.problem.v.data(),
                                full_check_plan(shape), c.problem.features, &extras);
  return c;
}

int run_check(const AttentionShape& shape, uint64_t seed, int ranks) {
  const DType dtype = DType::BF16;
  std::printf("ring attention on %d ranks, %s%s, seed %llu: fp64 oracle on the whole sequence\n", ranks,
              shape.to_string().c_str(), documents_note().c_str(), static_cast<unsigned long long>(seed));
  const CheckProblem check = make_check_problem(shape, seed, dtype);
  const BackwardProblem& problem = check.problem;
  const Documents* docs = check.packed();
  const double limit = backward_tolerance(dtype);
  int failed = 0;
  std::printf("%-11s %-14s %-34s %-9s %-9s %-9s %s\n", "split", "method", "forward O / LSE", "dQ rel", "dK rel",
              "dV rel", "status");
  const std::string ulysses_why = ulysses_gpu_reason(shape, ranks);
  for (Split kind : ring_options.splits) {
    const SequenceSplit split = split_sequence(shape.seq_q, ranks, kind);
    for (const auto& run :
         std::vector<std::pair<Method, bool>>{{Method::Ring, false}, {Method::Ring, true}, {Method::Ulysses, false}}) {
      const Method method = run.first;
      const bool deterministic = run.second;
      const char* name = method == Method::Ulysses ? "ulysses" : deterministic ? "ring, determ." : "ring";
      if (method == Method::Ulysses && !ulysses_why.empty()) {
        std::printf("%-11s %-14s not run: %s\n", split_name(kind), name, ulysses_why.c_str());
        continue;
      }
      if (docs && (method == Method::Ulysses || deterministic)) {
        std::printf(
            "%-11s %-14s not run: packed documents run the ring with chapter 09's kernels, which has "
            "no deterministic backward\n",
            split_name(kind), name);
        continue;
      }
      CheckOutputs out(shape, dtype, ranks);
      const int rc = run_ranks(ranks, [&](int rank, ncclComm_t comm) {
        return method == Method::Ulysses ? check_rank<UlyssesRank>(rank, comm, problem, split, false, nullptr, out)
                                         : check_rank<RingRank>(rank, comm, problem, split, deterministic, docs, out);
      });
      const std::vector<unsigned char> o_raw = out.o_raw.copy();
      const CompareReport report =
          compare_forward(shape, dtype, o_raw, out.lse.copy(), full_check_plan(shape), check.fwd_ref);
      const double e_dq = relative_error(out.dq.copy(), problem.ref.dq);
      const double e_dk = relative_error(out.dk.copy(), problem.ref.dk);
      const double e_dv = relative_error(out.dv.copy(), problem.ref.dv);
      bool repeat = true;
      for (int r = 0; r < ranks; ++r) repeat = repeat && out.repeat_identical[r] == 1;
      const bool ok =
          rc == 0 && report.passed() && e_dq <= limit && e_dk <= limit && e_dv <= limit && (!deterministic || repeat);
      std::string status = ok ? "ok" : "FAILED";
      if (deterministic) status += repeat ? " (bytes repeat)" : " (bytes differ run to run)";
      if (rc != 0) status += " (a rank failed)";
      std::printf("%-11s %-14s %-34s %-9s %-9s %-9s %s\n", split_name(kind), name, report.summary().c_str(),
                  fmt("%.1e", e_dq).c_str(), fmt("%.1e", e_dk).c_str(), fmt("%.1e", e_dv).c_str(), status.c_str());
      if (!report.passed()) std::printf("%s\n", report.details().c_str());
      failed += ok ? 0 : 1;
    }
  }
  std::printf(
      "gradient limit: relative error %.0e (bf16); ring and ulysses run the fastest backward kernel, "
      "ring, determ. the deterministic one twice (the bytes must repeat)\n",
      limit);
  return failed == 0 ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// The CPU side: algorithm.h's simulated ranks, for a machine with fewer than two GPUs.

int run_simulated(const AttentionShape& shape, uint64_t seed) {
  std::printf("the simulated ranks of algorithm.h on the CPU, %s%s, seed %llu, against the fp64 oracle:\n",
              shape.to_string().c_str(), documents_note().c_str(), static_cast<unsigned long long>(seed));
  const CheckProblem check = make_check_problem(shape, seed, DType::F32);
  const BackwardProblem& problem = check.problem;
  const int64_t outer_q = int64_t(shape.batch) * shape.heads_q, outer_kv = int64_t(shape.batch) * shape.heads_kv;
  int failed = 0;
  for (int ranks : {1, 2, 3, 4})
    for (Split kind : ring_options.splits) {
      const SequenceSplit split = split_sequence(shape.seq_q, ranks, kind);
      const Shards q = scatter_rows(problem.q.data(), outer_q, shape.head_dim, split);
      const Shards k = scatter_rows(problem.k.data(), outer_kv, shape.head_dim, split);
      const Shards v = scatter_rows(problem.v.data(), outer_kv, shape.head_dim, split);
      const Shards d_o = scatter_rows(problem.d_o.data(), outer_q, shape.head_dim, split);
      const RingForward f = ring_attention_forward(shape, split, q, k, v, check.packed());
      const RingBackward b = ring_attention_backward(shape, split, q, k, v, f.o, f.lse, d_o, check.packed());
      const double e_o = relative_error(gather_rows(f.o, outer_q, shape.head_dim, split), problem.ref.o);
      const double e_dq = relative_error(gather_rows(b.dq, outer_q, shape.head_dim, split), problem.ref.dq);
      const double e_dk = relative_error(gather_rows(b.dk, outer_kv, shape.head_dim, split), problem.ref.dk);
      const double e_dv = relative_error(gather_rows(b.dv, outer_kv, shape.head_dim, split), problem.ref.dv);
      const bool ok = e_o <= 1e-5 && e_dq <= 1e-4 && e_dk <= 1e-4 && e_dv <= 1e-4;
      std::printf("  %d ranks, %-10s  O rel %.1e  dQ %.1e  dK %.1e  dV %.1e  %s\n", ranks, split_name(kind), e_o, e_dq,
                  e_dk, e_dv, ok ? "ok" : "FAILED");
      failed += ok ? 0 : 1;
    }
  return failed == 0 ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// The benchmark.

/// One hop of `bytes` bytes each way on `stream`: to rank + 1, from rank - 1 (the link alone).
void hop_once(ncclComm_t comm, int rank, int ranks, void* send, void* recv, std::size_t bytes, cudaStream_t stream) {
  FA_NCCL_CHECK(ncclGroupStart());
  FA_NCCL_CHECK(ncclSend(send, bytes, ncclUint8, (rank + 1) % ranks, comm, stream));
  FA_NCCL_CHECK(ncclRecv(recv, bytes, ncclUint8, (rank + ranks - 1) % ranks, comm, stream));
  FA_NCCL_CHECK(ncclGroupEnd());
}

/// Times (ms) of each timed iteration on each rank: [rank][iteration]. *_busy: the ring's
/// compute stream's working time in that pass (RingRank::busy_ms; NaN for Ulysses).
struct BenchTimes {
  int iters;
  Shared<float> forward, backward, hop, forward_busy, backward_busy;
  BenchTimes(int ranks, int iters_)
      : iters(iters_),
        forward(std::size_t(ranks) * iters_, NAN),
        backward(std::size_t(ranks) * iters_, NAN),
        hop(std::size_t(ranks) * iters_, NAN),
        forward_busy(std::size_t(ranks) * iters_, NAN),
        backward_busy(std::size_t(ranks) * iters_, NAN) {}
};

/// Median over iterations of the slowest rank's time: a step ends when its last rank does.
double slowest_median(const Shared<float>& times, int ranks, int iters) {
  std::vector<double> worst(iters, 0.0);
  for (int i = 0; i < iters; ++i)
    for (int r = 0; r < ranks; ++r) worst[i] = std::max(worst[i], double(times[std::size_t(r) * iters + i]));
  std::sort(worst.begin(), worst.end());
  return worst[iters / 2];
}

template <class Rank>
int bench_rank(int rank, ncclComm_t comm, const AttentionShape& s, const SequenceSplit& split, bool transfer,
               int warmup, BenchTimes& out) {
  const DType dtype = DType::BF16;
  const bool hopper = is_hopper();
  const ForwardKernel& fwd = pick_forward(dtype, hopper);
  const BackwardKernel& bwd = pick_backward(false, hopper, s, split);
  const int rows = split.rows(rank);
  const std::size_t el = dtype_size(dtype);
  const int64_t q_elems = int64_t(s.batch) * s.heads_q * rows * s.head_dim;
  const int64_t kv_elems = int64_t(s.batch) * s.heads_kv * rows * s.head_dim;
  DeviceBuffer q(q_elems * el), k(kv_elems * el), v(kv_elems * el), o(q_elems * el), d_o(q_elems * el);
  DeviceBuffer lse(std::size_t(s.batch) * s.heads_q * rows * sizeof(float));
  DeviceBuffer dq(q_elems * el), dk(kv_elems * el), dv(kv_elems * el);
  const uint64_t seed = 1000 + uint64_t(rank);
  fill_uniform(dtype, q.get(), q_elems, seed * 4 + 0, nullptr);
  fill_uniform(dtype, k.get(), kv_elems, seed * 4 + 1, nullptr);
  fill_uniform(dtype, v.get(), kv_elems, seed * 4 + 2, nullptr);
  fill_uniform(dtype, d_o.get(), q_elems, seed * 4 + 3, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  Rank ring = make_rank<Rank>(comm, rank, s, split, fwd, bwd, transfer);
  cudaStream_t stream = ring.compute_stream();
  cudaEvent_t begin, end;
  CUDA_CHECK(cudaEventCreate(&begin));
  CUDA_CHECK(cudaEventCreate(&end));
  DeviceBuffer sync_buf(sizeof(float));
  auto barrier = [&] {  // every rank starts a timed step together
    FA_NCCL_CHECK(ncclAllReduce(sync_buf.get(), sync_buf.get(), 1, ncclFloat, ncclSum, comm, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
  };
  auto timed = [&](const std::function<void()>& work) {
    barrier();
    CUDA_CHECK(cudaEventRecord(begin, stream));
    work();
    CUDA_CHECK(cudaEventRecord(end, stream));
    CUDA_CHECK(cudaEventSynchronize(end));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, begin, end));
    return ms;
  };
  auto forward = [&] { ring.forward(q.get(), k.get(), v.get(), o.get(), lse.as<float>()); };
  auto backward = [&] {
    ring.backward(q.get(), k.get(), v.get(), o.get(), lse.as<float>(), d_o.get(), dq.get(), dk.get(), dv.get());
  };
  // One hop of a forward block (K and V) each way, on the link alone.
  const std::size_t hop_bytes = std::size_t(2 * kv_elems) * el;
  DeviceBuffer hop_out(split.ranks > 1 ? hop_bytes : 0), hop_in(split.ranks > 1 ? hop_bytes : 0);
  auto hop = [&] {
    if (split.ranks > 1) hop_once(comm, rank, split.ranks, hop_out.get(), hop_in.get(), hop_bytes, stream);
  };
  for (int i = 0; i < warmup; ++i) {
    timed(forward);
    timed(backward);
    timed(hop);
  }
  for (int i = 0; i < out.iters; ++i) {
    const std::size_t at = std::size_t(rank) * out.iters + i;
    out.forward[at] = timed(forward);
    if constexpr (std::is_same_v<Rank, RingRank>) out.forward_busy[at] = float(ring.busy_ms());
    out.backward[at] = timed(backward);
    if constexpr (std::is_same_v<Rank, RingRank>) out.backward_busy[at] = float(ring.busy_ms());
    out.hop[at] = timed(hop);
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  return 0;
}

/// Causal attention's useful FLOPs over a sequence of `seq` tokens: the forward's two matrix
/// products over the visible half of the score matrix; the backward does 2.5 times as many.
double causal_forward_flops(const AttentionShape& s) {
  const double pairs = double(s.seq_q) * (s.seq_q + 1) / 2.0;
  return 4.0 * s.batch * s.heads_q * pairs * s.head_dim;
}

int run_bench(const AttentionShape& base, int ranks, int iters, int warmup, const std::string& csv_path) {
  const int t = ring_options.tokens_per_rank;
  std::printf(
      "ring attention benchmark: %d tokens per rank, batch %d, heads %d/%d, head_dim %d, causal, bf16; "
      "median of %d steps, each the slowest rank's time\n",
      t, base.batch, base.heads_q, base.heads_kv, base.head_dim, iters);
  struct Config {
    std::string name;
    int ranks;
    Split kind;
    bool transfer;
    Method method = Method::Ring;
  };
  std::vector<Config> configs{{"1 rank", 1, Split::Contiguous, true}};
  if (ranks == 1) configs.push_back({"1 rank, zigzag chunks", 1, Split::Zigzag, true});
  if (ranks > 1) {
    const auto asked = [](Split kind) {
      return std::find(ring_options.splits.begin(), ring_options.splits.end(), kind) != ring_options.splits.end();
    };
    if (asked(Split::Contiguous))
      configs.push_back({std::to_string(ranks) + " ranks contiguous", ranks, Split::Contiguous, true});
    configs.push_back({std::to_string(ranks) + " ranks zigzag", ranks, Split::Zigzag, true});
    configs.push_back({std::to_string(ranks) + " ranks zigzag, compute alone", ranks, Split::Zigzag, false});
    AttentionShape whole = base;
    whole.seq_q = whole.seq_kv = t * ranks;
    if (ulysses_gpu_reason(whole, ranks).empty())
      configs.push_back({std::to_string(ranks) + " ranks Ulysses", ranks, Split::Contiguous, true, Method::Ulysses});
  }
  std::printf("%-36s %9s %9s %10s %10s %11s %11s %11s %9s %9s %9s %9s\n", "run", "tokens", "fwd ms", "fwd TF/s",
              "bwd ms", "bwd TF/s", "fwd x 1rank", "bwd x 1rank", "hop ms", "hop GB/s", "fwd busy", "bwd busy");
  Shared<char> gpu_name(256, 0);
  std::string rows;
  double one_fwd = 0, one_bwd = 0;
  int failed = 0;
  for (const Config& c : configs) {
    AttentionShape s = base;
    s.seq_q = s.seq_kv = t * c.ranks;
    s.causal = true;
    const SequenceSplit split = split_sequence(s.seq_q, c.ranks, c.kind);
    BenchTimes times(c.ranks, iters);
    const int rc = run_ranks(c.ranks, [&](int rank, ncclComm_t comm) {
      if (rank == 0) {
        cudaDeviceProp prop{};
        CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        std::memcpy(gpu_name.data(), prop.name, 255);  // the last of 256 bytes stays 0
      }
      return c.method == Method::Ulysses ? bench_rank<UlyssesRank>(rank, comm, s, split, c.transfer, warmup, times)
                                         : bench_rank<RingRank>(rank, comm, s, split, c.transfer, warmup, times);
    });
    if (rc != 0 && c.ranks == 1) {  // every ratio below is over this run
      std::printf("%-36s the rank failed: no ratios to give\n", c.name.c_str());
      return 1;
    }
    if (rc != 0) {
      std::printf("%-36s a rank failed\n", c.name.c_str());
      ++failed;
      continue;
    }
    const double f_ms = slowest_median(times.forward, c.ranks, iters);
    const double b_ms = slowest_median(times.backward, c.ranks, iters);
    const double h_ms = slowest_median(times.hop, c.ranks, iters);
    const bool ring = c.method == Method::Ring;
    const double f_busy = ring ? slowest_median(times.forward_busy, c.ranks, iters) : NAN;
    const double b_busy = ring ? slowest_median(times.backward_busy, c.ranks, iters) : NAN;
    const double f_tf = causal_forward_flops(s) / (f_ms * 1e-3) / 1e12;
    const double b_tf = 2.5 * causal_forward_flops(s) / (b_ms * 1e-3) / 1e12;
    if (c.ranks == 1 && one_fwd == 0) {
      one_fwd = f_tf;
      one_bwd = b_tf;
    }
    // One hop moves a rank's K and V block (bf16) each way.
    const double hop_bytes = 2.0 * s.batch * s.heads_kv * double(t) * s.head_dim * 2.0;
    const double hop_gbps = c.ranks > 1 ? hop_bytes / (h_ms * 1e-3) / 1e9 : 0.0;
    const std::string busy_f = ring ? fmt("%.2f", f_busy) : "", busy_b = ring ? fmt("%.2f", b_busy) : "";
    std::printf("%-36s %9d %9.2f %10.1f %10.2f %11.1f %11.2f %11.2f %9s %9s %9s %9s\n", c.name.c_str(), s.seq_q, f_ms,
                f_tf, b_ms, b_tf, f_tf / one_fwd, b_tf / one_bwd, c.ranks > 1 ? fmt("%.3f", h_ms).c_str() : "-",
                c.ranks > 1 ? fmt("%.0f", hop_gbps).c_str() : "-", ring ? busy_f.c_str() : "-",
                ring ? busy_b.c_str() : "-");
    char line[512];
    std::snprintf(line, sizeof line, "\"%s\",%d,%s,%d,%d,%.3f,%.1f,%.3f,%.1f,%.3f,%.3f,%s,%s,%s,%s\n", c.name.c_str(),
                  c.ranks, split_name(c.kind), c.transfer ? 1 : 0, s.seq_q, f_ms, f_tf, b_ms, b_tf, f_tf / one_fwd,
                  b_tf / one_bwd, c.ranks > 1 ? fmt("%.3f", h_ms).c_str() : "",
                  c.ranks > 1 ? fmt("%.1f", hop_gbps).c_str() : "", busy_f.c_str(), busy_b.c_str());
    rows += line;
  }
  if (!csv_path.empty() && failed == 0) {
    FILE* f = std::fopen(csv_path.c_str(), "w");
    if (!f) throw std::runtime_error("cannot write " + csv_path);
    int nccl = 0;
    ncclGetVersion(&nccl);
    const std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    // The NCCL settings of the run, as the command's environment (NCCL_NVLS_ENABLE=0 and the like).
    std::string env;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "NCCL_", 5) == 0 && std::strncmp(*e, "NCCL_VERSION=", 13) != 0) env += std::string(*e) + " ";
    std::fprintf(f,
                 "# %d x %s (one machine), NCCL %d.%d.%d, %s: %sbuild/bin/ch10_context_parallel --bench --ranks %d "
                 "%s--tokens-per-rank %d --batch %d --heads %d --heads-kv %d --dim %d --iters %d\n",
                 ranks, gpu_name.data(), nccl / 10000, nccl / 100 % 100, nccl % 100, date, env.c_str(), ranks,
                 ring_options.splits.size() == 1
                     ? (std::string("--split ") + split_name(ring_options.splits[0]) + " ").c_str()
                     : "",
                 t, base.batch, base.heads_q, base.heads_kv, base.head_dim, iters);
    std::fprintf(f,
                 "run,ranks,split,transfer,tokens,fwd_ms,fwd_tflops,bwd_ms,bwd_tflops,fwd_over_one_rank,"
                 "bwd_over_one_rank,hop_ms,hop_gbps,fwd_busy_ms,bwd_busy_ms\n%s",
                 rows.c_str());
    std::fclose(f);
    std::printf("wrote %s\n", csv_path.c_str());
  }
  return failed == 0 ? 0 : 1;
}

int run_chapter(const CliOptions& opt, int argc, const char* const* argv) {
  const int gpus = count_gpus();
  const int ranks = ring_options.ranks ? ring_options.ranks : gpus;
  AttentionShape shape = opt.shape;
  if (!flag_given(argc, argv, "--batch")) shape.batch = ring_options.bench || ring_options.documents ? 1 : 2;
  if (!flag_given(argc, argv, "--heads")) shape.heads_q = ring_options.bench ? 16 : 8;
  if (!flag_given(argc, argv, "--heads-kv")) shape.heads_kv = ring_options.bench ? shape.heads_q : 2;
  if (!flag_given(argc, argv, "--dim")) shape.head_dim = 128;
  if (!flag_given(argc, argv, "--seq")) shape.seq_q = shape.seq_kv = 1001;
  if (!flag_given(argc, argv, "--no-causal")) shape.causal = true;
  if (shape.seq_q != shape.seq_kv)
    throw std::invalid_argument("context parallelism splits one sequence: --seq-q (" + std::to_string(shape.seq_q) +
                                ") must equal --seq-kv (" + std::to_string(shape.seq_kv) + ")");
  shape.validate();
  if (ring_options.documents > 0 && ring_options.bench)
    throw std::invalid_argument("--documents is the check's; the benchmark runs one sequence");
  if (ring_options.documents > 0 && shape.batch != 1)
    throw std::invalid_argument("--documents packs one sequence: it needs --batch 1, got --batch " +
                                std::to_string(shape.batch));
  const uint64_t seed = opt.seed;  // fresh from parse_cli unless --seed was given
  // One rank on one GPU runs when asked for (--ranks 1): the ring's chunks, pairs and merges
  // without a hop.
  if (ranks > gpus || (ranks < 2 && ring_options.ranks != 1)) {
    const std::string why = gpus < 2 ? "chapter 10 needs two GPUs; this machine has " + std::to_string(gpus)
                                     : "--ranks " + std::to_string(ranks) + " asks for more GPUs than the " +
                                           std::to_string(gpus) + " there are";
    if (ring_options.gpu_only && gpus < 2) {
      std::printf("skipped: %s\n", why.c_str());
      return 77;
    }
    if (ranks > gpus && gpus >= 2) throw std::invalid_argument(why);
    std::printf("%s: running the simulated ranks instead\n", why.c_str());
    AttentionShape small = shape;
    if (!opt.shape_given) small = {1, 4, 2, 97, 97, 32, true, 0.0};
    return run_simulated(small, seed);
  }
  if (ring_options.bench)
    return run_bench(shape, ranks, std::max(3, std::min(opt.iters, 10)), std::max(1, opt.warmup), opt.csv);
  return run_check(shape, seed, ranks);
}

}  // namespace
}  // namespace fa::context_parallel

int main(int argc, char** argv) {
  using namespace fa::context_parallel;
  std::vector<const char*> rest;
  try {
    rest = take_ring_flags(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "ch10_context_parallel: error: %s\n", e.what());
    return 2;
  }
  fa::ChapterBody body;
  body.help_notes = kHelp;
  body.print_variants = [] { std::printf("chapter 10 variants:\n  1/ring  ring attention over NCCL (ring_gpu.h)\n"); };
  body.require_variant = [](const std::string& variant) {
    if (variant != "all" && variant != "1" && variant != "ring")
      throw std::invalid_argument("unknown variant '" + variant + "' for chapter 10; available: 1/ring, all");
  };
  body.run = [](const fa::CliOptions& opt, int n, const char* const* args) { return run_chapter(opt, n, args); };
  return fa::chapter_main(int(rest.size()), rest.data(),
                          {10, "ch10_context_parallel", "attention across GPUs: ring attention over NCCL", false},
                          body);
}
