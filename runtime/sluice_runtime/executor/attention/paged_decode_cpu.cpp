// Decode attention straight from the paged KV cache, for the CPU.
//
// One query token per sequence reads its context block by block through the block table, so the
// keys and values are streamed once, in place, and never padded to the longest sequence. Work is
// split over (sequence, kv head) pairs; the query heads sharing a kv head (GQA) reuse each loaded
// key and value row. Softmax is computed online, one block of scores at a time.
//
// Layouts: q, out [B, Hq, D]; k_cache, v_cache [num_slots, Hk, D]; block_tables [B, max_blocks];
// context_lens [B]. Elements are float32 or bfloat16 (as raw uint16), accumulation is float32.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#define SLUICE_AVX512 1
#ifdef __AVX512BF16__
#define SLUICE_AVX512_BF16 1
#endif
#endif

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
// The scalar form serves the generic kernel, exp_nonpositive16 the AVX-512 one; both read these.
constexpr float EXP_FLOOR = -87.f;  // exp of anything lower is below float32's normal range
constexpr float LOG2E = 1.44269504088896341f;
constexpr float LN2_HIGH = 0.693359375f, LN2_LOW = 2.12194440e-4f;  // ln 2 split for an exact n * LN2_HIGH
constexpr float EXP_POLY[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
#pragma omp declare simd
inline float exp_nonpositive(float x) {
    x = x < EXP_FLOOR ? EXP_FLOOR : x;
    const float n = std::floor(x * LOG2E + 0.5f);
    const float r = x - n * LN2_HIGH + n * LN2_LOW;
    float p = EXP_POLY[0];
    for (int i = 1; i < 6; ++i) p = p * r + EXP_POLY[i];
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

#ifdef SLUICE_AVX512
// Lane t of the result is the sum of the 16 lanes of rows[t]: a transposing tree, about three
// instructions per row instead of a horizontal sum's eight.
inline __m512 row_sums16(const __m512* rows) {
    __m512 pairs[8], quads[4], octs[2];
    for (int i = 0; i < 8; ++i)
        pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(rows[2 * i], rows[2 * i + 1]),
                                 _mm512_unpackhi_ps(rows[2 * i], rows[2 * i + 1]));
    for (int i = 0; i < 4; ++i) {
        const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
        quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    for (int i = 0; i < 2; ++i)
        octs[i] = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], 0x88),
                                _mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(octs[0], octs[1], 0x88), _mm512_shuffle_f32x4(octs[0], octs[1], 0xdd));
}

// exp_nonpositive for 16 lanes; scalef applies the power of two.
inline __m512 exp_nonpositive16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(EXP_FLOOR));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(LN2_LOW), _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HIGH), x));
    __m512 p = _mm512_set1_ps(EXP_POLY[0]);
    for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_POLY[i]));
    p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

inline __mmask16 first_lanes(int n) { return n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1u); }

// How the three-pass kernel reads one element type: the query held in registers, the 16 partial
// products of a key row with it, a value row as float32.
template <typename T, int HEAD_DIM>
struct Rows;

template <int HEAD_DIM>
struct Rows<float, HEAD_DIM> {
    static constexpr int REGS = HEAD_DIM / 16;
    using Reg = __m512;
    static Reg query(const float* row, int r) { return _mm512_loadu_ps(row + 16 * r); }
    static __m512 products(const Reg* query, const float* key) {
        __m512 dot = _mm512_mul_ps(query[0], _mm512_loadu_ps(key));
        for (int r = 1; r < REGS; ++r) dot = _mm512_fmadd_ps(query[r], _mm512_loadu_ps(key + 16 * r), dot);
        return dot;
    }
    static __m512 value(const float* row, int v) { return _mm512_loadu_ps(row + 16 * v); }
};

#ifdef SLUICE_AVX512_BF16
// bfloat16 pairs multiplied and summed in float32 by vdpbf16ps: no widening of the keys.
template <int HEAD_DIM>
struct Rows<uint16_t, HEAD_DIM> {
    static constexpr int REGS = HEAD_DIM / 32;
    using Reg = __m512i;
    static Reg query(const uint16_t* row, int r) { return _mm512_loadu_si512(row + 32 * r); }
    static __m512 products(const Reg* query, const uint16_t* key) {
        __m512 dot = _mm512_setzero_ps();
        for (int r = 0; r < REGS; ++r)
            dot = _mm512_dpbf16_ps(dot, (__m512bh)query[r], (__m512bh)_mm512_loadu_si512(key + 32 * r));
        return dot;
    }
    static __m512 value(const uint16_t* row, int v) {
        return _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 * v)));
    }
};
#endif

