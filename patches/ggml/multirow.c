// specpilot: multi-row dot products for K-quant weights (speculative verification).
//
// A verification forward multiplies every weight row by a few activation rows (the drafted
// tokens). ggml's vec_dot unpacks a weight block once per (weight row, activation row) pair, so
// verifying n tokens costs about n single-token forwards; the tiled path only pays from 16 rows
// on. These kernels unpack each weight block once and apply it to every activation row.
//
// Each row's result is computed with exactly the integer and float operations, in the same
// order, as ggml's AVX2 ggml_vec_dot_q4_K_q8_K / ggml_vec_dot_q6_K_q8_K: a forward over n
// tokens gives the same matmul results as n one-token forwards, bit for bit.

#define GGML_COMMON_DECL_C
#include "ggml-common.h"

#include "ggml-cpu-impl.h"
#include "simd-mappings.h"
#include "multirow.h"

#include <string.h>

#if defined(__AVX2__)

#include <immintrin.h>

static inline float multirow_hsum_float_8(const __m256 x) {
    __m128 res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    return _mm_cvtss_f32(res);
}

// 64 bytes of quants against 64 bytes of q8, each 32-byte half scaled by its own 16-bit scales:
// 8 int32 lanes per half. Folding the halves gives the lanes ggml's AVX2 vec_dot sums (integer
// sums, so the order does not matter). One 512-bit register where the CPU has AVX512BW.
#if defined(__AVX512BW__)
typedef __m512i multirow_i512;
static inline multirow_i512 multirow_join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
static inline multirow_i512 multirow_zero(void) { return _mm512_setzero_si512(); }
static inline multirow_i512 multirow_add(multirow_i512 a, multirow_i512 b) { return _mm512_add_epi32(a, b); }
static inline multirow_i512 multirow_dot_scaled(multirow_i512 q, const int8_t * q8, multirow_i512 scale) {
    return _mm512_madd_epi16(scale, _mm512_maddubs_epi16(q, _mm512_loadu_si512((const void *) q8)));
}
static inline __m256i multirow_fold(multirow_i512 a) {
    return _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
}
#else
typedef struct { __m256i lo, hi; } multirow_i512;
static inline multirow_i512 multirow_join(__m256i lo, __m256i hi) { multirow_i512 r = { lo, hi }; return r; }
static inline multirow_i512 multirow_zero(void) {
    multirow_i512 r = { _mm256_setzero_si256(), _mm256_setzero_si256() };
    return r;
}
static inline multirow_i512 multirow_add(multirow_i512 a, multirow_i512 b) {
    multirow_i512 r = { _mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi) };
    return r;
}
static inline multirow_i512 multirow_dot_scaled(multirow_i512 q, const int8_t * q8, multirow_i512 scale) {
    multirow_i512 r = {
        _mm256_madd_epi16(scale.lo, _mm256_maddubs_epi16(q.lo, _mm256_loadu_si256((const __m256i *) q8))),
        _mm256_madd_epi16(scale.hi, _mm256_maddubs_epi16(q.hi, _mm256_loadu_si256((const __m256i *) (q8 + 32)))),
    };
    return r;
}
static inline __m256i multirow_fold(multirow_i512 a) { return _mm256_add_epi32(a.lo, a.hi); }
#endif

// Byte shuffles that broadcast the 16-bit scale of sub-block i (Q4_K) to every lane pair.
static inline __m256i multirow_q4_K_scale_shuffle(int i) {
    const __m256i pair = _mm256_set1_epi16((short) (((2 * i + 1) << 8) | (2 * i)));
    return pair;
}

// Byte shuffles that broadcast the int8 scales of sub-blocks i (low half) / i+1 (high half) (Q6_K).
static inline __m128i multirow_q6_K_scale_shuffle(int i) {
    return _mm_set_epi8(2 * i + 1, 2 * i + 1, 2 * i + 1, 2 * i + 1, 2 * i + 1, 2 * i + 1,
                        2 * i + 1, 2 * i + 1, 2 * i, 2 * i, 2 * i, 2 * i, 2 * i, 2 * i, 2 * i, 2 * i);
}

