#include "tensor.h"

#include <algorithm>
#include <thread>

#include "random.h"

namespace fa {

void fill_random_normal(std::vector<float>& out, uint64_t seed, uint64_t stream) {
  const std::size_t n = out.size();
  unsigned workers = std::max(1u, std::min(std::thread::hardware_concurrency(), 32u));
  if (n < (1u << 16)) workers = 1;
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < workers; ++w) {
    std::size_t begin = n * w / workers, end = n * (w + 1) / workers;
    threads.emplace_back([&out, seed, stream, begin, end] {
      for (std::size_t i = begin; i < end; ++i) out[i] = random_normal(seed, stream, i);
    });
  }
  for (auto& t : threads) t.join();
}

HostInputs make_random_inputs(const AttentionShape& shape, uint64_t seed) {
  HostInputs in;
  in.q.resize(shape.q_elems());
  in.k.resize(shape.kv_elems());
  in.v.resize(shape.kv_elems());
  fill_random_normal(in.q, seed, 1);
  fill_random_normal(in.k, seed, 2);
  fill_random_normal(in.v, seed, 3);
  return in;
}

HostInputs round_inputs(const HostInputs& inputs, DType dtype) {
  HostInputs out = inputs;
  if (dtype == DType::F32) return out;
  for (auto* t : {&out.q, &out.k, &out.v}) {
    for (float& x : *t) x = round_to_dtype(x, dtype);
  }
  return out;
}

DeviceBuffer upload_as(DType dtype, const std::vector<float>& values) {
  std::vector<unsigned char> raw(values.size() * dtype_size(dtype));
  encode_elements(dtype, values.data(), raw.data(), values.size());
  DeviceBuffer buffer(raw.size());
  buffer.upload(raw.data(), raw.size());
  return buffer;
}

}  // namespace fa
