// RMSNorm (with the residual add before it) and rotary embedding, fused for bfloat16 on the CPU.
//
// In torch each is several passes over the activations (RMSNorm alone is an add, a cast, a square,
// a mean, an rsqrt, two multiplies and a cast back; rotary a negation, a concatenation, two
// multiplies and an add), each its own dispatch and trip through memory. Here each is one pass per
// row in float32. Rows are split over the OpenMP threads torch already runs. (SiLU-and-multiply was
// tried too and measured slower than torch's own kernels, so it stays in torch.)
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

inline float widen(uint16_t value) {
    const uint32_t bits = static_cast<uint32_t>(value) << 16;
    float out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
}

inline uint16_t narrow(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // NaN stays NaN
    bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
    return static_cast<uint16_t>(bits >> 16);
}

// Below this many elements one thread is faster than waking the others.
constexpr long PARALLEL_MIN = 1 << 15;

}  // namespace

extern "C" {

// With a residual: residual += x (the layer's skip connection, kept in bfloat16 as torch keeps
// it), then out = weight * norm(residual). Without: out = weight * norm(x).
void sluice_rms_norm_bf16(const uint16_t* x, uint16_t* residual, const uint16_t* weight, uint16_t* out, long rows,
                          int hidden, float eps) {
#pragma omp parallel for if (rows * hidden >= PARALLEL_MIN)
    for (long r = 0; r < rows; ++r) {
        const uint16_t* src = x + r * hidden;
        uint16_t* dst = out + r * hidden;
        float row[16384];  // MAX_HIDDEN in fused_cpu.py
        float squares = 0.f;
        if (residual != nullptr) {
            uint16_t* skip = residual + r * hidden;
#pragma omp simd reduction(+ : squares)
            for (int i = 0; i < hidden; ++i) {
                const uint16_t sum = narrow(widen(src[i]) + widen(skip[i]));
                skip[i] = sum;
                row[i] = widen(sum);
                squares += row[i] * row[i];
            }
        } else {
#pragma omp simd reduction(+ : squares)
            for (int i = 0; i < hidden; ++i) {
                row[i] = widen(src[i]);
                squares += row[i] * row[i];
            }
        }
        const float inverse = 1.f / std::sqrt(squares / hidden + eps);
#pragma omp simd
        for (int i = 0; i < hidden; ++i) dst[i] = narrow(widen(weight[i]) * widen(narrow(row[i] * inverse)));
    }
}

// Rotary embedding in place on `heads` consecutive heads per row, rows `row_stride` elements apart
// (the query or key part of the fused qkv projection's output, or a normed copy of it). cos and sin
// are the float32 tables [max_positions, head_dim] (both halves equal), indexed by each row's position.
void sluice_rotary_bf16(uint16_t* x, long rows, long row_stride, int heads, int head_dim,
                        const int64_t* positions, const float* cos_table, const float* sin_table) {
    const int half = head_dim / 2;
#pragma omp parallel for if (rows * heads * head_dim >= PARALLEL_MIN)
    for (long r = 0; r < rows; ++r) {
        const float* cos = cos_table + positions[r] * head_dim;
        const float* sin = sin_table + positions[r] * head_dim;
        for (int h = 0; h < heads; ++h) {
            uint16_t* head = x + r * row_stride + static_cast<long>(h) * head_dim;
#pragma omp simd
            for (int i = 0; i < half; ++i) {
                const float first = widen(head[i]), second = widen(head[i + half]);
                head[i] = narrow(first * cos[i] - second * sin[i]);
                head[i + half] = narrow(second * cos[i + half] + first * sin[i + half]);
            }
        }
    }
}

}
