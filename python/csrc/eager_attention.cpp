// libfa_torch.so: attention()'s eager path as a PyTorch operator written in C++.
//
// A call from Python through a Python autograd.Function costs CPU time at both ends: the forward's
// allocations and ctypes call, and, worse, a backward that the autograd engine's thread can only
// run after taking the interpreter's lock. At a training shape (32 x 8 x 256 x 64) a kernel runs
// for a few microseconds, so that CPU time is the call's time. Here the same launches run from
// C++, with autograd registered in C++:
//
//   torch.ops.attention_kernels.eager_plan(...) -> int
//       once per signature of the arguments, after _torch.py's checks: the two kernels' names,
//       the shape and the workspace sizes, kept in a table; the id is the plan's row;
//   torch.ops.attention_kernels.eager_attention(q, k, v, plan) -> (o, lse)
//       every call: allocates O, LSE and the workspace, launches the forward on the current
//       stream; its backward, eager_attention_backward (dQ, dK, dV), launches the plan's
//       backward kernel, all in C++.
//
// Nothing is checked here that the plan's checks did not already check, apart from what each
// call may change: strides (a strided kernel reads a tensor in place when c_api.h's rules allow
// it; anything else, and every tensor of a packed-only kernel, is copied with .contiguous()),
// and the C library's own checks of pointers, which every launch runs.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <array>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "c_api.h"

