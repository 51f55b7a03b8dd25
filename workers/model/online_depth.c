/* Block AttnRes inference over depth, fused per token (the kernels of workers/model/native.py).
 *
 * The arithmetic of `OnlineDepth` (workers/model/depth_attention.py), one pass per token row
 * instead of a handful of tensor operations per use: a decoding step is bound by the number
 * of operations and by the cache misses each one takes after a Transformer sublayer has
 * streamed its weights, not by arithmetic.
 *
 * Rows are tokens (B·T of them), d the model width; every tensor is contiguous. Keys are
 * RMS-normalised, s = q̃ᵀv / hypot(|v|, c) with q̃ = √d·q and c = √(d·ε). Per use u the state
 * is o_u (the softmax-weighted mean of the sources so far) and −lse_u.
 *
 *   init:  −lse_u = −s_u(v) for every use (the first source).
 *   merge: h = lerp(o_u, p, σ(−lse_u + s_u(p))) for one use and a source only it reads.
 *   push:  for the uses u ≥ f, t = s_u(v) − lse_u, o_u ← lerp(base_u, v, σ(t)),
 *          −lse_u ← −lse_u − softplus(t) (the joint softmax, without exponentials that
 *          could overflow).
 *
 * Sums accumulate in double, eight at a time. lerp and softplus follow torch's CPU definitions (lerp's two
 * branches around a weight of ½; softplus linear above its threshold). */

#include <math.h>

#define DEPTH_KERNELS(SUFFIX, T, ACC)                                                         \
    /* Eight independent partial sums: a single running sum would make every addition  \
     * wait for the previous one (the compiler may not reorder floating-point sums). */   \
    static ACC dot_##SUFFIX(const T *a, const T *b, long d) {                              \
        ACC s[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                               \
        long i = 0;                                                                        \
        for (; i + 8 <= d; i += 8)                                                         \
            for (int j = 0; j < 8; ++j) s[j] += (ACC)a[i + j] * (ACC)b[i + j];             \
        for (; i < d; ++i) s[0] += (ACC)a[i] * (ACC)b[i];                                  \
        return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));          \
    }                                                                                      \
                                                                                           \
    static ACC sumsq_##SUFFIX(const T *v, long d) {    return dot_##SUFFIX(v, v, d); }     \
                                                                                           \
    static void lerp_##SUFFIX(const T *start, const T *end, T w, T *out, long d) {         \
        if (fabs((double)w) < 0.5) {                                                       \
            for (long i = 0; i < d; ++i) out[i] = start[i] + w * (end[i] - start[i]);      \
        } else {                                                                           \
            T w1 = (T)1 - w;                                                               \
            for (long i = 0; i < d; ++i) out[i] = end[i] - (end[i] - start[i]) * w1;       \
        }                                                                                  \
    }                                                                                      \
                                                                                           \
    /* nlse (uses, rows) = −s_u(v) for queries q (uses, d): pass the negated queries. */   \
    void depth_init_##SUFFIX(const T *v, const T *q, T *nlse, double c, long uses,         \
                             long rows, long d) {                                          \
        for (long r = 0; r < rows; ++r) {                                                  \
            const T *vr = v + r * d;                                                       \
            T hyp = (T)hypot((double)(T)sqrt(sumsq_##SUFFIX(vr, d)), c);                   \
            for (long u = 0; u < uses; ++u)                                                \
                nlse[u * rows + r] = (T)dot_##SUFFIX(q + u * d, vr, d) / hyp;              \
        }                                                                                  \
    }                                                                                      \
                                                                                           \
    /* out (rows, d) = lerp(o, p, σ(nlse + s(p))) for one query q (d,), nlse (rows,). */   \
    void depth_merge_##SUFFIX(const T *o, const T *p, const T *q, const T *nlse, double c, \
                              T *out, long rows, long d) {                                 \
        for (long r = 0; r < rows; ++r) {                                                  \
            const T *pr = p + r * d;                                                       \
            T hyp = (T)hypot((double)(T)sqrt(sumsq_##SUFFIX(pr, d)), c);                   \
            T t = nlse[r] + (T)dot_##SUFFIX(q, pr, d) / hyp;                               \
            T w = (T)1 / ((T)1 + (T)exp(-(double)t));                                      \
            lerp_##SUFFIX(o + r * d, pr, w, out + r * d, d);                               \
        }                                                                                  \
    }                                                                                      \
                                                                                           \
    /* For k uses: queries q (k, d), state nlse (k, rows) updated in place, o (k, rows, d) \
     * written from base (o itself, or one tensor for every use: base_stride 0). */        \
    void depth_push_##SUFFIX(const T *v, const T *q, T *nlse, const T *base,               \
                             long base_stride, T *o, double c, double threshold, long k,   \
                             long rows, long d) {                                          \
        for (long r = 0; r < rows; ++r) {                                                  \
            const T *vr = v + r * d;                                                       \
            T hyp = (T)hypot((double)(T)sqrt(sumsq_##SUFFIX(vr, d)), c);                   \
            for (long j = 0; j < k; ++j) {                                                 \
                T *n = nlse + j * rows + r;                                                \
                T t = *n + (T)dot_##SUFFIX(q + j * d, vr, d) / hyp;                        \
                T sp = (double)t > threshold ? t : (T)log1p(exp((double)t));               \
                *n -= sp;                                                                  \
                T w = (T)1 / ((T)1 + (T)exp(-(double)t));                                  \
                lerp_##SUFFIX(base + j * base_stride + r * d, vr, w, o + (j * rows + r) * d, \
                              d);                                                          \
            }                                                                              \
        }                                                                                  \
    }

DEPTH_KERNELS(f32, float, float)
DEPTH_KERNELS(f64, double, double)
