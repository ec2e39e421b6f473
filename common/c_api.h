/* The tutorial's kernels behind a small C interface, for callers outside C++: Python's ctypes
 * (python/attention_kernels), Julia, Rust, another framework. libfa_kernels.so holds every
 * registered forward, backward and decode kernel; nothing in it depends on a framework.
 *
 * Pointers are device memory in the layouts of problem.h (Q, K, V, O [batch, heads, seq,
 * head_dim], dense; LSE float [batch, heads_q, seq_q]; decode: paged K/V caches and an int block
 * table, problem.h's DecodeShape). Tensors and the workspace start on a 16-byte boundary, LSE and
 * the int arrays on a 4-byte one (cudaMalloc and PyTorch's allocator give 256); anything else is
 * refused with FA_ERR_INVALID_ARGUMENT before the GPU is touched. A launch is queued on the given
 * stream and returns at once, like a kernel launch: an error inside the kernel shows at the
 * caller's next synchronizing call.
 * Scratch memory (fa_*_workspace_bytes) is the caller's, so it comes from the caller's allocator
 * and follows its stream order.
 *
 * Every function returns an fa_status. On anything but FA_OK, fa_last_error() returns one line
 * saying what was wrong, naming the value and what is allowed; the library never exits the
 * process. fa_last_error's text belongs to the calling thread and lasts until its next call. */
#ifndef FA_C_API_H
#define FA_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Raised whenever a struct below or a function's meaning changes. */
#define FA_API_VERSION 3

typedef enum fa_status {
  FA_OK = 0,
  FA_ERR_UNKNOWN_KERNEL = 1,   /* no kernel of that kind has that name */
  FA_ERR_INVALID_ARGUMENT = 2, /* a shape field out of range, a null or misaligned pointer, a bad index or kind */
  FA_ERR_UNSUPPORTED = 3,      /* a valid shape this kernel does not handle (head_dim, the GPU) */
  FA_ERR_NO_GPU = 4,           /* no usable CUDA device */
  FA_ERR_CUDA = 5,             /* a CUDA call failed during the launch */
  FA_ERR_INTERNAL = 6          /* anything else thrown by a launcher */
} fa_status;

typedef enum fa_kind { FA_KIND_FORWARD = 0, FA_KIND_BACKWARD = 1, FA_KIND_DECODE = 2 } fa_kind;

/** Element types of Q, K, V, O (and the caches): as in dtype.h. */
typedef enum fa_dtype { FA_DTYPE_F32 = 0, FA_DTYPE_F16 = 1, FA_DTYPE_BF16 = 2 } fa_dtype;

/** problem.h's AttentionShape. causal: 0 or 1 (bottom-right aligned); scale 0 = 1/sqrt(head_dim). */
typedef struct fa_shape {
  int batch, heads_q, heads_kv, seq_q, seq_kv, head_dim;
  int causal;
  double scale;
} fa_shape;

/** problem.h's DecodeShape: max_context is the longest context_lens entry (kernels plan their
 * split from it). The softmax scale of decode is 1/sqrt(head_dim). */
typedef struct fa_decode_shape {
  int num_seqs, heads_q, heads_kv, head_dim, query_len, block_size, num_blocks, max_blocks_per_seq, max_context;
} fa_decode_shape;

/** One registered kernel. The strings live as long as the library is loaded. */
typedef struct fa_kernel_info {
  const char* name;    /* "ch06_pingpong_bf16" */
  const char* variant; /* the chapter program's --variant */
  const char* summary; /* what this variant changes, one line */
  int chapter;
  int number;        /* variant number inside the chapter */
  fa_dtype dtype;    /* of Q, K, V, O (and dO, dQ, dK, dV; the caches) */
  int deterministic; /* backward: bitwise-identical gradients from run to run */
  /** The head_dim values from 1 to 256 it accepts, e.g. "64,128" or "1-128" ("" when none). */
  const char* head_dims;
  /** "" when this machine can run it; otherwise why not ("needs an sm_90 GPU ...", "no GPU: ..."). */
  const char* unavailable;
  /** Forward and decode: the tolerance the C++ tests hold O and LSE to against the fp64 oracle
   * (compare.h: relative Frobenius error, largest absolute error, largest LSE error); zero for
   * backward kernels. */
  double tolerance_rel_fro, tolerance_max_abs, tolerance_lse_abs;
  /** 1 when the arithmetic inside is coarser than the dtype (chapter 06's FP8 kernels: e4m3 inside,
   * bf16 in and out), so its tolerance is its own rather than the dtype's. */
  int coarse_arithmetic;
  /** 1 when it takes tensors that are not packed (fa_forward_strided / fa_backward_strided). */
  int strided;
} fa_kernel_info;

int fa_api_version(void);
/** The calling thread's last error, or "" after a success. Never null. */
const char* fa_last_error(void);

/** How many kernels of a kind are registered; their order is chapter, variant number, name. */
int fa_kernel_count(fa_kind kind);
fa_status fa_kernel_at(fa_kind kind, int index, fa_kernel_info* info);
fa_status fa_kernel_find(fa_kind kind, const char* name, fa_kernel_info* info);

/** FA_OK when the kernel takes this shape on this machine; otherwise FA_ERR_INVALID_ARGUMENT or
 * FA_ERR_UNSUPPORTED with the reason in fa_last_error(). bytes: scratch the launch needs. */