// The kernel for CPUs with AVX-512. The generic kernel spends most of its time on bookkeeping per
// block (online-softmax rescaling, horizontal sums, scalar exp), not on the dot products; this one
// makes three passes per (sequence, kv head) instead: all scores (16 keys' dot products summed at
// once), one softmax over them, then the weighted values with every query head's accumulator in
// registers (GROUP is a compile-time constant for that). Float32 sums as before; only their order
// differs.
template <typename T, int HEAD_DIM, int GROUP>
void paged_decode_avx512(const T* q, const T* k_cache, const T* v_cache, const int32_t* block_tables,
                         const int32_t* context_lens, int batch, int max_blocks, int num_kv_heads, int block_size,
                         int window, float scale, T* out) {
    using R = Rows<T, HEAD_DIM>;
    constexpr int VECS = HEAD_DIM / 16;  // 16 float32 per register
    const long slot_stride = static_cast<long>(num_kv_heads) * HEAD_DIM;
    int longest = 1;
    for (int b = 0; b < batch; ++b) longest = std::max(longest, context_lens[b]);
    const long padded = (longest + 15) / 16 * 16;
#pragma omp parallel
    {
        std::vector<float> score_rows(GROUP * padded);
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < static_cast<long>(batch) * num_kv_heads; ++task) {
            const int seq = static_cast<int>(task / num_kv_heads);
            const int kv_head = static_cast<int>(task % num_kv_heads);
            const int length = context_lens[seq];
            const int first = window > 0 && length > window ? length - window : 0;
            const int count = length - first;
            const int32_t* table = block_tables + static_cast<long>(seq) * max_blocks;
            const long head_offset = static_cast<long>(kv_head) * HEAD_DIM;
            // This kv head's row at context position pos, in keys or values.
            const auto row_at = [&](const T* cache, int pos) {
                return cache + (static_cast<long>(table[pos / block_size]) * block_size + pos % block_size) *
                                   slot_stride + head_offset;
            };
            const T* q_rows = q + (static_cast<long>(seq) * num_kv_heads + kv_head) * GROUP * HEAD_DIM;
            typename R::Reg query[GROUP][R::REGS];
            for (int g = 0; g < GROUP; ++g)
                for (int r = 0; r < R::REGS; ++r) query[g][r] = R::query(q_rows + g * HEAD_DIM, r);

            // Pass 1: scores, in runs of at most 16 consecutive slots inside one block.
            for (int pos = first; pos < length;) {
                const int in_block = pos % block_size;
                const int n = std::min({16, block_size - in_block, length - pos});
                const T* keys = row_at(k_cache, pos);
                for (int g = 0; g < GROUP; ++g) {
                    __m512 partial[16];
                    for (int t = 0; t < 16; ++t)
                        partial[t] = t < n ? R::products(query[g], keys + t * slot_stride) : _mm512_setzero_ps();
                    _mm512_mask_storeu_ps(&score_rows[g * padded + (pos - first)], first_lanes(n),
                                          _mm512_mul_ps(row_sums16(partial), _mm512_set1_ps(scale)));
                }
                pos += n;
            }

            // Pass 2: softmax weights, unnormalized; the sums divide at the end.
            float sums[GROUP];
            for (int g = 0; g < GROUP; ++g) {
                float* row = &score_rows[g * padded];
                __m512 maxima = _mm512_set1_ps(-INFINITY);
                for (int i = 0; i < count; i += 16)
                    maxima = _mm512_max_ps(maxima, _mm512_mask_loadu_ps(maxima, first_lanes(count - i), row + i));
                const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(maxima));
                __m512 total = _mm512_setzero_ps();
                for (int i = 0; i < count; i += 16) {
                    const __mmask16 lanes = first_lanes(count - i);
                    const __m512 weights = _mm512_maskz_mov_ps(
                        lanes, exp_nonpositive16(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, row + i), top)));
                    _mm512_mask_storeu_ps(row + i, lanes, weights);
                    total = _mm512_add_ps(total, weights);
                }
                sums[g] = _mm512_reduce_add_ps(total);
            }

            // Pass 3: weighted values; each value row is widened once for all query heads.
            __m512 acc[GROUP][VECS];
            for (int g = 0; g < GROUP; ++g)
                for (int v = 0; v < VECS; ++v) acc[g][v] = _mm512_setzero_ps();
            for (int pos = first; pos < length;) {
                const int in_block = pos % block_size;
                const int n = std::min(block_size - in_block, length - pos);
                const T* values = row_at(v_cache, pos);
                for (int t = 0; t < n; ++t) {
                    __m512 row[VECS];
                    for (int v = 0; v < VECS; ++v) row[v] = R::value(values + t * slot_stride, v);
                    for (int g = 0; g < GROUP; ++g) {
                        const __m512 weight = _mm512_set1_ps(score_rows[g * padded + (pos - first) + t]);
                        for (int v = 0; v < VECS; ++v) acc[g][v] = _mm512_fmadd_ps(weight, row[v], acc[g][v]);
                    }
                }
                pos += n;
            }
            for (int g = 0; g < GROUP; ++g) {
                T* dst = out + (static_cast<long>(seq) * num_kv_heads + kv_head) * GROUP * HEAD_DIM + g * HEAD_DIM;
                const float norm = sums[g] > 0.f ? 1.f / sums[g] : 0.f;
                alignas(64) float result[HEAD_DIM];
                for (int v = 0; v < VECS; ++v) _mm512_store_ps(result + 16 * v, _mm512_mul_ps(acc[g][v], _mm512_set1_ps(norm)));
                for (int d = 0; d < HEAD_DIM; ++d) store(dst, d, result[d]);
            }
        }
    }
}