static void multirow_dot_q4_K(int n, const void * vx, const void * vy, size_t vy_stride,
                              int nrows, float * s, size_t s_stride) {
    static const uint32_t kmask1 = 0x3f3f3f3f;
    static const uint32_t kmask2 = 0x0f0f0f0f;
    static const uint32_t kmask3 = 0x03030303;

    const block_q4_K * x = (const block_q4_K *) vx;
    const int nb = n / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0xF);

    __m256 acc[GGML_MULTIROW_MAX];
    __m128 acc_m[GGML_MULTIROW_MAX];
    for (int r = 0; r < nrows; ++r) {
        acc[r] = _mm256_setzero_ps();
        acc_m[r] = _mm_setzero_ps();
    }

    for (int i = 0; i < nb; ++i) {
        // the weight block, unpacked once for every row
        const float xd = GGML_CPU_FP16_TO_FP32(x[i].d);
        const float xdmin = GGML_CPU_FP16_TO_FP32(x[i].dmin);

        uint32_t utmp[4];
        memcpy(utmp, x[i].scales, 12);
        utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
        const uint32_t uaux = utmp[1] & kmask1;
        utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
        utmp[2] = uaux;
        utmp[0] &= kmask1;

        const __m256i mins_and_scales = _mm256_cvtepu8_epi16(_mm_set_epi32(utmp[3], utmp[2], utmp[1], utmp[0]));
        const __m128i mins = _mm256_extracti128_si256(mins_and_scales, 1);
        const __m128i sc128 = _mm256_extracti128_si256(mins_and_scales, 0);
        const __m256i scales = _mm256_set_m128i(sc128, sc128);

        // sub-blocks 2j (low nibbles) and 2j+1 (high nibbles) side by side: the 64 bytes of q8
        // they meet are contiguous
        multirow_i512 q4[QK_K / 64], scale[QK_K / 64];
        for (int j = 0; j < QK_K / 64; ++j) {
            const __m256i q4bits = _mm256_loadu_si256((const __m256i *) (x[i].qs + 32 * j));
            q4[j] = multirow_join(_mm256_and_si256(q4bits, m4),
                                  _mm256_and_si256(_mm256_srli_epi16(q4bits, 4), m4));
            scale[j] = multirow_join(_mm256_shuffle_epi8(scales, multirow_q4_K_scale_shuffle(2 * j + 0)),
                                     _mm256_shuffle_epi8(scales, multirow_q4_K_scale_shuffle(2 * j + 1)));
        }

        for (int r = 0; r < nrows; ++r) {
            const block_q8_K * y = (const block_q8_K *) ((const char *) vy + r * vy_stride) + i;
            const float d = y->d * xd;
            const float dmin = -y->d * xdmin;

            const __m256i q8sums = _mm256_loadu_si256((const __m256i *) y->bsums);
            const __m128i q8s = _mm_hadd_epi16(_mm256_extracti128_si256(q8sums, 0),
                                               _mm256_extracti128_si256(q8sums, 1));
            const __m128i prod = _mm_madd_epi16(mins, q8s);
            acc_m[r] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[r]);

            multirow_i512 sumi = multirow_zero();
            for (int j = 0; j < QK_K / 64; ++j) {
                sumi = multirow_add(sumi, multirow_dot_scaled(q4[j], y->qs + 64 * j, scale[j]));
            }
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(multirow_fold(sumi)), acc[r]);
        }
    }

    for (int r = 0; r < nrows; ++r) {
        __m128 m = acc_m[r];
        m = _mm_add_ps(m, _mm_movehl_ps(m, m));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));
        s[r * s_stride] = multirow_hsum_float_8(acc[r]) + _mm_cvtss_f32(m);
    }
}

