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
#include <vector>

// The three-pass kernel is built for the widest vector instruction set the flags allow: AVX-512
// (vdpbf16ps for bfloat16 where AVX512-BF16 is there too), else AVX2 with FMA; without either only
// the generic kernel, which the compiler vectorizes by itself.
#if defined(__AVX512F__)
#include <immintrin.h>
#define SLUICE_SIMD 1
#define SLUICE_AVX512 1
#ifdef __AVX512BF16__
#define SLUICE_AVX512_BF16 1
#endif
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SLUICE_SIMD 1
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
// The scalar form serves the generic kernel, exp_nonpositive_simd the three-pass one; both read these.
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

#ifdef SLUICE_SIMD
// The vector operations the three-pass kernel is written in, for the one instruction set this
// library is built for (native_build passes the CPU level's flags). Lanes are float32.
#ifdef SLUICE_AVX512
struct Simd {
    static constexpr int LANES = 16;
    static constexpr int REGISTERS = 32;
    using Vec = __m512;
    using Mask = __mmask16;
    static Vec zero() { return _mm512_setzero_ps(); }
    static Vec set1(float x) { return _mm512_set1_ps(x); }
    static Vec load(const float* p) { return _mm512_loadu_ps(p); }
    static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
    static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
    static Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
    static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
    static Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
    static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
    static float reduce_add(Vec v) { return _mm512_reduce_add_ps(v); }
    static float reduce_max(Vec v) { return _mm512_reduce_max_ps(v); }
    // The first n lanes (all of them from LANES on).
    static Mask first(int n) { return n >= 16 ? 0xffff : static_cast<Mask>((1u << n) - 1u); }
    static Vec load_first(const float* p, Mask m, Vec other) { return _mm512_mask_loadu_ps(other, m, p); }
    static void store_first(float* p, Mask m, Vec v) { _mm512_mask_storeu_ps(p, m, v); }
    static Vec keep_first(Mask m, Vec v) { return _mm512_maskz_mov_ps(m, v); }
    static Vec widen_bf16(const uint16_t* p) {
        const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
    }
    // Lane t of the result is the sum of the lanes of rows[t]: a transposing tree, about three
    // instructions per row instead of a horizontal sum's eight.
    static Vec row_sums(const Vec* rows) {
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
        return _mm512_add_ps(_mm512_shuffle_f32x4(octs[0], octs[1], 0x88),
                             _mm512_shuffle_f32x4(octs[0], octs[1], 0xdd));
    }
    static Vec round(Vec x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    // p * 2^n for integral n in float32's normal exponent range.
    static Vec scale_pow2(Vec p, Vec n) { return _mm512_scalef_ps(p, n); }
};
#else
struct Simd {
    static constexpr int LANES = 8;
    static constexpr int REGISTERS = 16;
    using Vec = __m256;
    using Mask = __m256i;
    static Vec zero() { return _mm256_setzero_ps(); }
    static Vec set1(float x) { return _mm256_set1_ps(x); }
    static Vec load(const float* p) { return _mm256_loadu_ps(p); }
    static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
    static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
    static Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
    static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
    static Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
    static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
    static float reduce_add(Vec v) {
        __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
    }
    static float reduce_max(Vec v) {
        __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        x = _mm_max_ps(x, _mm_movehl_ps(x, x));
        return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
    }
    static Mask first(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
    static Vec load_first(const float* p, Mask m, Vec other) {
        return _mm256_blendv_ps(other, _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
    }
    static void store_first(float* p, Mask m, Vec v) { _mm256_maskstore_ps(p, m, v); }
    static Vec keep_first(Mask m, Vec v) { return _mm256_and_ps(v, _mm256_castsi256_ps(m)); }
    static Vec widen_bf16(const uint16_t* p) {
        const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
    }
    // Lane t of the result is the sum of the lanes of rows[t]: pairwise horizontal adds, then the
    // two 128-bit halves added.
    static Vec row_sums(const Vec* rows) {
        const __m256 a = _mm256_hadd_ps(rows[0], rows[1]), b = _mm256_hadd_ps(rows[2], rows[3]);
        const __m256 c = _mm256_hadd_ps(rows[4], rows[5]), d = _mm256_hadd_ps(rows[6], rows[7]);
        const __m256 low = _mm256_hadd_ps(a, b), high = _mm256_hadd_ps(c, d);  // rows 0-3, rows 4-7
        return _mm256_add_ps(_mm256_permute2f128_ps(low, high, 0x20), _mm256_permute2f128_ps(low, high, 0x31));
    }
    static Vec round(Vec x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static Vec scale_pow2(Vec p, Vec n) {
        const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
        return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
    }
};
#endif

using Vec = Simd::Vec;

// exp_nonpositive, LANES at a time.
inline Vec exp_nonpositive_simd(Vec x) {
    x = Simd::max(x, Simd::set1(EXP_FLOOR));
    const Vec n = Simd::round(Simd::mul(x, Simd::set1(LOG2E)));
    const Vec r = Simd::fmadd(n, Simd::set1(LN2_LOW), Simd::fmadd(n, Simd::set1(-LN2_HIGH), x));
    Vec p = Simd::set1(EXP_POLY[0]);
    for (int i = 1; i < 6; ++i) p = Simd::fmadd(p, r, Simd::set1(EXP_POLY[i]));
    p = Simd::add(Simd::fmadd(Simd::mul(p, r), r, r), Simd::set1(1.f));
    return Simd::scale_pow2(p, n);
}

// Rows this far ahead are requested before they are read: a task reads its kv head's share of each
// cache row at a stride, and the hardware prefetcher does not follow a block table from one block
// to the next when the blocks are scattered, as they become in a server that has run a while
// (README, the engine's CPU paths).
constexpr int PREFETCH_ROWS = 16;
template <typename T, int HEAD_DIM>
inline void prefetch_row(const T* row) {
    const char* bytes = reinterpret_cast<const char*>(row);
    for (int line = 0; line < static_cast<int>(HEAD_DIM * sizeof(T)); line += 64)
        __builtin_prefetch(bytes + line, 0, 3);
}

// How the three-pass kernel reads one element type: the query held in registers, the LANES partial
// products of a key row with it, a value row as float32.
template <typename T, int HEAD_DIM>
struct Rows;

template <int HEAD_DIM>
struct Rows<float, HEAD_DIM> {
    static constexpr int REGS = HEAD_DIM / Simd::LANES;
    using Reg = Vec;
    static Reg query(const float* row, int r) { return Simd::load(row + Simd::LANES * r); }
    static Vec products(const Reg* query, const float* key) {
        Vec dot = Simd::mul(query[0], Simd::load(key));
        for (int r = 1; r < REGS; ++r) dot = Simd::fmadd(query[r], Simd::load(key + Simd::LANES * r), dot);
        return dot;
    }
    static Vec value(const float* row, int v) { return Simd::load(row + Simd::LANES * v); }
};

#ifdef SLUICE_AVX512_BF16
// bfloat16 pairs multiplied and summed in float32 by vdpbf16ps: no widening of the keys.
template <int HEAD_DIM>
struct Rows<uint16_t, HEAD_DIM> {
    static constexpr int REGS = HEAD_DIM / 32;
    using Reg = __m512i;
    static Reg query(const uint16_t* row, int r) { return _mm512_loadu_si512(row + 32 * r); }
    static Vec products(const Reg* query, const uint16_t* key) {
        __m512 dot = _mm512_setzero_ps();
        for (int r = 0; r < REGS; ++r)
            dot = _mm512_dpbf16_ps(dot, (__m512bh)query[r], (__m512bh)_mm512_loadu_si512(key + 32 * r));
        return dot;
    }
    static Vec value(const uint16_t* row, int v) {
        return _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 * v)));
    }
};
#else
// bfloat16 widened to float32 (a shift) as it is read; the query once, up front.
template <int HEAD_DIM>
struct Rows<uint16_t, HEAD_DIM> {
    static constexpr int REGS = HEAD_DIM / Simd::LANES;
    using Reg = Vec;
    static Reg query(const uint16_t* row, int r) { return Simd::widen_bf16(row + Simd::LANES * r); }
    static Vec products(const Reg* query, const uint16_t* key) {
        Vec dot = Simd::mul(query[0], Simd::widen_bf16(key));
        for (int r = 1; r < REGS; ++r) dot = Simd::fmadd(query[r], Simd::widen_bf16(key + Simd::LANES * r), dot);
        return dot;
    }
    static Vec value(const uint16_t* row, int v) { return Simd::widen_bf16(row + Simd::LANES * v); }
};
#endif

// Head-dim vectors whose accumulators pass 3 keeps in registers for all GROUP query heads at once
// (a power of two dividing VECS, using at most three quarters of the registers); wider heads take
// several sweeps over the values.
constexpr int value_tile(int group, int vecs) {
    int tile = vecs;
    while (tile > 1 && group * tile > Simd::REGISTERS * 3 / 4) tile /= 2;
    return tile;
}

// The generic kernel spends most of its time on bookkeeping per block (online-softmax rescaling,
// horizontal sums, scalar exp), not on the dot products; this one makes three passes per
// (sequence, kv head) instead: all scores (LANES keys' dot products summed at once), one softmax
// over them, then the weighted values with the query heads' accumulators in registers (GROUP is a
// compile-time constant for that). Float32 sums as before; only their order differs.
template <typename T, int HEAD_DIM, int GROUP>
void paged_decode_three_pass(const T* q, const T* k_cache, const T* v_cache, const int32_t* block_tables,
                             const int32_t* context_lens, int batch, int max_blocks, int num_kv_heads,
                             int block_size, int window, float scale, T* out) {
    using R = Rows<T, HEAD_DIM>;
    constexpr int LANES = Simd::LANES;
    constexpr int VECS = HEAD_DIM / LANES;
    constexpr int TILE = value_tile(GROUP, VECS);
    const long slot_stride = static_cast<long>(num_kv_heads) * HEAD_DIM;
    int longest = 1;
    for (int b = 0; b < batch; ++b) longest = std::max(longest, context_lens[b]);
    const long padded = (longest + LANES - 1) / LANES * LANES;
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

            // Pass 1: scores, in runs of at most LANES consecutive slots inside one block.
            for (int pos = first; pos < length;) {
                const int in_block = pos % block_size;
                const int n = std::min({LANES, block_size - in_block, length - pos});
                const T* keys = row_at(k_cache, pos);
                for (int t = 0; t < n && pos + PREFETCH_ROWS + t < length; ++t)
                    prefetch_row<T, HEAD_DIM>(row_at(k_cache, pos + PREFETCH_ROWS + t));
                for (int g = 0; g < GROUP; ++g) {
                    Vec partial[LANES];
                    for (int t = 0; t < LANES; ++t)
                        partial[t] = t < n ? R::products(query[g], keys + t * slot_stride) : Simd::zero();
                    Simd::store_first(&score_rows[g * padded + (pos - first)], Simd::first(n),
                                      Simd::mul(Simd::row_sums(partial), Simd::set1(scale)));
                }
                pos += n;
            }

            // Pass 2: softmax weights, unnormalized; the sums divide at the end.
            float sums[GROUP];
            for (int g = 0; g < GROUP; ++g) {
                float* row = &score_rows[g * padded];
                const Vec lowest = Simd::set1(-INFINITY);
                Vec maxima = lowest;
                for (int i = 0; i < count; i += LANES)
                    maxima = Simd::max(maxima, Simd::load_first(row + i, Simd::first(count - i), lowest));
                const Vec top = Simd::set1(Simd::reduce_max(maxima));
                Vec total = Simd::zero();
                for (int i = 0; i < count; i += LANES) {
                    const auto lanes = Simd::first(count - i);
                    const Vec weights = Simd::keep_first(
                        lanes, exp_nonpositive_simd(Simd::sub(Simd::load_first(row + i, lanes, top), top)));
                    Simd::store_first(row + i, lanes, weights);
                    total = Simd::add(total, weights);
                }
                sums[g] = Simd::reduce_add(total);
            }

            // Pass 3: weighted values, TILE vectors of the head at a time; each value row is read
            // once per sweep for all query heads.
            alignas(64) float result[GROUP][HEAD_DIM];
            for (int v0 = 0; v0 < VECS; v0 += TILE) {
                Vec acc[GROUP][TILE];
                for (int g = 0; g < GROUP; ++g)
                    for (int v = 0; v < TILE; ++v) acc[g][v] = Simd::zero();
                for (int pos = first; pos < length;) {
                    const int in_block = pos % block_size;
                    const int n = std::min(block_size - in_block, length - pos);
                    const T* values = row_at(v_cache, pos);
                    for (int t = 0; t < n; ++t) {
                        if (v0 == 0 && pos + PREFETCH_ROWS + t < length)
                            prefetch_row<T, HEAD_DIM>(row_at(v_cache, pos + PREFETCH_ROWS + t));
                        Vec row[TILE];
                        for (int v = 0; v < TILE; ++v) row[v] = R::value(values + t * slot_stride, v0 + v);
                        for (int g = 0; g < GROUP; ++g) {
                            const Vec weight = Simd::set1(score_rows[g * padded + (pos - first) + t]);
                            for (int v = 0; v < TILE; ++v) acc[g][v] = Simd::fmadd(weight, row[v], acc[g][v]);
                        }
                    }
                    pos += n;
                }
                for (int g = 0; g < GROUP; ++g) {
                    const Vec norm = Simd::set1(sums[g] > 0.f ? 1.f / sums[g] : 0.f);
                    for (int v = 0; v < TILE; ++v) Simd::store(&result[g][(v0 + v) * LANES], Simd::mul(acc[g][v], norm));
                }
            }
            for (int g = 0; g < GROUP; ++g) {
                T* dst = out + (static_cast<long>(seq) * num_kv_heads + kv_head) * GROUP * HEAD_DIM + g * HEAD_DIM;
                for (int d = 0; d < HEAD_DIM; ++d) store(dst, d, result[g][d]);
            }
        }
    }
}