fa_status fa_forward_check(const char* name, const fa_shape* shape, size_t* workspace_bytes);
fa_status fa_backward_check(const char* name, const fa_shape* shape, size_t* workspace_bytes);
fa_status fa_decode_check(const char* name, const fa_decode_shape* shape, size_t* workspace_bytes);

/** O = softmax(scale Q K^T + mask) V and LSE (natural log), as problem.h says. */
fa_status fa_forward(const char* name, const fa_shape* shape, const void* q, const void* k, const void* v, void* o,
                     float* lse, void* workspace, size_t workspace_bytes, void* stream);

/** dQ, dK, dV from Q, K, V, the forward's O and LSE, and dO. Every element of dq/dk/dv is
 * written (the kernel zeroes what it accumulates into). */
fa_status fa_backward(const char* name, const fa_shape* shape, const void* q, const void* k, const void* v,
                      const void* o, const void* d_o, const float* lse, void* dq, void* dk, void* dv, void* workspace,
                      size_t workspace_bytes, void* stream);

/** Chapter 09's features (attention_features.h), beside the shape; only the kernels that take
 * them (chapter 09's) accept a problem with any on, the others answer FA_ERR_UNSUPPORTED naming
 * the feature. fa_features_none() gives every feature off.
 *   window_left, window_right: keys left / right of the (bottom-right aligned) diagonal a query
 *     sees, -1 for no limit;
 *   softcap: scores x become softcap * tanh(x / softcap), 0 for off;
 *   alibi: 1 adds -slope(h) * |i + seq_kv - seq_q - j|, with attention_features.h's slopes or the
 *     caller's (alibi_slopes below);
 *   bias: device float [batch, heads_q, seq_q, seq_kv] added to the scaled scores, or null;
 *   sequences: a packed batch of this many sequences along the seq axis of a shape whose batch
 *     is 1 (0: dense); cu_seqlens_q / cu_seqlens_k: device int [sequences + 1], from 0 to seq_q
 *     (seq_kv); max_seqlen_q / max_seqlen_k: the longest sequence of each. */
typedef struct fa_features {
  int window_left, window_right;
  double softcap;
  int alibi;
  const float* bias;
  int sequences;
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int max_seqlen_q, max_seqlen_k;
  const float* alibi_slopes;     /* with alibi 1: device float [heads_q], or [sequences or batch, heads_q] with
                                    alibi_slopes_per_sequence 1; null: the ALiBi paper's slopes */
  int alibi_slopes_per_sequence; /* 0 or 1 */
} fa_features;
fa_features fa_features_none(void);
/** fa_forward_check / fa_forward / fa_backward_check / fa_backward with features (null: none). */
fa_status fa_forward_check_features(const char* name, const fa_shape* shape, const fa_features* features,
                                    size_t* workspace_bytes);
fa_status fa_forward_features(const char* name, const fa_shape* shape, const fa_features* features, const void* q,
                              const void* k, const void* v, void* o, float* lse, void* workspace,
                              size_t workspace_bytes, void* stream);
fa_status fa_backward_check_features(const char* name, const fa_shape* shape, const fa_features* features,
                                     size_t* workspace_bytes);
fa_status fa_backward_features(const char* name, const fa_shape* shape, const fa_features* features, const void* q,
                               const void* k, const void* v, const void* o, const void* d_o, const float* lse, void* dq,
                               void* dk, void* dv, void* workspace, size_t workspace_bytes, void* stream);
/** A [batch, heads, rows, head_dim] tensor that is not packed (strides.h): head_dim is
 * contiguous and row r of head h of batch b starts at element b * batch + h * head + r * row.
 * (batch, seq, heads, head_dim) tensors, flash-attn's layout, and the Q, K, V views of one
 * [batch, seq, 3, heads, head_dim] projection are such tensors. */
typedef struct fa_strides {
  int64_t batch, head, row;
} fa_strides;
/** fa_forward_features / fa_backward_features with strides: an array of 4 fa_strides (q, k, v,
 * o) for the forward, of 8 (q, k, v, o, d_o, dq, dk, dv) for the backward; lse stays packed
 * [batch, heads_q, seq_q]. Only a kernel whose fa_kernel_info has strided = 1 takes them (the
 * others answer FA_ERR_UNSUPPORTED); every stride must be a non-negative multiple of 8. */
fa_status fa_forward_strided(const char* name, const fa_shape* shape, const fa_features* features,
                             const fa_strides* strides, const void* q, const void* k, const void* v, void* o,
                             float* lse, void* workspace, size_t workspace_bytes, void* stream);
fa_status fa_backward_strided(const char* name, const fa_shape* shape, const fa_features* features,
                              const fa_strides* strides, const void* q, const void* k, const void* v, const void* o,
                              const void* d_o, const float* lse, void* dq, void* dk, void* dv, void* workspace,
                              size_t workspace_bytes, void* stream);
/** Attention of query_len new tokens per sequence over a paged K/V cache (chapter 08).
 * block_tables int [num_seqs, max_blocks_per_seq], context_lens int [num_seqs], device memory. */
fa_status fa_decode(const char* name, const fa_decode_shape* shape, const void* q, const void* k_cache,
                    const void* v_cache, const int* block_tables, const int* context_lens, void* o, float* lse,
                    void* workspace, size_t workspace_bytes, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* FA_C_API_H */