static void multirow_dot_q6_K(int n, const void * vx, const void * vy, size_t vy_stride,
                              int nrows, float * s, size_t s_stride) {
    const block_q6_K * x = (const block_q6_K *) vx;
    const int nb = n / QK_K;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i m15 = _mm256_set1_epi8(15);

    __m256 acc[GGML_MULTIROW_MAX];
    for (int r = 0; r < nrows; ++r) {
        acc[r] = _mm256_setzero_ps();
    }

    for (int i = 0; i < nb; ++i) {
        const float xd = GGML_CPU_FP16_TO_FP32(x[i].d);
        const __m128i scales = _mm_loadu_si128((const __m128i *) x[i].scales);
        const __m256i scales_16 = _mm256_cvtepi8_epi16(scales);

        // 6-bit quants of the block, 4 x 32 per half, and their sub-block scales
        __m256i q6[QK_K / 32], scale6[QK_K / 32];
        const uint8_t * q4 = x[i].ql;
        const uint8_t * qh = x[i].qh;
        for (int j = 0; j < QK_K / 128; ++j) {
            const __m256i q4bits1 = _mm256_loadu_si256((const __m256i *) q4); q4 += 32;
            const __m256i q4bits2 = _mm256_loadu_si256((const __m256i *) q4); q4 += 32;
            const __m256i q4bitsH = _mm256_loadu_si256((const __m256i *) qh); qh += 32;

            const __m256i q4h_0 = _mm256_slli_epi16(_mm256_and_si256(q4bitsH, m3), 4);
            const __m256i q4h_1 = _mm256_slli_epi16(_mm256_and_si256(q4bitsH, _mm256_set1_epi8(12)), 2);
            const __m256i q4h_2 = _mm256_and_si256(q4bitsH, _mm256_set1_epi8(48));
            const __m256i q4h_3 = _mm256_srli_epi16(_mm256_and_si256(q4bitsH, _mm256_set1_epi8(-64)), 2);

            q6[4 * j + 0] = _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0);
            q6[4 * j + 1] = _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1);
            q6[4 * j + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m15), q4h_2);
            q6[4 * j + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m15), q4h_3);
            for (int k = 0; k < 4; ++k) {
                scale6[4 * j + k] = _mm256_cvtepi8_epi16(
                    _mm_shuffle_epi8(scales, multirow_q6_K_scale_shuffle(4 * j + k)));
            }
        }
        // sub-blocks side by side in pairs: the 64 bytes of q8 they meet are contiguous
        multirow_i512 q6p[QK_K / 64], scalep[QK_K / 64];
        for (int k = 0; k < QK_K / 64; ++k) {
            q6p[k] = multirow_join(q6[2 * k], q6[2 * k + 1]);
            scalep[k] = multirow_join(scale6[2 * k], scale6[2 * k + 1]);
        }

        for (int r = 0; r < nrows; ++r) {
            const block_q8_K * y = (const block_q8_K *) ((const char *) vy + r * vy_stride) + i;
            const float d = y->d * xd;

            const __m256i q8sums = _mm256_loadu_si256((const __m256i *) y->bsums);
            const __m256i q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, scales_16), 5);

            multirow_i512 sum = multirow_zero();
            for (int k = 0; k < QK_K / 64; ++k) {
                sum = multirow_add(sum, multirow_dot_scaled(q6p[k], y->qs + 64 * k, scalep[k]));
            }
            const __m256i sumi = _mm256_sub_epi32(multirow_fold(sum), q8sclsub);
            acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d), _mm256_cvtepi32_ps(sumi), acc[r]);
        }
    }

    for (int r = 0; r < nrows; ++r) {
        s[r * s_stride] = multirow_hsum_float_8(acc[r]);
    }
}

ggml_multirow_dot_t ggml_multirow_dot(enum ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_K: return multirow_dot_q4_K;
        case GGML_TYPE_Q6_K: return multirow_dot_q6_K;
        default:             return NULL;
    }
}

#else

ggml_multirow_dot_t ggml_multirow_dot(enum ggml_type type) {
    (void) type;
    return NULL;
}

#endif
