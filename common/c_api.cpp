// The C interface of c_api.h over the registry: look a kernel up by name, check the shape,
// launch it, and turn every exception into a status and one line of text.
#include "c_api.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

#include "cuda_check.h"
#include "registry.h"

namespace fa {

namespace {

thread_local std::string last_error;

fa_status fail(fa_status status, std::string message) {
  last_error = std::move(message);
  return status;
}

fa_status ok() {
  last_error.clear();
  return FA_OK;
}

// Runs `body`, which returns FA_OK or fails itself; every exception becomes a status.
template <class Body>
fa_status guarded(Body&& body) noexcept {
  try {
    return body();
  } catch (const std::invalid_argument& e) {
    return fail(FA_ERR_INVALID_ARGUMENT, e.what());
  } catch (const CudaError& e) {
    return fail(FA_ERR_CUDA, e.what());
  } catch (const std::exception& e) {
    return fail(FA_ERR_INTERNAL, e.what());
  } catch (...) {
    return fail(FA_ERR_INTERNAL, "a launcher threw something that is not a std::exception");
  }
}

const char* kind_name(fa_kind kind) {
  switch (kind) {
    case FA_KIND_FORWARD: return "forward";
    case FA_KIND_BACKWARD: return "backward";
    case FA_KIND_DECODE: return "decode";
  }
  return "?";
}

fa_dtype to_c(DType dtype) {
  switch (dtype) {
    case DType::F32: return FA_DTYPE_F32;
    case DType::F16: return FA_DTYPE_F16;
    case DType::BF16: return FA_DTYPE_BF16;
  }
  return FA_DTYPE_F32;
}

AttentionShape to_shape(const fa_shape& c) {
  if (c.causal != 0 && c.causal != 1)
    throw std::invalid_argument("causal must be 0 or 1, got " + std::to_string(c.causal));
  AttentionShape s;
  s.batch = c.batch;
  s.heads_q = c.heads_q;
  s.heads_kv = c.heads_kv;
  s.seq_q = c.seq_q;
  s.seq_kv = c.seq_kv;
  s.head_dim = c.head_dim;
  s.causal = c.causal == 1;
  s.scale = c.scale;
  s.validate();
  return s;
}

DecodeShape to_shape(const fa_decode_shape& c) {
  DecodeShape s;
  s.num_seqs = c.num_seqs;
  s.heads_q = c.heads_q;
  s.heads_kv = c.heads_kv;
  s.head_dim = c.head_dim;
  s.query_len = c.query_len;
  s.block_size = c.block_size;
  s.num_blocks = c.num_blocks;
  s.max_blocks_per_seq = c.max_blocks_per_seq;
  s.max_context = c.max_context;
  s.validate();
  return s;
}

// Chapter 09's features and their device inputs, from the C struct (null: none), validated
// against the shape; the pointers are checked with the launch's others.
struct FeatureInput {
  AttentionFeatures features;
  AttentionExtras extras;
};

FeatureInput to_features(const fa_features* c, const AttentionShape& shape) {
  FeatureInput in;
  if (c == nullptr) return in;
  if (c->alibi != 0 && c->alibi != 1)
    throw std::invalid_argument("alibi must be 0 or 1, got " + std::to_string(c->alibi));
  in.features.window_left = c->window_left;
  in.features.window_right = c->window_right;
  in.features.softcap = c->softcap;
  in.features.alibi = c->alibi == 1;
  in.features.bias = c->bias != nullptr;
  in.features.sequences = c->sequences;
  in.features.validate(shape);
  in.extras.bias = c->bias;
  if (in.features.varlen()) {
    if (c->cu_seqlens_q == nullptr || c->cu_seqlens_k == nullptr)
      throw std::invalid_argument("a packed batch (sequences " + std::to_string(c->sequences) +
                                  ") needs cu_seqlens_q and cu_seqlens_k; one is a null pointer");
    for (const auto& [name, value, limit] :
         {std::tuple<const char*, int, int>{"max_seqlen_q", c->max_seqlen_q, shape.seq_q},
          {"max_seqlen_k", c->max_seqlen_k, shape.seq_kv}}) {
      if (value < 1 || value > limit) {
        throw std::invalid_argument(std::string(name) + " must be between 1 and " + std::to_string(limit) +
                                    " (the packed total), got " + std::to_string(value));
      }
    }
    in.extras.cu_seqlens_q = c->cu_seqlens_q;
    in.extras.cu_seqlens_k = c->cu_seqlens_k;
    in.extras.max_seqlen_q = c->max_seqlen_q;
    in.extras.max_seqlen_k = c->max_seqlen_k;
  }
  if (c->alibi_slopes != nullptr) {
    if (!in.features.alibi) throw std::invalid_argument("alibi_slopes are given but alibi is 0; set alibi to 1");
    if (c->alibi_slopes_per_sequence != 0 && c->alibi_slopes_per_sequence != 1)
      throw std::invalid_argument("alibi_slopes_per_sequence must be 0 or 1, got " +
                                  std::to_string(c->alibi_slopes_per_sequence));
    in.extras.alibi_slopes = c->alibi_slopes;
    in.extras.alibi_slopes_per_sequence = c->alibi_slopes_per_sequence == 1;
  }
  return in;
}

// The probe shapes for the listing: one small problem per head_dim.
AttentionShape probe_shape(int head_dim) {
  AttentionShape s;
  s.batch = 1;
  s.heads_q = s.heads_kv = 1;
  s.seq_q = s.seq_kv = 128;
  s.head_dim = head_dim;
  return s;
}

DecodeShape probe_decode_shape(int head_dim) {
  DecodeShape s;
  s.num_seqs = 1;
  s.heads_q = s.heads_kv = 1;
  s.head_dim = head_dim;
  s.block_size = 16;
  s.num_blocks = s.max_blocks_per_seq = 8;
  s.max_context = 128;
  return s;
}

// "64,128" or "1-128": the accepted head_dim values from 1 to 256, runs written as ranges.
template <class Accepts>
std::string head_dim_list(Accepts&& accepts) {
  std::string out;
  int d = 1;
  while (d <= 256) {
    if (!accepts(d)) {
      ++d;
      continue;
    }
    int last = d;
    while (last + 1 <= 256 && accepts(last + 1)) ++last;
    if (!out.empty()) out += ",";
    out += last == d ? std::to_string(d) : std::to_string(d) + "-" + std::to_string(last);
    d = last + 1;
  }
  return out;
}

// The listing's strings, computed once per kernel and kept for the library's lifetime.
struct Listing {
  std::string head_dims;
  std::string unavailable;
};

template <class Entry, class Probe>
const Listing& listing_of(const Entry& entry, Probe&& probe) {
  static std::mutex mutex;
  static std::map<const void*, Listing> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = cache.find(&entry);
  if (found != cache.end()) return found->second;
  Listing listing;
  // head_dim 64 is the one every kernel of the tutorial takes: a reason there is not about
  // head_dim but about the machine (the GPU's architecture, or no GPU at all).
  listing.head_dims = head_dim_list([&](int d) { return support_reason(entry, probe(d)).empty(); });
  listing.unavailable = support_reason(entry, probe(64));
  const GpuInfo& gpu = detect_gpu();
  if (!gpu.available) listing.unavailable = describe_gpu(gpu);
  return cache.emplace(&entry, std::move(listing)).first->second;
}

template <class Entry>
void fill_common(const Entry& entry, fa_kernel_info* info) {
  *info = fa_kernel_info{};
  info->name = entry.name.c_str();
  info->variant = entry.variant.c_str();
  info->summary = entry.summary.c_str();
  info->chapter = entry.chapter;
  info->number = entry.number;
}

void fill_tolerance(const Tolerance& tolerance, fa_kernel_info* info) {
  info->tolerance_rel_fro = tolerance.rel_fro;
  info->tolerance_max_abs = tolerance.max_abs;
  info->tolerance_lse_abs = tolerance.lse_abs;
}

void fill(const ForwardKernel& k, fa_kernel_info* info) {
  fill_common(k, info);
  info->dtype = to_c(k.dtype);
  const Listing& listing = listing_of(k, probe_shape);
  info->head_dims = listing.head_dims.c_str();
  info->unavailable = listing.unavailable.c_str();
  fill_tolerance(k.tolerance ? *k.tolerance : tolerance_for(k.dtype), info);
  info->coarse_arithmetic = k.tolerance ? 1 : 0;
  info->strided = k.strided ? 1 : 0;
}

void fill(const BackwardKernel& k, fa_kernel_info* info) {
  fill_common(k, info);
  info->dtype = to_c(k.dtype);
  info->deterministic = k.deterministic ? 1 : 0;
  info->strided = k.strided ? 1 : 0;
  const Listing& listing = listing_of(k, probe_shape);
  info->head_dims = listing.head_dims.c_str();
  info->unavailable = listing.unavailable.c_str();
}

void fill(const DecodeKernel& k, fa_kernel_info* info) {
  fill_common(k, info);
  info->dtype = to_c(k.dtype);
  const Listing& listing = listing_of(k, probe_decode_shape);
  info->head_dims = listing.head_dims.c_str();
  info->unavailable = listing.unavailable.c_str();
  fill_tolerance(tolerance_for(k.dtype), info);
}

template <class Entry>
const Entry* find_in(const std::vector<Entry>& list, const char* name) {
  for (const Entry& entry : list) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

template <class Entry>
std::string names_of(const std::vector<Entry>& list) {
  std::string out;
  for (const Entry& entry : list) out += (out.empty() ? "" : ", ") + entry.name;
  return out;
}

// The kernel called `name` in `list`, or a failure naming the value and the choices.
template <class Entry>
fa_status lookup(const std::vector<Entry>& list, fa_kind kind, const char* name, const Entry** found) {
  if (name == nullptr) return fail(FA_ERR_INVALID_ARGUMENT, "the kernel name is null");
  *found = find_in(list, name);
  if (*found == nullptr) {
    return fail(FA_ERR_UNKNOWN_KERNEL,
                std::string("unknown ") + kind_name(kind) + " kernel '" + name + "'; registered: " + names_of(list));
  }
  return FA_OK;
}

// Shape and machine checks shared by the *_check functions and the launches.
template <class Entry, class Shape, class... Features>
fa_status check_entry(const Entry& entry, const Shape& shape, std::size_t* workspace_bytes,
                      const Features&... features) {
  const std::string reason = support_reason(entry, shape, features...);
  if (!reason.empty()) {
    std::string what;
    if constexpr (sizeof...(Features) == 1) what = describe(shape, features...);
    else what = shape.to_string();
    return fail(FA_ERR_UNSUPPORTED, entry.name + " does not take " + what + ": " + reason);
  }
  if (workspace_bytes) *workspace_bytes = entry.workspace_bytes ? entry.workspace_bytes(shape) : 0;
  return FA_OK;
}

fa_status require_gpu() {
  const GpuInfo& gpu = detect_gpu();
  if (!gpu.available) return fail(FA_ERR_NO_GPU, describe_gpu(gpu));
  return FA_OK;
}

#define FA_RETURN_IF_FAILED(call)               \
  do {                                          \
    const fa_status fa_status_ = (call);        \
    if (fa_status_ != FA_OK) return fa_status_; \
  } while (0)

// Tensors (and the workspace) must start on a 16-byte boundary: the kernels move rows in 16-byte
// pieces (vector loads, TMA and bulk copies), which need 16-byte addresses. LSE and the int arrays
// are read one element at a time and need their own 4. cudaMalloc and PyTorch's allocator give
// 256; a misaligned view is refused here rather than left to the kernels, where a misaligned
// vector load is a device fault that ends the caller's CUDA context.
constexpr std::size_t kTensorAlignment = 16;
constexpr std::size_t kElementAlignment = 4;

fa_status require_aligned(const char* name, const void* pointer, std::size_t alignment) {
  const std::size_t offset = std::size_t(reinterpret_cast<std::uintptr_t>(pointer) % alignment);
  if (offset == 0) return FA_OK;
  const std::string boundary = std::to_string(alignment) + "-byte";
  return fail(FA_ERR_INVALID_ARGUMENT, std::string(name) + " must be " + boundary + " aligned, got an address " +
                                           std::to_string(offset) + " bytes past a " + boundary + " boundary");
}

fa_status require_pointers(std::initializer_list<std::pair<const char*, const void*>> pointers, std::size_t alignment) {
  for (const auto& [name, pointer] : pointers) {
    if (pointer == nullptr) return fail(FA_ERR_INVALID_ARGUMENT, std::string(name) + " is a null pointer");
    FA_RETURN_IF_FAILED(require_aligned(name, pointer, alignment));
  }
  return FA_OK;
}

fa_status require_workspace(const void* workspace, std::size_t given, std::size_t needed) {
  if (given < needed) {
    return fail(FA_ERR_INVALID_ARGUMENT, "workspace_bytes is " + std::to_string(given) +
                                             ", the kernel needs at least " + std::to_string(needed));
  }
  if (needed == 0) return FA_OK;
  if (workspace == nullptr) return fail(FA_ERR_INVALID_ARGUMENT, "workspace is a null pointer");
  return require_aligned("workspace", workspace, kTensorAlignment);
}

// The *_check functions: the kernel by name, then the shape (a C struct) against it.
template <class Entry, class CShape>
fa_status check_by_name(const std::vector<Entry>& list, fa_kind kind, const char* name, const CShape* shape,
                        std::size_t* workspace_bytes) {
  return guarded([&] {
    const Entry* k = nullptr;
    FA_RETURN_IF_FAILED(lookup(list, kind, name, &k));
    if (shape == nullptr) return fail(FA_ERR_INVALID_ARGUMENT, "shape is a null pointer");
    FA_RETURN_IF_FAILED(check_entry(*k, to_shape(*shape), workspace_bytes));
    return ok();
  });
}

// The same with chapter 09's features.
template <class Entry>
fa_status check_features_by_name(const std::vector<Entry>& list, fa_kind kind, const char* name, const fa_shape* shape,
                                 const fa_features* features, std::size_t* workspace_bytes) {
  return guarded([&] {
    const Entry* k = nullptr;
    FA_RETURN_IF_FAILED(lookup(list, kind, name, &k));
    if (shape == nullptr) return fail(FA_ERR_INVALID_ARGUMENT, "shape is a null pointer");
    const AttentionShape s = to_shape(*shape);
    FA_RETURN_IF_FAILED(check_entry(*k, s, workspace_bytes, to_features(features, s).features));
    return ok();
  });
}

TensorStrides from_c(const fa_strides& c) { return {c.batch, c.head, c.row}; }
/// The C array of strides in the order c_api.h gives (q, k, v, o[, d_o, dq, dk, dv]).
ForwardStrides from_c(const fa_strides* c, const ForwardStrides&) {
  return {from_c(c[0]), from_c(c[1]), from_c(c[2]), from_c(c[3])};
}
BackwardStrides from_c(const fa_strides* c, const BackwardStrides&) {
  return {from_c(c[0]), from_c(c[1]), from_c(c[2]), from_c(c[3]),
          from_c(c[4]), from_c(c[5]), from_c(c[6]), from_c(c[7])};
}

// The body of every launch: the kernel by name, the shape, the pointers (`tensors` on 16 bytes,
// `elements` -- LSE and the int arrays -- on 4), the features (forward and backward), the GPU,
// the shape against the kernel, the workspace; then `params`, its pointers filled in by the
// caller, gets the shape, the features, the workspace and the stream and is launched.
template <class Entry, class CShape, class Params>
fa_status launch_by_name(const std::vector<Entry>& list, fa_kind kind, const char* name, const CShape* shape,
                         std::initializer_list<std::pair<const char*, const void*>> tensors,
                         std::initializer_list<std::pair<const char*, const void*>> elements, void* workspace,
                         std::size_t workspace_bytes, void* stream, Params params,
                         const fa_features* features = nullptr, const fa_strides* strides = nullptr) {
  return guarded([&] {
    const Entry* kernel = nullptr;
    FA_RETURN_IF_FAILED(lookup(list, kind, name, &kernel));
    if (shape == nullptr) return fail(FA_ERR_INVALID_ARGUMENT, "shape is a null pointer");
    const auto s = to_shape(*shape);
    // Strides (strides.h), for the kernels that take them; kept alive until the launch returns.
    using Strides = std::conditional_t<std::is_same_v<Params, BackwardParams>, BackwardStrides, ForwardStrides>;
    Strides given{};
    if constexpr (!std::is_same_v<Params, DecodeParams>) {
      if (strides != nullptr) {
        if (!kernel->strided)
          return fail(FA_ERR_UNSUPPORTED, std::string(name) +
                                              " takes packed [batch, heads, seq, head_dim] tensors "
                                              "only; copy strided ones first");
        given = from_c(strides, given);
        if (std::string why = strides_reason(given); !why.empty()) return fail(FA_ERR_INVALID_ARGUMENT, why);
        params.strides = &given;
      }
    }
    FA_RETURN_IF_FAILED(require_pointers(tensors, kTensorAlignment));
    FA_RETURN_IF_FAILED(require_pointers(elements, kElementAlignment));
    std::size_t needed = 0;
    if constexpr (std::is_same_v<CShape, fa_shape>) {
      const FeatureInput in = to_features(features, s);
      if (in.extras.bias) FA_RETURN_IF_FAILED(require_aligned("bias", in.extras.bias, kElementAlignment));
      if (in.extras.alibi_slopes)
        FA_RETURN_IF_FAILED(require_aligned("alibi_slopes", in.extras.alibi_slopes, kElementAlignment));
      if (in.features.varlen()) {
        FA_RETURN_IF_FAILED(require_aligned("cu_seqlens_q", in.extras.cu_seqlens_q, kElementAlignment));
        FA_RETURN_IF_FAILED(require_aligned("cu_seqlens_k", in.extras.cu_seqlens_k, kElementAlignment));
      }
      FA_RETURN_IF_FAILED(require_gpu());
      FA_RETURN_IF_FAILED(check_entry(*kernel, s, &needed, in.features));
      params.features = in.features;
      params.extras = in.extras;
    } else {
      FA_RETURN_IF_FAILED(require_gpu());
      FA_RETURN_IF_FAILED(check_entry(*kernel, s, &needed));
    }
    FA_RETURN_IF_FAILED(require_workspace(workspace, workspace_bytes, needed));
    params.shape = s;
    params.workspace = workspace;
    params.stream = static_cast<cudaStream_t>(stream);
    kernel->launch(params);
    CUDA_CHECK_LAUNCH();
    return ok();
  });
}

/// A forward or backward launch by name: the C API's entry points, with or without strides.
fa_status forward_by_name(const char* name, const fa_shape* shape, const fa_features* features,
                          const fa_strides* strides, const void* q, const void* k, const void* v, void* o, float* lse,
                          void* workspace, std::size_t workspace_bytes, void* stream) {
  ForwardParams p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = o;
  p.lse = lse;
  return launch_by_name(forward_kernels(), FA_KIND_FORWARD, name, shape, {{"q", q}, {"k", k}, {"v", v}, {"o", o}},
                        {{"lse", lse}}, workspace, workspace_bytes, stream, p, features, strides);
}

fa_status backward_by_name(const char* name, const fa_shape* shape, const fa_features* features,
                           const fa_strides* strides, const void* q, const void* k, const void* v, const void* o,
                           const void* d_o, const float* lse, void* dq, void* dk, void* dv, void* workspace,
                           std::size_t workspace_bytes, void* stream) {
  BackwardParams p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = o;
  p.d_o = d_o;
  p.lse = lse;
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  return launch_by_name(backward_kernels(), FA_KIND_BACKWARD, name, shape,
                        {{"q", q}, {"k", k}, {"v", v}, {"o", o}, {"d_o", d_o}, {"dq", dq}, {"dk", dk}, {"dv", dv}},
                        {{"lse", lse}}, workspace, workspace_bytes, stream, p, features, strides);
}

}  // namespace

}  // namespace fa

using namespace fa;

extern "C" {

int fa_api_version(void) { return FA_API_VERSION; }

const char* fa_last_error(void) { return last_error.c_str(); }

int fa_kernel_count(fa_kind kind) {
  switch (kind) {
    case FA_KIND_FORWARD: return int(forward_kernels().size());
    case FA_KIND_BACKWARD: return int(backward_kernels().size());
    case FA_KIND_DECODE: return int(decode_kernels().size());
  }
  return 0;
}

fa_status fa_kernel_at(fa_kind kind, int index, fa_kernel_info* info) {
  return guarded([&] {
    if (info == nullptr) return fail(FA_ERR_INVALID_ARGUMENT, "info is a null pointer");
    const int count = fa_kernel_count(kind);
    if (kind != FA_KIND_FORWARD && kind != FA_KIND_BACKWARD && kind != FA_KIND_DECODE)
      return fail(FA_ERR_INVALID_ARGUMENT,
                  "kind must be 0 (forward), 1 (backward) or 2 (decode), got " + std::to_string(int(kind)));
    if (index < 0 || index >= count) {
      return fail(FA_ERR_INVALID_ARGUMENT, std::string("index must be between 0 and ") + std::to_string(count - 1) +
                                               " for " + kind_name(kind) + " kernels, got " + std::to_string(index));
    }
    switch (kind) {
      case FA_KIND_FORWARD: fill(forward_kernels()[index], info); break;
      case FA_KIND_BACKWARD: fill(backward_kernels()[index], info); break;
      case FA_KIND_DECODE: fill(decode_kernels()[index], info); break;
    }
    return ok();
  });
}

fa_status fa_kernel_find(fa_kind kind, const char* name, fa_kernel_info* info) {
  return guarded([&] {
    if (info == nullptr) return fail(FA_ERR_INVALID_ARGUMENT, "info is a null pointer");
    switch (kind) {
      case FA_KIND_FORWARD: {
        const ForwardKernel* k = nullptr;
        FA_RETURN_IF_FAILED(lookup(forward_kernels(), kind, name, &k));
        fill(*k, info);
        return ok();
      }
      case FA_KIND_BACKWARD: {
        const BackwardKernel* k = nullptr;
        FA_RETURN_IF_FAILED(lookup(backward_kernels(), kind, name, &k));
        fill(*k, info);
        return ok();
      }
      case FA_KIND_DECODE: {
        const DecodeKernel* k = nullptr;
        FA_RETURN_IF_FAILED(lookup(decode_kernels(), kind, name, &k));
        fill(*k, info);
        return ok();
      }
    }
    return fail(FA_ERR_INVALID_ARGUMENT,
                "kind must be 0 (forward), 1 (backward) or 2 (decode), got " + std::to_string(int(kind)));
  });
}

fa_status fa_forward_check(const char* name, const fa_shape* shape, size_t* workspace_bytes) {
  return check_by_name(forward_kernels(), FA_KIND_FORWARD, name, shape, workspace_bytes);
}

fa_status fa_backward_check(const char* name, const fa_shape* shape, size_t* workspace_bytes) {
  return check_by_name(backward_kernels(), FA_KIND_BACKWARD, name, shape, workspace_bytes);
}

fa_status fa_decode_check(const char* name, const fa_decode_shape* shape, size_t* workspace_bytes) {
  return check_by_name(decode_kernels(), FA_KIND_DECODE, name, shape, workspace_bytes);
}

fa_features fa_features_none(void) {
  fa_features f{};
  f.window_left = f.window_right = -1;
  return f;
}

fa_status fa_forward_check_features(const char* name, const fa_shape* shape, const fa_features* features,
                                    size_t* workspace_bytes) {
  return check_features_by_name(forward_kernels(), FA_KIND_FORWARD, name, shape, features, workspace_bytes);
}

fa_status fa_backward_check_features(const char* name, const fa_shape* shape, const fa_features* features,
                                     size_t* workspace_bytes) {
  return check_features_by_name(backward_kernels(), FA_KIND_BACKWARD, name, shape, features, workspace_bytes);
}

fa_status fa_forward_strided(const char* name, const fa_shape* shape, const fa_features* features,
                             const fa_strides* strides, const void* q, const void* k, const void* v, void* o,
                             float* lse, void* workspace, size_t workspace_bytes, void* stream) {
  if (strides == nullptr) return fail(FA_ERR_INVALID_ARGUMENT, "strides is a null pointer");
  return forward_by_name(name, shape, features, strides, q, k, v, o, lse, workspace, workspace_bytes, stream);
}

fa_status fa_backward_strided(const char* name, const fa_shape* shape, const fa_features* features,
                              const fa_strides* strides, const void* q, const void* k, const void* v, const void* o,
                              const void* d_o, const float* lse, void* dq, void* dk, void* dv, void* workspace,
                              size_t workspace_bytes, void* stream) {
  if (strides == nullptr) return fail(FA_ERR_INVALID_ARGUMENT, "strides is a null pointer");
  return backward_by_name(name, shape, features, strides, q, k, v, o, d_o, lse, dq, dk, dv, workspace, workspace_bytes,
                          stream);
}

fa_status fa_forward_features(const char* name, const fa_shape* shape, const fa_features* features, const void* q,
                              const void* k, const void* v, void* o, float* lse, void* workspace,
                              size_t workspace_bytes, void* stream) {
  return forward_by_name(name, shape, features, nullptr, q, k, v, o, lse, workspace, workspace_bytes, stream);
}

fa_status fa_backward_features(const char* name, const fa_shape* shape, const fa_features* features, const void* q,
                               const void* k, const void* v, const void* o, const void* d_o, const float* lse, void* dq,
                               void* dk, void* dv, void* workspace, size_t workspace_bytes, void* stream) {
  return backward_by_name(name, shape, features, nullptr, q, k, v, o, d_o, lse, dq, dk, dv, workspace, workspace_bytes,
                          stream);
}

fa_status fa_forward(const char* name, const fa_shape* shape, const void* q, const void* k, const void* v, void* o,
                     float* lse, void* workspace, size_t workspace_bytes, void* stream) {
  return fa_forward_features(name, shape, nullptr, q, k, v, o, lse, workspace, workspace_bytes, stream);
}

fa_status fa_backward(const char* name, const fa_shape* shape, const void* q, const void* k, const void* v,
                      const void* o, const void* d_o, const float* lse, void* dq, void* dk, void* dv, void* workspace,
                      size_t workspace_bytes, void* stream) {
  return fa_backward_features(name, shape, nullptr, q, k, v, o, d_o, lse, dq, dk, dv, workspace, workspace_bytes,
                              stream);
}

fa_status fa_decode(const char* name, const fa_decode_shape* shape, const void* q, const void* k_cache,
                    const void* v_cache, const int* block_tables, const int* context_lens, void* o, float* lse,
                    void* workspace, size_t workspace_bytes, void* stream) {
  DecodeParams p;
  p.q = q;
  p.k_cache = k_cache;
  p.v_cache = v_cache;
  p.block_tables = block_tables;
  p.context_lens = context_lens;
  p.o = o;
  p.lse = lse;
  return launch_by_name(decode_kernels(), FA_KIND_DECODE, name, shape,
                        {{"q", q}, {"k_cache", k_cache}, {"v_cache", v_cache}, {"o", o}},
                        {{"block_tables", block_tables}, {"context_lens", context_lens}, {"lse", lse}}, workspace,
                        workspace_bytes, stream, p);
}

}  // extern "C"
