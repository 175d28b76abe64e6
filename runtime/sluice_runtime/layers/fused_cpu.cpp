// RMSNorm (with the residual add before it) and rotary embedding, fused for the CPU, in float32
// and bfloat16.
//
// In torch each is several passes over the activations (RMSNorm alone is an add, a cast, a square,
// a mean, an rsqrt, two multiplies and a cast back; rotary a negation, a concatenation, two
// multiplies and an add), each its own dispatch, trip through memory and, with several threads,
// its own fork and join. Here each is one pass per row in float32. Rows are split over the OpenMP
// threads torch already runs, only where a step has enough of them to pay for the join.
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

inline float widen(float value) { return value; }
inline float widen(uint16_t value) {
    const uint32_t bits = static_cast<uint32_t>(value) << 16;
    float out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
}

// Rounds to the element type: float32 stays as it is, so its arithmetic is torch's step for step.
template <typename T>
inline T narrow(float value);
template <>
inline float narrow<float>(float value) { return value; }
template <>
inline uint16_t narrow<uint16_t>(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // NaN stays NaN
    bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
    return static_cast<uint16_t>(bits >> 16);
}

// Below this many elements one thread is faster than waking the others.
constexpr long PARALLEL_MIN = 1 << 15;

// No multiply and add is contracted into one fused multiply-add, so float32 rounds where torch
// does: rotary bit for bit, the norm up to the order of its sum of squares.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

// With a residual: residual += x (the layer's skip connection, kept in the element type as torch
// keeps it), then out = weight * norm(residual). Without: out = weight * norm(x).
template <typename T>
void rms_norm(const T* x, T* residual, const T* weight, T* out, long rows, int hidden, float eps) {
#pragma omp parallel for if (rows * hidden >= PARALLEL_MIN)
    for (long r = 0; r < rows; ++r) {
        const T* src = x + r * hidden;
        T* dst = out + r * hidden;
        float row[16384];  // MAX_HIDDEN in fused_cpu.py
        float squares = 0.f;
        if (residual != nullptr) {
            T* skip = residual + r * hidden;
#pragma omp simd reduction(+ : squares)
            for (int i = 0; i < hidden; ++i) {
                const T sum = narrow<T>(widen(src[i]) + widen(skip[i]));
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
        for (int i = 0; i < hidden; ++i) dst[i] = narrow<T>(widen(weight[i]) * widen(narrow<T>(row[i] * inverse)));
    }
}

// Rotary embedding in place on `heads` consecutive heads per row, rows `row_stride` elements apart
// (the query or key part of the fused qkv projection's output, or a normed copy of it). cos and sin
// are the float32 tables [max_positions, head_dim] (both halves equal), indexed by each row's position.
template <typename T>
void rotary(T* x, long rows, long row_stride, int heads, int head_dim, const int64_t* positions,
            const float* cos_table, const float* sin_table) {
    const int half = head_dim / 2;
#pragma omp parallel for if (rows * heads * head_dim >= PARALLEL_MIN)
    for (long r = 0; r < rows; ++r) {
        const float* cos = cos_table + positions[r] * head_dim;
        const float* sin = sin_table + positions[r] * head_dim;
        for (int h = 0; h < heads; ++h) {
            T* head = x + r * row_stride + static_cast<long>(h) * head_dim;
#pragma omp simd
            for (int i = 0; i < half; ++i) {
                const float first = widen(head[i]), second = widen(head[i + half]);
                // Each product rounded before the sum, as torch's x * cos + rotate_half(x) * sin.
                const float first_cos = first * cos[i], second_sin = second * sin[i];
                const float second_cos = second * cos[i + half], first_sin = first * sin[i + half];
                head[i] = narrow<T>(first_cos - second_sin);
                head[i + half] = narrow<T>(second_cos + first_sin);
            }
        }
    }
}
#pragma GCC pop_options

}  // namespace

extern "C" {

void sluice_rms_norm_f32(const float* x, float* residual, const float* weight, float* out, long rows, int hidden,
                         float eps) {
    rms_norm(x, residual, weight, out, rows, hidden, eps);
}

void sluice_rms_norm_bf16(const uint16_t* x, uint16_t* residual, const uint16_t* weight, uint16_t* out, long rows,
                          int hidden, float eps) {
    rms_norm(x, residual, weight, out, rows, hidden, eps);
}

void sluice_rotary_f32(float* x, long rows, long row_stride, int heads, int head_dim, const int64_t* positions,
                       const float* cos_table, const float* sin_table) {
    rotary(x, rows, row_stride, heads, head_dim, positions, cos_table, sin_table);
}

void sluice_rotary_bf16(uint16_t* x, long rows, long row_stride, int heads, int head_dim, const int64_t* positions,
                        const float* cos_table, const float* sin_table) {
    rotary(x, rows, row_stride, heads, head_dim, positions, cos_table, sin_table);
}

}
