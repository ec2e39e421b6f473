// The grader's GPU runner: one chapter's kernels (the student's code), looked up by name in the
// registry, which in this program holds that chapter's kernels and no other's. It reads one
// request from stdin (protocol.h): the inputs the checker drew, already rounded to the kernel's
// dtype; it launches the kernel on outputs filled with NaN first, and writes O and LSE (or dQ,
// dK, dV) back as float32. With time=1 it also times the launches (time_ms: the median of
// `iters` after 3 warm-ups, outputs poisoned and Q scaled by a fresh factor before each) for the
// speed part of an exercise, and answers with the outputs of one timed launch drawn after it ran,
// and that launch's factor. CMake builds it once per chapter
// (fa_runner_chNN, classroom/grader/CMakeLists.txt).
#include <cuda_runtime.h>
#include <sys/random.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "dtype.h"
#include "protocol.h"
#include "registry.h"
#include "tensor.h"

namespace fa::grader {
namespace {

DeviceBuffer upload(DType dtype, const float* values, std::size_t n) {
  return upload_as(dtype, std::vector<float>(values, values + n));
}

/// A device buffer of n elements of `dtype`, every byte 0xFF (NaN in every float format).
DeviceBuffer poisoned(DType dtype, std::size_t n) {
  DeviceBuffer b(std::max<std::size_t>(1, n * dtype_size(dtype)));
  CUDA_CHECK(cudaMemset(b.get(), 0xFF, b.bytes()));
  return b;
}

std::vector<float> download(DType dtype, const DeviceBuffer& b, std::size_t n) {
  std::vector<unsigned char> raw(n * dtype_size(dtype));
  if (n) CUDA_CHECK(cudaMemcpy(raw.data(), b.get(), raw.size(), cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  decode_elements(dtype, raw.data(), out.data(), n);
  return out;
}

/// A random number below n, from the kernel's generator (getrandom: no file to open).
std::uint64_t draw_below(std::uint64_t n) {
  std::uint64_t x = 0;
  if (getrandom(&x, sizeof x, 0) != ssize_t(sizeof x)) throw std::runtime_error("getrandom failed");
  return x % n;
}

/// A fresh factor for a timed launch's Q, from 0.75 to 1.5: drawn when the launch is prepared, so no
/// launch can find an earlier one's results (or row statistics) for its own inputs anywhere.
float draw_scale() { return 0.75f + 0.75f * float(draw_below(1u << 24)) / float(1u << 24); }

/// Q (n values) times `scale`, rounded to `dtype` as the checker rounds it (round_to_dtype), into b.
void upload_scaled(DType dtype, DeviceBuffer& b, const float* q, std::size_t n, float scale) {
  std::vector<float> scaled(n);
  for (std::size_t i = 0; i < n; ++i) scaled[i] = q[i] * scale;
  std::vector<unsigned char> raw(n * dtype_size(dtype));
  encode_elements(dtype, scaled.data(), raw.data(), n);
  CUDA_CHECK(cudaMemcpy(b.get(), raw.data(), raw.size(), cudaMemcpyHostToDevice));
}

/// The median time of `iters` launches after 3 warm-ups; `poison` runs before each launch, outside
/// the timed span (it poisons the outputs and scales Q afresh), so that no launch finds the
/// previous one's results to skip its work. Each
/// launch is timed by the host clock from a device-wide synchronize to the next: work that a
/// launch moved to a stream of its own counts as much as work on the runner's.
/// After timed launch i (outside its span) `keep` copies its outputs with probability 1/(i + 1),
/// so that the outputs kept at the end are any timed launch's with equal odds, and which one is
/// drawn only after it ran: a launch cannot know whether its outputs are the ones judged.
template <class Launch, class Poison, class Keep>
double time_ms(Launch launch, Poison poison, Keep keep, int iters) {
  for (int i = 0; i < 3; ++i) {
    poison();
    launch();
  }
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    poison();
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto start = std::chrono::steady_clock::now();
    launch();
    CUDA_CHECK(cudaDeviceSynchronize());
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    if (draw_below(std::uint64_t(i) + 1) == 0) keep();
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Answer run(const Header& h, const std::vector<float>& in) {
  Answer r;
  const std::string name = h.str("kernel");
  const bool timed = h.args.count("time") && h.num("time") != 0;
  r.iters = timed ? int(std::clamp<long long>(h.num("iters"), 1, 200)) : 0;
  if (h.task == "forward") {
    const AttentionShape s = shape_of(h);
    s.validate();
    const ForwardKernel* k = nullptr;
    for (const auto& kernel : forward_kernels())
      if (kernel.name == name) k = &kernel;
    if (!k) throw std::runtime_error("this runner has no forward kernel '" + name + "'");
    if (const std::string why = support_reason(*k, s); !why.empty()) throw std::runtime_error(why);
    const auto p = pieces(in, {std::size_t(s.q_elems()), std::size_t(s.kv_elems()), std::size_t(s.kv_elems())});
    DeviceBuffer q = upload(k->dtype, p[0], s.q_elems()), kk = upload(k->dtype, p[1], s.kv_elems()),
                 v = upload(k->dtype, p[2], s.kv_elems());
    DeviceBuffer o = poisoned(k->dtype, s.q_elems()), lse = poisoned(DType::F32, s.lse_elems());
    DeviceBuffer ws(std::max<std::size_t>(1, k->workspace_bytes ? k->workspace_bytes(s) : 0));
    ForwardParams fp;
    fp.shape = s;
    fp.q = q.get();
    fp.k = kk.get();
    fp.v = v.get();
    fp.o = o.get();
    fp.lse = static_cast<float*>(lse.get());
    fp.workspace = ws.get();
    k->launch(fp);
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto read_back = [&] {
      r.out = download(k->dtype, o, s.q_elems());
      const std::vector<float> l = download(DType::F32, lse, s.lse_elems());
      r.out.insert(r.out.end(), l.begin(), l.end());
    };
    if (timed) {
      // Outputs and scratch poisoned and Q scaled by a fresh factor before every launch (memory
      // a kernel kept from an earlier launch describes other inputs); the outputs answered are
      // those of a timed launch drawn after the fact (time_ms), with that launch's factor.
      float scale = 1.0f;
      const auto prepare = [&] {
        for (const DeviceBuffer* b : {&o, &lse, &ws}) CUDA_CHECK(cudaMemsetAsync(b->get(), 0xFF, b->bytes()));
        scale = draw_scale();
        upload_scaled(k->dtype, q, p[0], s.q_elems(), scale);
      };
      const auto keep = [&] {
        read_back();
        r.q_scale = scale;
      };
      r.ms = time_ms([&] { k->launch(fp); }, prepare, keep, r.iters);
    } else {
      read_back();
    }
    return r;
  }
  if (h.task == "backward") {
    const AttentionShape s = shape_of(h);
    s.validate();
    const BackwardKernel* k = nullptr;
    for (const auto& kernel : backward_kernels())
      if (kernel.name == name) k = &kernel;
    if (!k) throw std::runtime_error("this runner has no backward kernel '" + name + "'");
    if (const std::string why = support_reason(*k, s); !why.empty()) throw std::runtime_error(why);
    const std::size_t nq = s.q_elems(), nk = s.kv_elems();
    const auto p = pieces(in, {nq, nk, nk, nq, std::size_t(s.lse_elems()), nq});
    DeviceBuffer q = upload(k->dtype, p[0], nq), kk = upload(k->dtype, p[1], nk), v = upload(k->dtype, p[2], nk),
                 o = upload(k->dtype, p[3], nq), lse = upload(DType::F32, p[4], s.lse_elems()),
                 d_o = upload(k->dtype, p[5], nq);
    DeviceBuffer dq = poisoned(k->dtype, nq), dk = poisoned(k->dtype, nk), dv = poisoned(k->dtype, nk);
    DeviceBuffer ws(std::max<std::size_t>(1, k->workspace_bytes ? k->workspace_bytes(s) : 0));
    BackwardParams bp;
    bp.shape = s;
    bp.q = q.get();
    bp.k = kk.get();
    bp.v = v.get();
    bp.o = o.get();
    bp.d_o = d_o.get();
    bp.lse = static_cast<const float*>(lse.get());
    bp.dq = dq.get();
    bp.dk = dk.get();
    bp.dv = dv.get();
    bp.workspace = ws.get();
    k->launch(bp);
    CUDA_CHECK(cudaDeviceSynchronize());
    for (const DeviceBuffer* b : {&dq, &dk, &dv}) {
      const std::vector<float> x = download(k->dtype, *b, b == &dq ? nq : nk);
      r.out.insert(r.out.end(), x.begin(), x.end());
    }
    return r;
  }
  if (h.task == "decode") {
    DecodeShape s;
    s.num_seqs = int(h.num("seqs"));
    s.heads_q = int(h.num("hq"));
    s.heads_kv = int(h.num("hkv"));
    s.head_dim = int(h.num("d"));
    s.block_size = int(h.num("block_size"));
    s.num_blocks = int(h.num("blocks"));
    s.max_blocks_per_seq = int(h.num("max_blocks"));
    s.max_context = int(h.num("max_context"));
    s.validate();
    const DecodeKernel* k = nullptr;
    for (const auto& kernel : decode_kernels())
      if (kernel.name == name) k = &kernel;
    if (!k) throw std::runtime_error("this runner has no decode kernel '" + name + "'");
    if (const std::string why = support_reason(*k, s); !why.empty()) throw std::runtime_error(why);
    const std::size_t nq = s.q_elems(), nc = s.cache_elems();
    const std::size_t nt = std::size_t(s.num_seqs) * s.max_blocks_per_seq;
    const auto p = pieces(in, {nq, nc, nc, nt, std::size_t(s.num_seqs)});
    std::vector<int> tables(nt), lens(s.num_seqs);
    for (std::size_t i = 0; i < nt; ++i) tables[i] = int(p[3][i]);
    for (int i = 0; i < s.num_seqs; ++i) lens[i] = int(p[4][i]);
    DeviceBuffer q = upload(k->dtype, p[0], nq), kc = upload(k->dtype, p[1], nc), vc = upload(k->dtype, p[2], nc);
    DeviceBuffer t(std::max<std::size_t>(1, nt * sizeof(int))), c(std::max<std::size_t>(1, lens.size() * sizeof(int)));
    CUDA_CHECK(cudaMemcpy(t.get(), tables.data(), nt * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(c.get(), lens.data(), lens.size() * sizeof(int), cudaMemcpyHostToDevice));
    DeviceBuffer o = poisoned(k->dtype, nq), lse = poisoned(DType::F32, s.lse_elems());
    DeviceBuffer ws(std::max<std::size_t>(1, k->workspace_bytes ? k->workspace_bytes(s) : 0));
    DecodeParams dp;
    dp.shape = s;
    dp.q = q.get();
    dp.k_cache = kc.get();
    dp.v_cache = vc.get();
    dp.block_tables = static_cast<const int*>(t.get());
    dp.context_lens = static_cast<const int*>(c.get());
    dp.o = o.get();
    dp.lse = static_cast<float*>(lse.get());
    dp.workspace = ws.get();
    k->launch(dp);
    CUDA_CHECK(cudaDeviceSynchronize());
    r.out = download(k->dtype, o, nq);
    const std::vector<float> l = download(DType::F32, lse, s.lse_elems());
    r.out.insert(r.out.end(), l.begin(), l.end());
    return r;
  }
  throw std::runtime_error("the GPU runner has no task '" + h.task + "'");
}

}  // namespace
}  // namespace fa::grader

int main() {
  // CUDA up before the filter (confine.h): every module loaded now, every device file opened.
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  if (cudaFree(nullptr) != cudaSuccess) {
    std::printf("error CUDA did not start: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
  }
  return fa::grader::serve(fa::grader::run, fa::grader::Confinement::Gpu);
}
