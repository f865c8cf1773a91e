// What prompt_attention.cpp's driver asks of its tile kernels (AVX-512 float32 and bfloat16):
// the layouts and block sizes they share, and a table of their entry points.
#pragma once

#include <cstdint>

namespace snapstream::prompt {

constexpr int kRows = 6;              // query rows per tile step
constexpr int64_t kPanel = 64;        // keys per packed K^T panel
constexpr int64_t kKeyBlock = 256;    // keys per softmax step
constexpr int64_t kPositions = 32;    // query positions per work item

// One tile step: ROWS query rows (q, D each) against keys [key0, key0 + n) of a KV head's packed
// K^T panels and V rows, row r seeing keys first[r]..last[r] (indices); s (ROWS, kKeyBlock)
// scores and p (ROWS, kKeyBlock) probabilities are scratch; o (ROWS, D) the rows' unnormalized
// outputs, m and l their running max (scaled) and sum, all updated. scale = log2(e) / sqrt(D).
template <typename E>
using TileStep = void (*)(const E* q, const E* kt_panels, const E* v, int64_t key0, int64_t n,
                          int64_t dim, float scale, const int64_t* first, const int64_t* last,
                          float* s, E* p, float* o, float* m, float* l);

// dst[:D] = o[:D] * inv in the output's element type (D a multiple of 64).
template <typename E>
using StoreRow = void (*)(E* dst, const float* o, float inv, int64_t dim);

template <typename E>
struct TileKernels {
  TileStep<E> steps[kRows];  // by rows - 1
  StoreRow<E> store_row;
};

}  // namespace snapstream::prompt