template <typename T, int HEAD_DIM>
bool dispatch_three_pass(const T* q, const T* k_cache, const T* v_cache, const int32_t* block_tables,
                         const int32_t* context_lens, int batch, int max_blocks, int group, int num_kv_heads,
                         int block_size, int window, float scale, T* out) {
#define SLUICE_GROUP_CASE(G)                                                                                      \
    case G:                                                                                                       \
        paged_decode_three_pass<T, HEAD_DIM, G>(q, k_cache, v_cache, block_tables, context_lens, batch, max_blocks, \
                                                num_kv_heads, block_size, window, scale, out);                    \
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

// The three-pass kernel where it is compiled in and fits (head size 64 or 128, at most 8 query heads
// per kv head), else the generic one.
template <typename T>
int decode(const T* q, const T* k_cache, const T* v_cache, const int32_t* block_tables, const int32_t* context_lens,
           int batch, int max_blocks, int num_heads, int num_kv_heads, int head_dim, int block_size, int window,
           float scale, T* out) {
#ifdef SLUICE_SIMD
    const int group = num_heads / num_kv_heads;
    if (head_dim == 64 && dispatch_three_pass<T, 64>(q, k_cache, v_cache, block_tables, context_lens, batch,
                                                     max_blocks, group, num_kv_heads, block_size, window, scale, out))
        return 0;
    if (head_dim == 128 && dispatch_three_pass<T, 128>(q, k_cache, v_cache, block_tables, context_lens, batch,
                                                       max_blocks, group, num_kv_heads, block_size, window, scale, out))
        return 0;
#endif
    return dispatch(q, k_cache, v_cache, block_tables, context_lens, batch, max_blocks, num_heads, num_kv_heads,
                    head_dim, block_size, window, scale, out);
}

}  // namespace

// Entry points return -1 for a head size without a compiled variant (the caller falls back).
extern "C" {

// Which kernel decodes (head sizes 64 and 128, at most 8 query heads per kv head), for the start-up log.
const char* sluice_paged_decode_kernel() {
#if defined(SLUICE_AVX512_BF16)
    return "three-pass AVX-512 (bfloat16 dot products by AVX512-BF16)";
#elif defined(SLUICE_AVX512)
    return "three-pass AVX-512";
#elif defined(SLUICE_SIMD)
    return "three-pass AVX2";
#else
    return "generic";
#endif
}

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