namespace {

using at::Tensor;

/// What one signature's checks found: the kernels, the shape, the workspace each needs.
struct Plan {
  std::string forward, backward;
  fa_shape shape;
  bool forward_strided, backward_strided;
  std::size_t forward_bytes, backward_bytes;
};

std::mutex plans_mutex;
std::deque<Plan> plans;  // a deque: a row never moves once added

// Error messages are built as one std::string (std::to_string, +): TORCH_CHECK then passes it
// through as it is, with no std::ostringstream in this library.
const Plan& plan_at(std::int64_t id) {
  const Plan* found = nullptr;
  std::int64_t count = 0;
  {
    std::lock_guard<std::mutex> lock(plans_mutex);
    count = std::int64_t(plans.size());
    if (id >= 0 && id < count) found = &plans[std::size_t(id)];
  }
  TORCH_CHECK(found != nullptr, "eager_attention: plan " + std::to_string(id) + " does not exist (" +
                                    std::to_string(count) + " plans made)");
  return *found;
}

std::int64_t eager_plan(std::string forward, std::string backward, std::vector<std::int64_t> shape, double scale,
                        bool forward_strided, bool backward_strided, std::int64_t forward_bytes,
                        std::int64_t backward_bytes) {
  TORCH_CHECK(shape.size() == 7,
              "eager_plan: shape has 7 fields (batch, heads_q, heads_kv, seq_q, seq_kv, "
              "head_dim, causal), got " +
                  std::to_string(shape.size()));
  Plan p{std::move(forward),
         std::move(backward),
         fa_shape{int(shape[0]), int(shape[1]), int(shape[2]), int(shape[3]), int(shape[4]), int(shape[5]),
                  int(shape[6]), scale},
         forward_strided,
         backward_strided,
         std::size_t(forward_bytes),
         std::size_t(backward_bytes)};
  std::lock_guard<std::mutex> lock(plans_mutex);
  plans.push_back(std::move(p));
  return std::int64_t(plans.size()) - 1;
}

/// A failed launch as a Python exception: ValueError for arguments the kernel does not take
/// (the plan's checks make that rare), RuntimeError for the rest.
void check(fa_status status) {
  if (status == FA_OK) return;
  TORCH_CHECK_VALUE(status != FA_ERR_INVALID_ARGUMENT && status != FA_ERR_UNSUPPORTED, fa_last_error());
  TORCH_CHECK(false, fa_last_error());
}

/// c_api.h's fa_strides of a [batch, heads, rows, head_dim] tensor a strided kernel can take as
/// it is, or nothing: head_dim contiguous, 16-byte aligned, the other strides positive multiples
/// of 8 elements. A dimension of size 1 is never stepped over, so its stride is replaced by 8.
/// (_torch.py's _strides says the same in Python.)
std::optional<fa_strides> strides_of(const Tensor& t) {
  if (t.stride(3) != 1 || t.storage_offset() % 8 != 0) return std::nullopt;
  std::array<std::int64_t, 3> s{};
  for (int dim = 0; dim < 3; ++dim) {
    s[dim] = t.size(dim) > 1 ? t.stride(dim) : 8;
    if (s[dim] <= 0 || s[dim] % 8 != 0) return std::nullopt;
  }
  return fa_strides{s[0], s[1], s[2]};
}

/// An empty tensor shaped like [batch, heads, seq, head_dim] `t`, laid out [batch, seq, heads,
/// head_dim] underneath when `t` is (so the caller's .transpose(1, 2) back is free).
Tensor new_like(const Tensor& t, bool strided) {
  const bool seq_major = t.size(1) > 1 && t.size(2) > 1 && t.stride(2) > t.stride(1);
  if (strided && seq_major) {
    return at::empty({t.size(0), t.size(2), t.size(1), t.size(3)}, t.options()).transpose(1, 2);
  }
  return at::empty(t.sizes(), t.options());
}

/// How one launch takes its tensors. A strided kernel reads the inputs in place when every one
/// of them has strides_of, and then writes outputs laid out like them (`strides`: the inputs',
/// then the outputs', in c_api.h's order). Otherwise, and always for a packed-only kernel, the
/// inputs are copied to packed tensors and the outputs are packed (`strides` empty).
struct Launch {
  std::vector<Tensor> inputs;
  std::vector<fa_strides> strides;
  bool in_place() const { return !strides.empty(); }
};

Launch plan_launch(std::vector<Tensor> inputs, bool strided) {
  Launch launch{std::move(inputs), {}};
  bool packed = true;
  for (const Tensor& t : launch.inputs) packed = packed && t.is_contiguous();
  if (packed) return launch;  // the packed launch reads them as they are
  // head_dim a multiple of 8: then the outputs' strides (multiples of head_dim) are too.
  if (strided && launch.inputs[0].size(3) % 8 == 0) {
    for (const Tensor& t : launch.inputs) {
      const auto s = strides_of(t);
      if (!s) break;
      launch.strides.push_back(*s);
    }
    if (launch.strides.size() == launch.inputs.size()) return launch;
    launch.strides.clear();
  }
  for (Tensor& t : launch.inputs) t = t.contiguous();
  return launch;
}

/// An output like `t` for `launch`: laid out like the input when the launch reads in place
/// (its strides appended), packed otherwise.
Tensor output_like(const Tensor& t, Launch& launch) {
  Tensor out = new_like(t, launch.in_place());
  if (launch.in_place()) launch.strides.push_back(*strides_of(out));  // head_dim % 8 == 0: it has them
  return out;
}

void* workspace_for(std::size_t bytes, const Tensor& like, Tensor& holder) {
  if (bytes == 0) return nullptr;
  holder = at::empty({std::int64_t(bytes)}, like.options().dtype(at::kByte));
  return holder.data_ptr();
}

/// The forward launch of a plan: (O, LSE).
std::tuple<Tensor, Tensor> forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t id) {
  const Plan& p = plan_at(id);
  const c10::cuda::CUDAGuard guard(q.device());
  Launch in = plan_launch({q, k, v}, p.forward_strided);
  Tensor o = output_like(q, in);
  Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  Tensor work;
  void* workspace = workspace_for(p.forward_bytes, q, work);
  void* stream = at::cuda::getCurrentCUDAStream(q.device().index()).stream();
  const auto& t = in.inputs;
  if (!in.in_place()) {
    check(fa_forward(p.forward.c_str(), &p.shape, t[0].data_ptr(), t[1].data_ptr(), t[2].data_ptr(), o.data_ptr(),
                     lse.data_ptr<float>(), workspace, p.forward_bytes, stream));
  } else {
    check(fa_forward_strided(p.forward.c_str(), &p.shape, nullptr, in.strides.data(), t[0].data_ptr(), t[1].data_ptr(),
                             t[2].data_ptr(), o.data_ptr(), lse.data_ptr<float>(), workspace, p.forward_bytes, stream));
  }
  return {o, lse};
}