template <typename T, int HEAD_DIM>
bool dispatch_avx512(const T* q, const T* k_cache, const T* v_cache, const int32_t* block_tables,
                     const int32_t* context_lens, int batch, int max_blocks, int group, int num_kv_heads,
                     int block_size, int window, float scale, T* out) {
#define SLUICE_GROUP_CASE(G)                                                                                   \
    case G:                                                                                                    \
        paged_decode_avx512<T, HEAD_DIM, G>(q, k_cache, v_cache, block_tables, context_lens, batch, max_blocks, \
                                            num_kv_heads, block_size, window, scale, out);                     \
        return true;
    switch (group) {
        SLUICE_GROUP_CASE(1)
        SLUICE_GROUP_CASE(2)
        SLUICE_GROUP_CASE(3)
        SLUICE_GROUP_CASE(4)
        SLUICE_GROUP_CASE(5)
        SLUICE_GROUP_CASE(6)
        SLUICE_GROUP_CASE(7)
        SLUICE_GROUP_CASE(8)
        default:
            return false;
    }
#undef SLUICE_GROUP_CASE
}
#endif

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

// Whether this build has the three-pass kernel for T (bfloat16 rows need vdpbf16ps).
template <typename T>
constexpr bool has_three_pass() {
#if defined(SLUICE_AVX512_BF16)
    return true;
#elif defined(SLUICE_AVX512)
    return std::is_same_v<T, float>;
#else
    return false;
#endif
}

// The three-pass kernel where it is compiled in and fits (head size 64 or 128, at most 8 query heads
// per kv head), else the generic one.
template <typename T>
int decode(const T* q, const T* k_cache, const T* v_cache, const int32_t* block_tables, const int32_t* context_lens,
           int batch, int max_blocks, int num_heads, int num_kv_heads, int head_dim, int block_size, int window,
           float scale, T* out) {
#ifdef SLUICE_AVX512
    if constexpr (has_three_pass<T>()) {
        const int group = num_heads / num_kv_heads;
        if (head_dim == 64 && dispatch_avx512<T, 64>(q, k_cache, v_cache, block_tables, context_lens, batch,
                                                     max_blocks, group, num_kv_heads, block_size, window, scale, out))
            return 0;
        if (head_dim == 128 && dispatch_avx512<T, 128>(q, k_cache, v_cache, block_tables, context_lens, batch,
                                                       max_blocks, group, num_kv_heads, block_size, window, scale, out))
            return 0;
    }
#endif
    return dispatch(q, k_cache, v_cache, block_tables, context_lens, batch, max_blocks, num_heads, num_kv_heads,
                    head_dim, block_size, window, scale, out);
}

}  // namespace

// Entry points return -1 for a head size without a compiled variant (the caller falls back).
extern "C" {

int sluice_paged_decode_f32(const float* q, const float* k_cache, const float* v_cache,
                            const int32_t* block_tables, const int32_t* context_lens, int batch, int max_blocks,
                            int num_heads, int num_kv_heads, int head_dim, int block_size, int window,
                            float scale, float* out) {
    return decode(q, k_cache, v_cache, block_tables, context_lens, batch, max_blocks, num_heads, num_kv_heads,
                  head_dim, block_size, window, scale, out);
}

int sluice_paged_decode_bf16(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache,
                             const int32_t* block_tables, const int32_t* context_lens, int batch,
                             int max_blocks, int num_heads, int num_kv_heads, int head_dim, int block_size,
                             int window, float scale, uint16_t* out) {
    return decode(q, k_cache, v_cache, block_tables, context_lens, batch, max_blocks, num_heads, num_kv_heads,
                  head_dim, block_size, window, scale, out);
}

}
