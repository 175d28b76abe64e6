// Decode attention straight from the paged KV cache, for the CPU.
//
// One query token per sequence reads its context block by block through the block table, so the
// keys and values are streamed once, in place, and never padded to the longest sequence. Work is
// split over (sequence, kv head) pairs; the query heads sharing a kv head (GQA) reuse each loaded
// key and value row. Softmax is computed online, one block of scores at a time.
//
// Layouts: q, out [B, Hq, D]; k_cache, v_cache [num_slots, Hk, D]; block_tables [B, max_blocks];
// context_lens [B]. Elements are float32 or bfloat16 (as raw uint16), accumulation is float32.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

inline float load(const float* p, int i) { return p[i]; }
inline float load(const uint16_t* p, int i) {
    uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

template <int N>
inline void widen(const float* src, float* dst) { std::memcpy(dst, src, N * sizeof(float)); }
template <int N>
inline void widen(const uint16_t* src, float* dst) {
    for (int i = 0; i < N; ++i) {
        const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
        std::memcpy(&dst[i], &bits, sizeof bits);
    }
}

inline void store(float* p, int i, float value) { p[i] = value; }
inline void store(uint16_t* p, int i, float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN stays NaN
        p[i] = static_cast<uint16_t>((bits >> 16) | 0x40u);
        return;
    }
    bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
    p[i] = static_cast<uint16_t>(bits >> 16);
}

// exp(x) for x <= 0 in a form the compiler vectorizes (libm's expf is a scalar call): split off
// the power of two, then a degree-6 polynomial on the remainder (Cephes coefficients, ~1e-7 rel.).
#pragma omp declare simd
inline float exp_nonpositive(float x) {
    x = x < -87.f ? -87.f : x;
    const float n = std::floor(x * 1.44269504088896341f + 0.5f);
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
    const int32_t exponent = (static_cast<int32_t>(n) + 127) << 23;
    float power;
    std::memcpy(&power, &exponent, sizeof power);
    return p * power;
}