/// The backward launch of a plan: (dQ, dK, dV), each laid out like its input when the kernel
/// reads the inputs in place.
std::tuple<Tensor, Tensor, Tensor> backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                                 const Tensor& lse, const Tensor& d_o, std::int64_t id) {
  const Plan& p = plan_at(id);
  const c10::cuda::CUDAGuard guard(q.device());
  Launch in = plan_launch({q, k, v, o, d_o}, p.backward_strided);
  Tensor dq = output_like(q, in);
  Tensor dk = output_like(k, in);
  Tensor dv = output_like(v, in);
  Tensor work;
  void* workspace = workspace_for(p.backward_bytes, q, work);
  void* stream = at::cuda::getCurrentCUDAStream(q.device().index()).stream();
  const auto& t = in.inputs;
  if (!in.in_place()) {
    check(fa_backward(p.backward.c_str(), &p.shape, t[0].data_ptr(), t[1].data_ptr(), t[2].data_ptr(), t[3].data_ptr(),
                      t[4].data_ptr(), lse.data_ptr<float>(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), workspace,
                      p.backward_bytes, stream));
  } else {
    check(fa_backward_strided(p.backward.c_str(), &p.shape, nullptr, in.strides.data(), t[0].data_ptr(),
                              t[1].data_ptr(), t[2].data_ptr(), t[3].data_ptr(), t[4].data_ptr(), lse.data_ptr<float>(),
                              dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), workspace, p.backward_bytes, stream));
  }
  return {dq, dk, dv};
}

/// The operator below autograd: the CUDA kernel for CUDA tensors, a fake or meta implementation
/// under tracing.
std::tuple<Tensor, Tensor> below_autograd(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t id) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("attention_kernels::eager_attention", "")
          .typed<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, std::int64_t)>();
  const at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(q, k, v, id);
}

/// Autograd in C++: the backward runs on the autograd engine's thread without Python.
class EagerAttention : public torch::autograd::Function<EagerAttention> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const Tensor& q, const Tensor& k,
                                                const Tensor& v, std::int64_t id) {
    auto [o, lse] = below_autograd(q, k, v, id);
    ctx->save_for_backward({q, k, v, o, lse});
    ctx->saved_data["plan"] = id;
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);
    return {o, lse};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const Tensor& d_o = grads[0];
    if (!d_o.defined()) return {Tensor(), Tensor(), Tensor(), Tensor()};
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("attention_kernels::eager_attention_backward", "")
            .typed<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                      const Tensor&, const Tensor&, std::int64_t)>();
    const auto saved = ctx->get_saved_variables();
    auto [dq, dk, dv] = op.call(saved[0], saved[1], saved[2], saved[3], saved[4], d_o, ctx->saved_data["plan"].toInt());
    return {dq, dk, dv, Tensor()};
  }
};

std::tuple<Tensor, Tensor> eager_attention_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                                                    std::int64_t id) {
  if (!torch::autograd::GradMode::is_enabled() || !(q.requires_grad() || k.requires_grad() || v.requires_grad())) {
    return below_autograd(q, k, v, id);  // no graph to record
  }
  const auto out = EagerAttention::apply(q, k, v, id);
  return {out[0], out[1]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attention_kernels, m) {
  m.def(
      "eager_plan(str forward, str backward, int[] shape, float scale, bool forward_strided, "
      "bool backward_strided, int forward_bytes, int backward_bytes) -> int",
      &eager_plan);
  m.def("eager_attention(Tensor q, Tensor k, Tensor v, int plan) -> (Tensor, Tensor)");
  m.def(
      "eager_attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor d_o, int plan) "
      "-> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attention_kernels, CUDA, m) {
  m.impl("eager_attention", &forward_cuda);
  m.impl("eager_attention_backward", &backward_cuda);
}

TORCH_LIBRARY_IMPL(attention_kernels, Autograd, m) { m.impl("eager_attention", &eager_attention_autograd); }
