#include "tensor.h"

#include "parallel.h"
#include "random.h"

namespace fa {

void fill_random_normal(std::vector<float>& out, uint64_t seed, uint64_t stream) {
  parallel_for(out.size(), [&out, seed, stream](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) out[i] = random_normal(seed, stream, i);
  });
}

void round_all(std::vector<float>& values, DType dtype) {
  if (dtype == DType::F32) return;
  parallel_for(values.size(), [&values, dtype](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) values[i] = round_to_dtype(values[i], dtype);
  });
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
  for (auto* t : {&out.q, &out.k, &out.v}) round_all(*t, dtype);
  return out;
}

void encode_in_parallel(DType dtype, const float* src, void* dst, std::size_t n) {
  auto* bytes = static_cast<unsigned char*>(dst);
  const std::size_t size = dtype_size(dtype);
  parallel_for(n, [=](std::size_t begin, std::size_t end) {
    encode_elements(dtype, src + begin, bytes + begin * size, end - begin);
  });
}

void decode_in_parallel(DType dtype, const void* src, float* dst, std::size_t n) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  const std::size_t size = dtype_size(dtype);
  parallel_for(n, [=](std::size_t begin, std::size_t end) {
    decode_elements(dtype, bytes + begin * size, dst + begin, end - begin);
  });
}

std::size_t count_poison(DType dtype, const void* base, std::size_t begin, std::size_t end) {
  std::atomic<std::size_t> total{0};
  parallel_for(end > begin ? end - begin : 0, [&](std::size_t from, std::size_t to) {
    std::size_t count = 0;
    for (std::size_t i = begin + from; i < begin + to; ++i) count += is_poison(dtype, base, i);
    total += count;
  });
  return total;
}

DeviceBuffer upload_as(DType dtype, const std::vector<float>& values) {
  std::vector<unsigned char> raw(values.size() * dtype_size(dtype));
  encode_in_parallel(dtype, values.data(), raw.data(), values.size());
  DeviceBuffer buffer(raw.size());
  buffer.upload(raw.data(), raw.size());
  return buffer;
}

}  // namespace fa