// HEAD_DIM is a compile-time constant so the inner loops unroll into whole vector registers.
template <typename T, int HEAD_DIM>
void paged_decode(const T* q, const T* k_cache, const T* v_cache, const int32_t* block_tables,
                  const int32_t* context_lens, int batch, int max_blocks, int num_heads, int num_kv_heads,
                  int block_size, int window, float scale, T* out) {
    const int group = num_heads / num_kv_heads;
    const long slot_stride = static_cast<long>(num_kv_heads) * HEAD_DIM;
#pragma omp parallel
    {
        std::vector<float> query(group * HEAD_DIM), acc(group * HEAD_DIM), scores(group * block_size);
        std::vector<float> values(block_size * HEAD_DIM), running_max(group), running_sum(group);
        alignas(64) float key[HEAD_DIM];
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < static_cast<long>(batch) * num_kv_heads; ++task) {
            const int seq = static_cast<int>(task / num_kv_heads);
            const int kv_head = static_cast<int>(task % num_kv_heads);
            const int length = context_lens[seq];
            const int first = window > 0 && length > window ? length - window : 0;
            const int32_t* table = block_tables + static_cast<long>(seq) * max_blocks;
            for (int g = 0; g < group; ++g) {
                const T* src = q + (static_cast<long>(seq) * num_heads + kv_head * group + g) * HEAD_DIM;
                for (int d = 0; d < HEAD_DIM; ++d) query[g * HEAD_DIM + d] = load(src, d) * scale;
                running_max[g] = -INFINITY;
                running_sum[g] = 0.f;
            }
            std::fill(acc.begin(), acc.end(), 0.f);
            for (int start = first - first % block_size; start < length; start += block_size) {
                const long base = static_cast<long>(table[start / block_size]) * block_size;
                const int lo = start < first ? first - start : 0;
                const int hi = length - start < block_size ? length - start : block_size;
                // Each key row is widened once and scored by every query head of the group.
                for (int t = lo; t < hi; ++t) {
                    const long offset = (base + t) * slot_stride + static_cast<long>(kv_head) * HEAD_DIM;
                    widen<HEAD_DIM>(k_cache + offset, key);
                    widen<HEAD_DIM>(v_cache + offset, &values[t * HEAD_DIM]);
                    for (int g = 0; g < group; ++g) {
                        const float* qg = &query[g * HEAD_DIM];
                        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                        for (int d = 0; d < HEAD_DIM; ++d) dot += qg[d] * key[d];
                        scores[g * block_size + t] = dot;
                    }
                }
                for (int g = 0; g < group; ++g) {
                    float* sg = &scores[g * block_size];
                    float block_max = -INFINITY;
                    for (int t = lo; t < hi; ++t) block_max = sg[t] > block_max ? sg[t] : block_max;
                    const float new_max = block_max > running_max[g] ? block_max : running_max[g];
                    const float rescale = std::exp(running_max[g] - new_max);
                    running_max[g] = new_max;
                    float block_sum = 0.f;
#pragma omp simd reduction(+ : block_sum)
                    for (int t = lo; t < hi; ++t) {
                        sg[t] = exp_nonpositive(sg[t] - new_max);
                        block_sum += sg[t];
                    }
                    running_sum[g] = running_sum[g] * rescale + block_sum;
                    // The head's accumulator stays in registers across the block's value rows.
                    alignas(64) float head_acc[HEAD_DIM];
                    for (int d = 0; d < HEAD_DIM; ++d) head_acc[d] = acc[g * HEAD_DIM + d] * rescale;
                    for (int t = lo; t < hi; ++t) {
                        const float weight = sg[t];
                        const float* value = &values[t * HEAD_DIM];
#pragma omp simd
                        for (int d = 0; d < HEAD_DIM; ++d) head_acc[d] += weight * value[d];
                    }
                    for (int d = 0; d < HEAD_DIM; ++d) acc[g * HEAD_DIM + d] = head_acc[d];
                }
            }
            for (int g = 0; g < group; ++g) {
                T* dst = out + (static_cast<long>(seq) * num_heads + kv_head * group + g) * HEAD_DIM;
                const float norm = running_sum[g] > 0.f ? 1.f / running_sum[g] : 0.f;
                for (int d = 0; d < HEAD_DIM; ++d) store(dst, d, acc[g * HEAD_DIM + d] * norm);
            }
        }
    }
}

template <typename T>
int dispatch(const T* q, const T* k_cache, const T* v_cache, const int32_t* block_tables,
             const int32_t* context_lens, int batch, int max_blocks, int num_heads, int num_kv_heads,
             int head_dim, int block_size, int window, float scale, T* out) {
    switch (head_dim) {
        case 64:
            paged_decode<T, 64>(q, k_cache, v_cache, block_tables, context_lens, batch, max_blocks, num_heads,
                                num_kv_heads, block_size, window, scale, out);
            return 0;
        case 128:
            paged_decode<T, 128>(q, k_cache, v_cache, block_tables, context_lens, batch, max_blocks, num_heads,
                                 num_kv_heads, block_size, window, scale, out);
            return 0;
        default:
            return -1;
    }
}

}  // namespace

// Entry points return -1 for a head size without a compiled variant (the caller falls back).
extern "C" {

int sluice_paged_decode_f32(const float* q, const float* k_cache, const float* v_cache,
                            const int32_t* block_tables, const int32_t* context_lens, int batch, int max_blocks,
                            int num_heads, int num_kv_heads, int head_dim, int block_size, int window,
                            float scale, float* out) {
    return dispatch(q, k_cache, v_cache, block_tables, context_lens, batch, max_blocks, num_heads, num_kv_heads,
                    head_dim, block_size, window, scale, out);
}

int sluice_paged_decode_bf16(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache,
                             const int32_t* block_tables, const int32_t* context_lens, int batch,
                             int max_blocks, int num_heads, int num_kv_heads, int head_dim, int block_size,
                             int window, float scale, uint16_t* out) {
    return dispatch(q, k_cache, v_cache, block_tables, context_lens, batch, max_blocks, num_heads, num_kv_heads,
                    head_dim, block_size, window, scale, out);
}

}
