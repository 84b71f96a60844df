# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""Compiled pieces of the path-following engine (:mod:`stream_svm.engine`).

BLAS comes from SciPy (``scipy.linalg.cython_blas``), as in scikit-learn's compiled solvers:
no BLAS of our own is linked. Every function works in place on arrays the engine owns and
releases the GIL while it computes.
"""

from scipy.linalg.cython_blas cimport drot, drotg

cdef enum:
    LINEAR = 0
    RBF = 1
    POLY = 2

#: Kernel codes of :func:`kernel_columns`.
KERNEL_LINEAR, KERNEL_RBF, KERNEL_POLY = LINEAR, RBF, POLY


cdef void _delete_factor_column(double[:, ::1] R, Py_ssize_t k, Py_ssize_t j,
                                double* w, double* z) noexcept nogil:
    """Drop column j of the factor in R[:k, :k]; with ``w`` (not NULL) = R^-T 1, apply the same
    rotations to it, after which its first k - 1 entries are the new factor's R^-T 1 (the
    rows of R'w = 1 other than j read H'w = 1 for the factor H without column j, and the
    rotations Q make QH triangular: (QH)'(Qw) = 1). The same for ``z`` = R^-T r (not NULL),
    whose right-hand side r loses its entry j."""
    cdef Py_ssize_t i, c
    cdef int length, stride = 1, one_pair = 1
    cdef double cos, sin, a, b
    # Drop column j: the columns right of it move one to the left (rows 0..k-1). Row i holds
    # zeros left of its diagonal, which stay zeros: its move starts at column i - 1, where its
    # diagonal lands (the subdiagonal entry the rotations below remove).
    for i in range(k):
        for c in range(j if j > i - 1 else i - 1, k - 1):
            R[i, c] = R[i, c + 1]
    # The tail is upper Hessenberg: rotations of rows (i, i + 1) restore the triangle.
    for i in range(j, k - 1):
        a = R[i, i]
        b = R[i + 1, i]
        drotg(&a, &b, &cos, &sin)
        length = <int>(k - 1 - i)
        drot(&length, &R[i, i], &stride, &R[i + 1, i], &stride, &cos, &sin)
        R[i + 1, i] = 0.0
        if w != NULL:
            drot(&one_pair, &w[i], &stride, &w[i + 1], &stride, &cos, &sin)
        if z != NULL:
            drot(&one_pair, &z[i], &stride, &z[i + 1], &stride, &cos, &sin)


def delete_factor_column(double[:, ::1] R, Py_ssize_t k, Py_ssize_t j) -> None:
    """Remove row and column ``j`` of P from the upper Cholesky factor held in ``R[:k, :k]``
    (C order), in place: afterwards ``R[:k-1, :k-1]`` is the factor of P without them.

    Givens rotations keep R'R equal to P minus row/column j (rotations are orthogonal);
    O(k^2) and no allocation.
    """
    if not (0 <= j < k <= R.shape[0] and k <= R.shape[1]):
        raise ValueError(f"column {j} is not in a {k} x {k} factor of capacity {R.shape}")
    with nogil:
        _delete_factor_column(R, k, j, NULL, NULL)


cdef extern from *:
    """
    #include <math.h>
    #include <stdint.h>
    #include <string.h>

    /* The loops over the points, compiled three times where GCC can pick the version at
       load time (x86-64 with glibc, whose loader resolves the choice; not musl): for AVX-512
       (eight doubles per instruction), for AVX2 (four) and for the baseline (SSE2). The same
       operations in the same order per point in each, no fused multiply-add, and no sum
       across points (whose order would follow the width): all three give the same bits. On
       a Fisher window step (|S| ~ 17) AVX-512's version took 7 % less time than AVX2's. */
    #if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__)
    #define STREAM_SVM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
    #else
    #define STREAM_SVM_CLONES
    #endif
    /* GCC vectorizes a loop with a division only if it may compute the division where the
       result is then not selected, which it does not assume while floating-point operations
       may trap. Nothing here reads the exception flags; the values are unchanged. (Clang
       assumes it by default.) */
    #if defined(__GNUC__) && !defined(__clang__)
    #define STREAM_SVM_NO_TRAPS __attribute__((optimize("no-trapping-math")))
    #else
    #define STREAM_SVM_NO_TRAPS
    #endif
    #if defined(_MSC_VER)
    #define STREAM_SVM_RESTRICT __restrict
    #define STREAM_SVM_INLINE static __forceinline
    #else
    #define STREAM_SVM_RESTRICT restrict
    #define STREAM_SVM_INLINE static inline __attribute__((always_inline))
    #endif

    /* One pass over points [begin, end) for ``count`` (at most 4, a constant where it is
       inlined) consecutive features from ``first``, against the point whose feature f is
       query[f * query_stride]: each point's sum continues in feature order. */
    STREAM_SVM_INLINE void stream_svm_features_pass(
            int squared_distance, const double *XT, Py_ssize_t stride, Py_ssize_t first,
            int count, int start_at_zero, Py_ssize_t begin, Py_ssize_t end,
            const double *query, Py_ssize_t query_stride, double *STREAM_SVM_RESTRICT out)
    {
        const double *STREAM_SVM_RESTRICT rows[4];
        double at_p[4];
        Py_ssize_t i;
        int f;
        for (f = 0; f < count; f++) {
            rows[f] = XT + (first + f) * stride;
            at_p[f] = query[(first + f) * query_stride];
        }
        for (i = begin; i < end; i++) {
            double acc = start_at_zero ? 0.0 : out[i];
            for (f = 0; f < count; f++) {
                if (squared_distance) {
                    const double d = rows[f][i] - at_p[f];
                    acc = acc + d * d;
                } else {
                    acc = acc + rows[f][i] * at_p[f];
                }
            }
            out[i] = acc;
        }
    }

    #define STREAM_SVM_PASS(COUNT) \
        if (squared_distance) \
            stream_svm_features_pass(1, XT, stride, f, COUNT, f == 0, begin, end, query, \
                                     query_stride, column); \
        else \
            stream_svm_features_pass(0, XT, stride, f, COUNT, f == 0, begin, end, query, \
                                     query_stride, column); \
        break;

    /* out[c * out_stride + i] = |x_i - q_c|^2 (or <x_i, q_c>) for i < n, the features stored
       feature by feature (XT[f * stride + i]), and q_c the point whose feature f is
       Q[f * q_stride + positions[c]]: a point of XT's own (Q = XT), or a query held apart. Up to four features per
       pass over the points (fewer loads and stores of the sums; more streams at once
       vectorize worse), the count of each pass a constant of its own loop, which then
       vectorizes. Each point's sum runs over the features in order. Several columns are
       computed a block of points at a time, the block's features (about 24 KB) staying in
       the first-level cache for all of them: column by column over all the points, every
       column read all the features again from the second level (at 21 features and 1423
       points, 239 KB per column), which bounded the loop, not its arithmetic. */
    STREAM_SVM_CLONES
    static void stream_svm_features_block(int squared_distance, const double *XT,
                                          Py_ssize_t stride, Py_ssize_t dim, Py_ssize_t n,
                                          const double *Q, Py_ssize_t q_stride,
                                          const long *positions, Py_ssize_t m,
                                          double *out, Py_ssize_t out_stride)
    {
        Py_ssize_t begin, end, c, f, i, block, query_stride = q_stride;
        const double *query;
        double *column;
        block = n;  /* one column: all the points in one block */
        if (m > 1 && dim > 0) {
            block = 3072 / dim;
            block = block < 64 ? 64 : block - block % 8;
        }
        for (begin = 0; begin < n; begin += block) {
            end = n - begin < block ? n : begin + block;
            for (c = 0; c < m; c++) {
                query = Q + positions[c];
                column = out + c * out_stride;
                if (dim == 0) {
                    for (i = begin; i < end; i++) column[i] = 0.0;
                }
                for (f = 0; f < dim; f += 4) {
                    switch (dim - f < 4 ? (int)(dim - f) : 4) {
                        case 1: STREAM_SVM_PASS(1)
                        case 2: STREAM_SVM_PASS(2)
                        case 3: STREAM_SVM_PASS(3)
                        default: STREAM_SVM_PASS(4)
                    }
                }
            }
        }
    }
    #undef STREAM_SVM_PASS

    /* exp for the RBF kernel, vectorized: exp(x) = 2^(k/128) exp(r) with k the integer
       nearest 128 x / ln 2 and |r| <= ln 2 / 256, exp(r) - 1 by its Taylor polynomial of
       degree 5 (truncation below 1e-18), 2^(j/128) from a table of 128 values and their
       relative tails.
       Within 1 ulp of exp, and equal to the C library's for all but about 1 in 1000
       arguments (measured). x <= 0 only (the RBF's -gamma |a - b|^2): below -704 the scale
       is formed 2^1000 too large and corrected after, for results down to the subnormals;
       below -746, 0. The table keeps 2^(j/128)'s bits minus j << 45: adding k << 45 then
       yields 2^(j/128) 2^floor(k/128) with no shift of a signed integer. */
    #define STREAM_SVM_EXP_BITS 7
    #define STREAM_SVM_EXP_N (1 << STREAM_SVM_EXP_BITS)
    /* 2^(j/128) rounded to a double, j = 0..127: its relative tail (2^(j/128) - rounded) /
       rounded, and its bits minus j << 45. Computed once with 60-digit decimal arithmetic (the
       same on every platform: no extended precision needed at import). */
    static const double stream_svm_exp_tails[STREAM_SVM_EXP_N] = {
        0.0, 9.447885451727066e-17, -1.507066976926039e-17, -5.679155082825012e-17,
        4.9997448722726326e-17, -4.823683599994895e-17, 7.357846871247418e-18, 5.773230223741951e-17,
        8.189317638195515e-17, 5.326891139980878e-17, 1.6665881442326747e-18, -1.128113245461828e-17,
        -7.402825309426177e-17, -3.578659767309563e-18, -6.170654745608695e-17, 2.919139999949279e-17,
        -2.7939114859515733e-17, -5.399285355184285e-17, 4.776959425256223e-17, -7.927701432338473e-17,
        9.341710609905046e-17, -5.534520675707472e-17, 4.585670326662351e-17, 2.8582430411116143e-17,
        7.826573258636076e-17, 4.053626906769216e-17, 2.823784425951061e-17, -7.882802262487991e-17,
        3.2904726646008416e-17, -1.5792094703347882e-18, 4.721368121170128e-17, 1.3045277096919659e-17,
        3.3484623336251524e-17, 3.8611199774925664e-17, 5.527550048505249e-17, -3.927184172445234e-17,
        -6.346552106729483e-17, -8.684417614865944e-17, -1.5456342819397733e-17, -8.70763476495455e-17,
        3.750854201303127e-17, -6.616854503526488e-17, -5.346099009198751e-18, -2.443726321015018e-17,
        2.1023049675215714e-18, 7.771067937501065e-17, 1.3357510088834541e-17, 6.938291696959204e-17,
        1.9572585293112036e-17, 6.632256961675804e-17, -5.478069123926778e-17, -4.140839310392624e-17,
        -2.1571477251208752e-17, -3.8287766552120535e-17, 6.663804589232195e-17, 2.3936187400285282e-17,
        5.68648095791174e-17, 1.1264523354521684e-18, 7.007875046906994e-17, -5.0119214278381254e-17,
        -4.8923067513522756e-17, -3.5260089953269434e-17, -6.872303720902018e-17, 5.001446664133532e-18,
        -6.835808657661922e-17, -1.1307344092910212e-17, -8.416011634717156e-18, -2.9247977035436566e-17,
        -2.092304381843353e-17, -3.9778645875427124e-17, -3.833464968654295e-17, 5.763611164480894e-17,
        -2.3591094770850053e-17, 7.260074661098575e-17, 9.50689710108796e-18, -4.272956133839906e-17,
        -6.735219232374683e-17, -2.8396044410430936e-17, -7.226635472101257e-17, 5.786121003395918e-17,
        5.1548301170786783e-17, -9.416257568878152e-18, 2.4253985766689806e-17, -6.604314051707707e-17,
        -6.432131775424189e-18, -1.2204007601863921e-17, -6.336161863401293e-17, -3.7800879246373815e-17,
        1.5341410053603723e-17, 1.2932855580427452e-17, -4.123367330661149e-17, 4.703083974463456e-17,
        -6.152602891550265e-17, 5.827849326195279e-17, 3.540948262646183e-17, -3.2741571320938764e-17,
        4.875160526227062e-17, -5.718569790077838e-17, -4.719539664590972e-18, -5.773451958805706e-17,
        -1.0772487078934056e-17, -6.221808618533911e-17, 1.821405440362259e-17, -6.155536546227639e-17,
        1.685487290628973e-17, 5.3581249177694816e-17, 3.621615935336894e-17, 8.588379527574144e-18,
        1.01562190116415e-17, -2.869134889187244e-17, -5.495118966122005e-17, -5.56965572431627e-17,
        1.790126907604513e-17, -3.2211766346200164e-17, 5.265370768556274e-17, 3.5089866402403033e-17,
        -3.266924100901318e-17, -4.3657593008079375e-17, 1.7963932659833022e-17, 3.4300925275214166e-17,
        -5.545065618639427e-17, -5.149009745457733e-17, 5.336805878514151e-17, 3.498978661192973e-17,
        4.5784915277060095e-17, -5.241934575393899e-17, 2.0414278897578303e-17, 4.124842848606488e-18,
    };
    static const uint64_t stream_svm_exp_scales[STREAM_SVM_EXP_N] = {
        0x3ff0000000000000u, 0x3feff63da9fb3335u, 0x3fefec9a3e778061u, 0x3fefe315e86e7f85u,
        0x3fefd9b0d3158574u, 0x3fefd06b29ddf6deu, 0x3fefc74518759bc8u, 0x3fefbe3ecac6f383u,
        0x3fefb5586cf9890fu, 0x3fefac922b7247f7u, 0x3fefa3ec32d3d1a2u, 0x3fef9b66affed31bu,
        0x3fef9301d0125b51u, 0x3fef8abdc06c31ccu, 0x3fef829aaea92de0u, 0x3fef7a98c8a58e51u,
        0x3fef72b83c7d517bu, 0x3fef6af9388c8deau, 0x3fef635beb6fcb75u, 0x3fef5be084045cd4u,
        0x3fef54873168b9aau, 0x3fef4d5022fcd91du, 0x3fef463b88628cd6u, 0x3fef3f49917ddc96u,
        0x3fef387a6e756238u, 0x3fef31ce4fb2a63fu, 0x3fef2b4565e27cddu, 0x3fef24dfe1f56381u,
        0x3fef1e9df51fdee1u, 0x3fef187fd0dad990u, 0x3fef1285a6e4030bu, 0x3fef0cafa93e2f56u,
        0x3fef06fe0a31b715u, 0x3fef0170fc4cd831u, 0x3feefc08b26416ffu, 0x3feef6c55f929ff1u,
        0x3feef1a7373aa9cbu, 0x3feeecae6d05d866u, 0x3feee7db34e59ff7u, 0x3feee32dc313a8e5u,
        0x3feedea64c123422u, 0x3feeda4504ac801cu, 0x3feed60a21f72e2au, 0x3feed1f5d950a897u,
        0x3feece086061892du, 0x3feeca41ed1d0057u, 0x3feec6a2b5c13cd0u, 0x3feec32af0d7d3deu,
        0x3feebfdad5362a27u, 0x3feebcb299fddd0du, 0x3feeb9b2769d2ca7u, 0x3feeb6daa2cf6642u,
        0x3feeb42b569d4f82u, 0x3feeb1a4ca5d920fu, 0x3feeaf4736b527dau, 0x3feead12d497c7fdu,
        0x3feeab07dd485429u, 0x3feea9268a5946b7u, 0x3feea76f15ad2148u, 0x3feea5e1b976dc09u,
        0x3feea47eb03a5585u, 0x3feea34634ccc320u, 0x3feea23882552225u, 0x3feea155d44ca973u,
        0x3feea09e667f3bcdu, 0x3feea012750bdabfu, 0x3fee9fb23c651a2fu, 0x3fee9f7df9519484u,
        0x3fee9f75e8ec5f74u, 0x3fee9f9a48a58174u, 0x3fee9feb564267c9u, 0x3feea0694fde5d3fu,
        0x3feea11473eb0187u, 0x3feea1ed0130c132u, 0x3feea2f336cf4e62u, 0x3feea427543e1a12u,
        0x3feea589994cce13u, 0x3feea71a4623c7adu, 0x3feea8d99b4492edu, 0x3feeaac7d98a6699u,
        0x3feeace5422aa0dbu, 0x3feeaf3216b5448cu, 0x3feeb1ae99157736u, 0x3feeb45b0b91ffc6u,
        0x3feeb737b0cdc5e5u, 0x3feeba44cbc8520fu, 0x3feebd829fde4e50u, 0x3feec0f170ca07bau,
        0x3feec49182a3f090u, 0x3feec86319e32323u, 0x3feecc667b5de565u, 0x3feed09bec4a2d33u,
        0x3feed503b23e255du, 0x3feed99e1330b358u, 0x3feede6b5579fdbfu, 0x3feee36bbfd3f37au,
        0x3feee89f995ad3adu, 0x3feeee07298db666u, 0x3feef3a2b84f15fbu, 0x3feef9728de5593au,
        0x3feeff76f2fb5e47u, 0x3fef05b030a1064au, 0x3fef0c1e904bc1d2u, 0x3fef12c25bd71e09u,
        0x3fef199bdd85529cu, 0x3fef20ab5fffd07au, 0x3fef27f12e57d14bu, 0x3fef2f6d9406e7b5u,
        0x3fef3720dcef9069u, 0x3fef3f0b555dc3fau, 0x3fef472d4a07897cu, 0x3fef4f87080d89f2u,
        0x3fef5818dcfba487u, 0x3fef60e316c98398u, 0x3fef69e603db3285u, 0x3fef7321f301b460u,
        0x3fef7c97337b9b5fu, 0x3fef864614f5a129u, 0x3fef902ee78b3ff6u, 0x3fef9a51fbc74c83u,
        0x3fefa4afa2a490dau, 0x3fefaf482d8e67f1u, 0x3fefba1bee615a27u, 0x3fefc52b376bba97u,
        0x3fefd0765b6e4540u, 0x3fefdbfdad9cbe14u, 0x3fefe7c1819e90d8u, 0x3feff3c22b8f71f1u,
    };
    /* Per j: the tail, then the bits (in a double: the loop below vectorizes with one table
       of doubles, not with a second table of integers). */
    static double stream_svm_exp_table[2 * STREAM_SVM_EXP_N];

    /* column[i] = exp(-gamma column[i]) for i < n (column: squared distances), portable:
       compilers vectorize it, but its table lookups become one load per lane. */
    STREAM_SVM_CLONES STREAM_SVM_NO_TRAPS
    static void stream_svm_rbf_values_portable(Py_ssize_t n, double gamma,
                                               double *STREAM_SVM_RESTRICT column)
    {
        const double inv_ln2_n = 1.4426950408889634 * STREAM_SVM_EXP_N;  /* 128 / ln 2 */
        const double shift = 6755399441055744.0;  /* 1.5 2^52: adding it rounds to an integer */
        /* ln 2 / 128 in two parts, the first with trailing zeros: k times it is exact */
        const double neg_ln2_hi_n = -0.005415212348111709;
        const double neg_ln2_lo_n = -1.2864023111638346e-14;
        const double c2 = 1.0 / 2.0, c3 = 1.0 / 6.0, c4 = 1.0 / 24.0, c5 = 1.0 / 120.0;
        Py_ssize_t i;
        for (i = 0; i < n; i++) {
            const double product = -gamma * column[i];
            const double x = product < -746.0 ? -746.0 : product;
            const int tiny = x < -704.0;
            double k = x * inv_ln2_n + shift, r, r2, scale, tail, sum;
            uint64_t k_bits, table_bits, scale_bits;
            memcpy(&k_bits, &k, sizeof k_bits);
            k -= shift;
            r = x + k * neg_ln2_hi_n + k * neg_ln2_lo_n;
            tail = stream_svm_exp_table[2 * (k_bits & (STREAM_SVM_EXP_N - 1))];
            memcpy(&table_bits, &stream_svm_exp_table[2 * (k_bits & (STREAM_SVM_EXP_N - 1)) + 1],
                   sizeof table_bits);
            scale_bits = table_bits + (k_bits << (52 - STREAM_SVM_EXP_BITS))
                         + (tiny ? (uint64_t)1000 << 52 : 0);
            memcpy(&scale, &scale_bits, sizeof scale);
            r2 = r * r;
            sum = tail + r + r2 * (c2 + r * c3) + r2 * r2 * (c4 + r * c5);
            column[i] = (scale + scale * sum) * (tiny ? 9.332636185032189e-302 : 1.0);  /* 2^-1000 */
        }
    }

    /* The same operations, eight points at a time with AVX-512, the table read by gather
       instructions (GCC does not emit them here for Intel processors): the same bits as the
       portable loop, in under half its time. x86-64 with GCC or Clang only; chosen at import
       when the processor has AVX-512F. */
    #if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
    #include <immintrin.h>
    #define STREAM_SVM_GATHER_EXP 1
    __attribute__((target("avx512f"))) STREAM_SVM_NO_TRAPS
    static void stream_svm_rbf_values_avx512(Py_ssize_t n, double gamma, double *column)
    {
        const __m512d neg_gamma = _mm512_set1_pd(-gamma);
        const __m512d lowest = _mm512_set1_pd(-746.0), tiny_below = _mm512_set1_pd(-704.0);
        const __m512d inv_ln2_n = _mm512_set1_pd(1.4426950408889634 * STREAM_SVM_EXP_N);
        const __m512d shift = _mm512_set1_pd(6755399441055744.0);
        const __m512d neg_ln2_hi_n = _mm512_set1_pd(-0.005415212348111709);
        const __m512d neg_ln2_lo_n = _mm512_set1_pd(-1.2864023111638346e-14);
        const __m512d c2 = _mm512_set1_pd(1.0 / 2.0), c3 = _mm512_set1_pd(1.0 / 6.0);
        const __m512d c4 = _mm512_set1_pd(1.0 / 24.0), c5 = _mm512_set1_pd(1.0 / 120.0);
        const __m512d one = _mm512_set1_pd(1.0);
        const __m512d two_m1000 = _mm512_set1_pd(9.332636185032189e-302);
        const __m512i index_mask = _mm512_set1_epi64(STREAM_SVM_EXP_N - 1);
        const __m512i thousand = _mm512_set1_epi64((long long)((uint64_t)1000 << 52));
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const __m512d product = _mm512_mul_pd(neg_gamma, _mm512_loadu_pd(column + i));
            const __m512d x = _mm512_mask_blend_pd(
                _mm512_cmp_pd_mask(product, lowest, _CMP_LT_OQ), product, lowest);
            const __mmask8 tiny = _mm512_cmp_pd_mask(x, tiny_below, _CMP_LT_OQ);
            __m512d k = _mm512_add_pd(_mm512_mul_pd(x, inv_ln2_n), shift);
            const __m512i k_bits = _mm512_castpd_si512(k);
            __m512d r, r2, tail, scale, sum;
            __m512i at, scale_bits;
            k = _mm512_sub_pd(k, shift);
            r = _mm512_add_pd(_mm512_add_pd(x, _mm512_mul_pd(k, neg_ln2_hi_n)),
                              _mm512_mul_pd(k, neg_ln2_lo_n));
            at = _mm512_slli_epi64(_mm512_and_si512(k_bits, index_mask), 1);
            tail = _mm512_i64gather_pd(at, stream_svm_exp_table, 8);
            scale_bits = _mm512_castpd_si512(_mm512_i64gather_pd(at, stream_svm_exp_table + 1, 8));
            scale_bits = _mm512_add_epi64(
                _mm512_add_epi64(scale_bits, _mm512_slli_epi64(k_bits, 52 - STREAM_SVM_EXP_BITS)),
                _mm512_maskz_mov_epi64(tiny, thousand));
            scale = _mm512_castsi512_pd(scale_bits);
            r2 = _mm512_mul_pd(r, r);
            sum = _mm512_add_pd(
                _mm512_add_pd(_mm512_add_pd(tail, r),
                              _mm512_mul_pd(r2, _mm512_add_pd(c2, _mm512_mul_pd(r, c3)))),
                _mm512_mul_pd(_mm512_mul_pd(r2, r2), _mm512_add_pd(c4, _mm512_mul_pd(r, c5))));
            _mm512_storeu_pd(column + i, _mm512_mul_pd(
                _mm512_add_pd(scale, _mm512_mul_pd(scale, sum)),
                _mm512_mask_blend_pd(tiny, one, two_m1000)));
        }
        stream_svm_rbf_values_portable(n - i, gamma, column + i);
    }
    #else
    #define STREAM_SVM_GATHER_EXP 0
    #endif

    static void (*stream_svm_rbf_values_chosen)(Py_ssize_t, double, double *) =
        stream_svm_rbf_values_portable;

    /* column[i] = exp(-gamma column[i]) for i < n (column: squared distances). */
    static void stream_svm_rbf_values(Py_ssize_t n, double gamma, double *column)
    {
        stream_svm_rbf_values_chosen(n, gamma, column);
    }

    /* Which implementation stream_svm_rbf_values uses: 1 the gathers', 0 the portable one. */
    static int stream_svm_rbf_values_gathers(void)
    {
        return stream_svm_rbf_values_chosen != stream_svm_rbf_values_portable;
    }

    /* Whether a point whose g moves at rate ``value`` has an event (see
       stream_svm_point_events), and in ``flipping`` whether that event is a flip. */
    STREAM_SVM_INLINE long stream_svm_has_event(
            double value, signed char state, unsigned char blocked, double gap, double tol_g,
            signed char error_code, signed char reserve_code, signed char adding_code,
            long *flipping)
    {
        const long reserve = state == reserve_code;
        const long up = value > tol_g;
        *flipping = reserve & up & (gap < INFINITY);
        return ((((state == error_code) | (state == adding_code)) & up)
                | (reserve & (value < -tol_g)) | *flipping) & (blocked == 0);
    }

    /* A breakpoint's pass over the points (see _follow): g's sensitivities
       change_i = y_i value_i, where value is (change + driven) + db (mode 0, with a margin
       set), db (mode 1, a bias-only step) or driven (mode 2), and each point's step to its
       event, INFINITY for none: error and added points rising to the margin, reserve points
       falling to it or rising to their other side (a flip, where the gap is finite); blocked
       points have none. Branch-free, so that it vectorizes: every point's quotient is
       computed and the point's own kept. Returns the smallest step. */
    STREAM_SVM_CLONES STREAM_SVM_NO_TRAPS
    static double stream_svm_point_events_portable(
            Py_ssize_t n, int mode, double db, const double *STREAM_SVM_RESTRICT y,
            const double *STREAM_SVM_RESTRICT driven, double *STREAM_SVM_RESTRICT change,
            const signed char *STREAM_SVM_RESTRICT status,
            const unsigned char *STREAM_SVM_RESTRICT blocked,
            const double *STREAM_SVM_RESTRICT gap, const double *STREAM_SVM_RESTRICT g,
            double tol_g, signed char error_code, signed char reserve_code,
            signed char adding_code, double *STREAM_SVM_RESTRICT point_eta)
    {
        Py_ssize_t i;
        const double infinity = INFINITY;
        int64_t lowest, bits;
        double result;
        if (mode == 0) {
            for (i = 0; i < n; i++) change[i] = y[i] * ((change[i] + driven[i]) + db);
        } else if (mode == 1) {
            for (i = 0; i < n; i++) change[i] = y[i] * db;
        } else {
            for (i = 0; i < n; i++) change[i] = y[i] * driven[i];
        }
        for (i = 0; i < n; i++) {
            const double value = change[i];
            long flipping;
            const long event = stream_svm_has_event(value, status[i], blocked[i], gap[i], tol_g,
                                                    error_code, reserve_code, adding_code,
                                                    &flipping);
            double step = (flipping ? gap[i] - g[i] : -g[i]) / value;
            step = step <= 0.0 ? 0.0 : step;  /* -0.0 too */
            point_eta[i] = event ? step : INFINITY;
        }
        /* The smallest step. Steps are +0.0, positive or INFINITY (never NaN: an event's value
           is not 0), and such doubles order as their bits do as integers, whose minimum
           vectorizes (a double's does not, for NaN's sake). */
        memcpy(&lowest, &infinity, sizeof lowest);
        for (i = 0; i < n; i++) {
            memcpy(&bits, &point_eta[i], sizeof bits);
            lowest = bits < lowest ? bits : lowest;
        }
        memcpy(&result, &lowest, sizeof result);
        return result;
    }

    /* The same pass, eight points at a time with AVX-512, in one sweep (sensitivities, events,
       smallest step) instead of three, and the points' states widened to the doubles' lanes
       one instruction per eight (GCC's own vectorization of the portable loop widened them
       in three steps, on half-width vectors): the same operations on every point, so the
       same bits, in about half the time (1.0 us instead of 2.0 us on 1423 points). */
    #if STREAM_SVM_GATHER_EXP
    __attribute__((target("avx512f"))) STREAM_SVM_NO_TRAPS
    static double stream_svm_point_events_avx512(
            Py_ssize_t n, int mode, double db, const double *y, const double *driven,
            double *change, const signed char *status, const unsigned char *blocked,
            const double *gap, const double *g, double tol_g, signed char error_code,
            signed char reserve_code, signed char adding_code, double *point_eta)
    {
        const __m512d tol = _mm512_set1_pd(tol_g), neg_tol = _mm512_set1_pd(-tol_g);
        const __m512d infinity = _mm512_set1_pd(INFINITY), zero = _mm512_setzero_pd();
        const __m512d shift = _mm512_set1_pd(db);
        const __m512i error = _mm512_set1_epi64(error_code);
        const __m512i reserve_state = _mm512_set1_epi64(reserve_code);
        const __m512i adding = _mm512_set1_epi64(adding_code);
        const __m512i none = _mm512_setzero_si512();
        const __m512i sign = _mm512_set1_epi64(INT64_MIN);
        __m512i lowest = _mm512_castpd_si512(infinity);
        Py_ssize_t i = 0;
        int64_t lowest_bits, rest_bits;
        double rest;
        for (; i + 8 <= n; i += 8) {
            __m512d value, step;
            __m512i state, refused;
            __m512d gaps, gs;
            __mmask8 up, down, reserve, rises, flipping, event;
            if (mode == 0)
                value = _mm512_mul_pd(_mm512_loadu_pd(y + i), _mm512_add_pd(_mm512_add_pd(
                    _mm512_loadu_pd(change + i), _mm512_loadu_pd(driven + i)), shift));
            else if (mode == 1)
                value = _mm512_mul_pd(_mm512_loadu_pd(y + i), shift);
            else
                value = _mm512_mul_pd(_mm512_loadu_pd(y + i), _mm512_loadu_pd(driven + i));
            _mm512_storeu_pd(change + i, value);
            state = _mm512_cvtepi8_epi64(_mm_loadl_epi64((const __m128i *)(status + i)));
            refused = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)(blocked + i)));
            gaps = _mm512_loadu_pd(gap + i);
            gs = _mm512_loadu_pd(g + i);
            /* stream_svm_has_event, lane by lane */
            up = _mm512_cmp_pd_mask(value, tol, _CMP_GT_OQ);
            down = _mm512_cmp_pd_mask(value, neg_tol, _CMP_LT_OQ);
            reserve = _mm512_cmpeq_epi64_mask(state, reserve_state);
            rises = _mm512_cmpeq_epi64_mask(state, error) | _mm512_cmpeq_epi64_mask(state, adding);
            flipping = reserve & up & _mm512_cmp_pd_mask(gaps, infinity, _CMP_LT_OQ);
            event = ((rises & up) | (reserve & down) | flipping)
                    & _mm512_cmpeq_epi64_mask(refused, none);
            /* (flipping ? gap - g : -g) / value, clamped below at +0.0; -g by its sign bit,
               as the portable loop's negation (0 - g would differ for a NaN's sign) */
            step = _mm512_div_pd(
                _mm512_mask_sub_pd(_mm512_castsi512_pd(_mm512_xor_si512(_mm512_castpd_si512(gs),
                                                                        sign)),
                                   flipping, gaps, gs),
                value);
            step = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(step, zero, _CMP_LE_OQ), step, zero);
            step = _mm512_mask_blend_pd(event, infinity, step);
            _mm512_storeu_pd(point_eta + i, step);
            lowest = _mm512_min_epi64(lowest, _mm512_castpd_si512(step));
        }
        lowest_bits = _mm512_reduce_min_epi64(lowest);
        if (i < n) {
            /* the last points' smallest, merged as the portable loop orders steps: by bits */
            rest = stream_svm_point_events_portable(
                n - i, mode, db, y + i, driven + i, change + i, status + i, blocked + i, gap + i,
                g + i, tol_g, error_code, reserve_code, adding_code, point_eta + i);
            memcpy(&rest_bits, &rest, sizeof rest_bits);
            lowest_bits = rest_bits < lowest_bits ? rest_bits : lowest_bits;
        }
        memcpy(&rest, &lowest_bits, sizeof rest);
        return rest;
    }
    #endif

    static double (*stream_svm_point_events_chosen)(
            Py_ssize_t, int, double, const double *, const double *, double *,
            const signed char *, const unsigned char *, const double *, const double *, double,
            signed char, signed char, signed char, double *) = stream_svm_point_events_portable;

    static double stream_svm_point_events(
            Py_ssize_t n, int mode, double db, const double *y, const double *driven,
            double *change, const signed char *status, const unsigned char *blocked,
            const double *gap, const double *g, double tol_g, signed char error_code,
            signed char reserve_code, signed char adding_code, double *point_eta)
    {
        return stream_svm_point_events_chosen(n, mode, db, y, driven, change, status, blocked,
                                              gap, g, tol_g, error_code, reserve_code,
                                              adding_code, point_eta);
    }

    /* The first i in [start, n) with values[i] <= bound, n if none: the search for the events
       at a breakpoint's step (one or two among a thousand points, the rest far above it). */
    static Py_ssize_t stream_svm_next_at_most_portable(Py_ssize_t start, Py_ssize_t n,
                                                       const double *values, double bound)
    {
        Py_ssize_t i;
        for (i = start; i < n; i++)
            if (values[i] <= bound) return i;
        return n;
    }

    /* The same, eight values per comparison: a fifth of the scalar loop's time. */
    #if STREAM_SVM_GATHER_EXP
    __attribute__((target("avx512f")))
    static Py_ssize_t stream_svm_next_at_most_avx512(Py_ssize_t start, Py_ssize_t n,
                                                     const double *values, double bound)
    {
        const __m512d limit = _mm512_set1_pd(bound);
        Py_ssize_t i = start;
        __mmask8 found;
        for (; i + 8 <= n; i += 8) {
            found = _mm512_cmp_pd_mask(_mm512_loadu_pd(values + i), limit, _CMP_LE_OQ);
            if (found) return i + __builtin_ctz(found);
        }
        return stream_svm_next_at_most_portable(i, n, values, bound);
    }
    #endif

    static Py_ssize_t (*stream_svm_next_at_most_chosen)(Py_ssize_t, Py_ssize_t, const double *,
                                                        double) =
        stream_svm_next_at_most_portable;

    static Py_ssize_t stream_svm_next_at_most(Py_ssize_t start, Py_ssize_t n,
                                              const double *values, double bound)
    {
        return stream_svm_next_at_most_chosen(start, n, values, bound);
    }

    /* At import: exp's table, and the loops chosen for this processor. */
    static void stream_svm_init(void)
    {
        int j;
        for (j = 0; j < STREAM_SVM_EXP_N; j++) {
            stream_svm_exp_table[2 * j] = stream_svm_exp_tails[j];
            memcpy(&stream_svm_exp_table[2 * j + 1], &stream_svm_exp_scales[j], sizeof(double));
        }
    #if STREAM_SVM_GATHER_EXP
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f")) {
            stream_svm_rbf_values_chosen = stream_svm_rbf_values_avx512;
            stream_svm_point_events_chosen = stream_svm_point_events_avx512;
            stream_svm_next_at_most_chosen = stream_svm_next_at_most_avx512;
        }
    #endif
    }

    /* The largest |change| among the points that have an event (the scale of ties). */
    static double stream_svm_largest_sensitivity(
            Py_ssize_t n, const double *change, const signed char *status,
            const unsigned char *blocked, const double *gap, double tol_g,
            signed char error_code, signed char reserve_code, signed char adding_code)
    {
        Py_ssize_t i;
        long flipping;
        double largest = 0.0;
        for (i = 0; i < n; i++) {
            if (stream_svm_has_event(change[i], status[i], blocked[i], gap[i], tol_g, error_code,
                                     reserve_code, adding_code, &flipping)
                    && fabs(change[i]) > largest)
                largest = fabs(change[i]);
        }
        return largest;
    }

    /* out[i] = sum over s < k of beta[s] columns[s * lda + i], i < n: S's kernel columns
       times its coefficients' direction, the largest product of a breakpoint. Eight columns
       per pass over the points (then four, then one): the points' sums stay in registers
       for eight columns and the eight streams are read once each, a fifth to a quarter
       faster here than the BLAS's matrix-vector kernel on this layout; and each point's
       sum is grouped the same way on every processor, where a BLAS picks its kernel (and
       its order of additions) by processor. */
    #define STREAM_SVM_SUM8(i) \
        (((b0 * c0[i] + b1 * c1[i]) + (b2 * c2[i] + b3 * c3[i])) \
         + ((b4 * c4[i] + b5 * c5[i]) + (b6 * c6[i] + b7 * c7[i])))
    #define STREAM_SVM_SUM4(i) ((b0 * c0[i] + b1 * c1[i]) + (b2 * c2[i] + b3 * c3[i]))
    STREAM_SVM_CLONES
    static void stream_svm_columns_times(Py_ssize_t n, Py_ssize_t k, const double *columns,
                                         Py_ssize_t lda, const double *beta,
                                         double *STREAM_SVM_RESTRICT out)
    {
        Py_ssize_t s = 0, i;
        int started = 0;
        for (; s + 8 <= k; s += 8) {
            const double *STREAM_SVM_RESTRICT c0 = columns + s * lda;
            const double *STREAM_SVM_RESTRICT c1 = c0 + lda;
            const double *STREAM_SVM_RESTRICT c2 = c1 + lda;
            const double *STREAM_SVM_RESTRICT c3 = c2 + lda;
            const double *STREAM_SVM_RESTRICT c4 = c3 + lda;
            const double *STREAM_SVM_RESTRICT c5 = c4 + lda;
            const double *STREAM_SVM_RESTRICT c6 = c5 + lda;
            const double *STREAM_SVM_RESTRICT c7 = c6 + lda;
            const double b0 = beta[s], b1 = beta[s + 1], b2 = beta[s + 2], b3 = beta[s + 3];
            const double b4 = beta[s + 4], b5 = beta[s + 5], b6 = beta[s + 6];
            const double b7 = beta[s + 7];
            if (started) {
                for (i = 0; i < n; i++) out[i] = out[i] + STREAM_SVM_SUM8(i);
            } else {
                for (i = 0; i < n; i++) out[i] = STREAM_SVM_SUM8(i);
            }
            started = 1;
        }
        for (; s + 4 <= k; s += 4) {
            const double *STREAM_SVM_RESTRICT c0 = columns + s * lda;
            const double *STREAM_SVM_RESTRICT c1 = c0 + lda;
            const double *STREAM_SVM_RESTRICT c2 = c1 + lda;
            const double *STREAM_SVM_RESTRICT c3 = c2 + lda;
            const double b0 = beta[s], b1 = beta[s + 1], b2 = beta[s + 2], b3 = beta[s + 3];
            if (started) {
                for (i = 0; i < n; i++) out[i] = out[i] + STREAM_SVM_SUM4(i);
            } else {
                for (i = 0; i < n; i++) out[i] = STREAM_SVM_SUM4(i);
            }
            started = 1;
        }
        for (; s < k; s++) {
            const double *STREAM_SVM_RESTRICT c0 = columns + s * lda;
            const double b0 = beta[s];
            if (started) {
                for (i = 0; i < n; i++) out[i] = out[i] + b0 * c0[i];
            } else {
                for (i = 0; i < n; i++) out[i] = b0 * c0[i];
            }
            started = 1;
        }
        if (!started) {
            for (i = 0; i < n; i++) out[i] = 0.0;
        }
    }
    #undef STREAM_SVM_SUM8
    #undef STREAM_SVM_SUM4

    /* The sums of refresh_g: g_i = sum_S K(x_i, x_s) y_s alpha_s and
       terms_i = sum_S |K(x_i, x_s)| alpha_s, S's members in factor order, four columns per
       pass over the points and one at a time after, each point's additions in that order
       (``store`` gives each member's row of ``columns``). */
    STREAM_SVM_CLONES
    static void stream_svm_margin_sums(Py_ssize_t n, Py_ssize_t k, const double *columns,
                                       Py_ssize_t lda, const long *store, const long *margin,
                                       const double *alpha, const double *y,
                                       double *STREAM_SVM_RESTRICT g,
                                       double *STREAM_SVM_RESTRICT terms)
    {
        Py_ssize_t j = 0, i;
        for (i = 0; i < n; i++) {
            g[i] = 0.0;
            terms[i] = 0.0;
        }
        for (; j + 4 <= k; j += 4) {
            const double *STREAM_SVM_RESTRICT c0 = columns + store[j] * lda;
            const double *STREAM_SVM_RESTRICT c1 = columns + store[j + 1] * lda;
            const double *STREAM_SVM_RESTRICT c2 = columns + store[j + 2] * lda;
            const double *STREAM_SVM_RESTRICT c3 = columns + store[j + 3] * lda;
            const double w0 = alpha[margin[j]], w1 = alpha[margin[j + 1]];
            const double w2 = alpha[margin[j + 2]], w3 = alpha[margin[j + 3]];
            const double a0 = y[margin[j]] * w0, a1 = y[margin[j + 1]] * w1;
            const double a2 = y[margin[j + 2]] * w2, a3 = y[margin[j + 3]] * w3;
            for (i = 0; i < n; i++) {
                double value = g[i] + c0[i] * a0;
                double size = terms[i] + fabs(c0[i]) * w0;
                value = value + c1[i] * a1;
                value = value + c2[i] * a2;
                g[i] = value + c3[i] * a3;
                size = size + fabs(c1[i]) * w1;
                size = size + fabs(c2[i]) * w2;
                terms[i] = size + fabs(c3[i]) * w3;
            }
        }
        for (; j < k; j++) {
            const double *STREAM_SVM_RESTRICT c0 = columns + store[j] * lda;
            const double w0 = alpha[margin[j]];
            const double a0 = y[margin[j]] * w0;
            for (i = 0; i < n; i++) {
                g[i] = g[i] + c0[i] * a0;
                terms[i] = terms[i] + fabs(c0[i]) * w0;
            }
        }
    }

    /* h += weight * column (a point joining E) or -= (leaving), with h's size h_abs (not
       below 0) and its round-off bound h_drift: compiled with the other loops over the
       points (the Cython loop ran two values per instruction). */
    STREAM_SVM_CLONES
    static void stream_svm_move_error_column(Py_ssize_t n, const double *column, double weight,
                                             double C, int joining,
                                             double *STREAM_SVM_RESTRICT h,
                                             double *STREAM_SVM_RESTRICT h_abs,
                                             double *STREAM_SVM_RESTRICT h_drift)
    {
        Py_ssize_t i;
        if (joining) {
            for (i = 0; i < n; i++) {
                const double value = column[i], size = fabs(value) * C;
                h[i] += value * weight;
                h_abs[i] += size;
                h_drift[i] += size;
            }
        } else {
            for (i = 0; i < n; i++) {
                const double value = column[i], size = fabs(value) * C;
                const double shrunk = h_abs[i] - size;
                h[i] -= value * weight;
                h_abs[i] = shrunk > 0.0 ? shrunk : 0.0;
                h_drift[i] += size;
            }
        }
    }

    /* sums[i] += row[i] * weight and sizes[i] += |row[i]|, i < n. */
    STREAM_SVM_CLONES
    static void stream_svm_accumulate_column(Py_ssize_t n, const double *row, double weight,
                                             double *STREAM_SVM_RESTRICT sums,
                                             double *STREAM_SVM_RESTRICT sizes)
    {
        Py_ssize_t i;
        for (i = 0; i < n; i++) {
            sums[i] += row[i] * weight;
            sizes[i] += fabs(row[i]);
        }
    }

    /* After a step: g moves along its sensitivities and, unless the step moved b alone, the
       driven contribution shrinks by the same factor as the driven moves. */
    STREAM_SVM_CLONES
    static void stream_svm_take_step(Py_ssize_t n, double step, int scale_driven,
                                     const double *STREAM_SVM_RESTRICT change,
                                     double *STREAM_SVM_RESTRICT g,
                                     double *STREAM_SVM_RESTRICT driven)
    {
        Py_ssize_t i;
        const double remaining = 1.0 - step;
        for (i = 0; i < n; i++) g[i] += step * change[i];
        if (scale_driven) {
            for (i = 0; i < n; i++) driven[i] *= remaining;
        }
    }

    /* The factor's triangular solves and the dot products of S's size, in place of the
       BLAS's: at the sizes of S here (tens to hundreds) a BLAS call's dispatch and blocking
       cost more than its arithmetic (at |S| ~ 100, 6-8 % of a Fisher learn_one point went
       to the BLAS's short dot products inside its triangular solve), and the order of the
       additions is fixed here, the same on every processor, where a BLAS picks its kernels
       by processor. R is S's factor, upper triangular, row i at R + i * lda (P = R'R). */

    /* sum over j < k of a[j] b[j]: eight partial sums (a stride of eight each), combined in
       a fixed order, then the tail. */
    STREAM_SVM_CLONES
    static double stream_svm_dot(Py_ssize_t k, const double *STREAM_SVM_RESTRICT a,
                                 const double *STREAM_SVM_RESTRICT b)
    {
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0, s4 = 0.0, s5 = 0.0, s6 = 0.0;
        double s7 = 0.0, sum;
        Py_ssize_t j = 0;
        for (; j + 8 <= k; j += 8) {
            s0 += a[j] * b[j];
            s1 += a[j + 1] * b[j + 1];
            s2 += a[j + 2] * b[j + 2];
            s3 += a[j + 3] * b[j + 3];
            s4 += a[j + 4] * b[j + 4];
            s5 += a[j + 5] * b[j + 5];
            s6 += a[j + 6] * b[j + 6];
            s7 += a[j + 7] * b[j + 7];
        }
        sum = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
        for (; j < k; j++) sum += a[j] * b[j];
        return sum;
    }

    /* x <- R^-T x (forward substitution, R' lower triangular): each solved entry is taken
       out of the later ones along R's contiguous row. */
    STREAM_SVM_CLONES
    static void stream_svm_solve_transposed(Py_ssize_t k, const double *R, Py_ssize_t lda,
                                            double *STREAM_SVM_RESTRICT x)
    {
        Py_ssize_t i, j;
        for (j = 0; j < k; j++) {
            const double *STREAM_SVM_RESTRICT row = R + j * lda;
            const double solved = x[j] / row[j];
            x[j] = solved;
            for (i = j + 1; i < k; i++) x[i] -= row[i] * solved;
        }
    }

    /* x <- R^-1 x (back substitution), four rows at a time from the last: their dot products
       with the entries solved already (along R's contiguous rows, eight partial sums each,
       combined in a fixed order), in one pass, then the four entries in turn. One row's dot
       product at a time waited on its additions' latency: short rows, no overlap. */
    STREAM_SVM_CLONES
    static void stream_svm_solve(Py_ssize_t k, const double *R, Py_ssize_t lda,
                                 double *STREAM_SVM_RESTRICT x)
    {
        Py_ssize_t top, j, r, end = k;
        int l;
        while (end > 0) {
            const Py_ssize_t rows = end < 4 ? end : 4;
            double sums[4][8], total[4];
            top = end - rows;  /* rows [top, end) use x[end:] solved already */
            for (r = 0; r < 4; r++)
                for (l = 0; l < 8; l++) sums[r][l] = 0.0;
            for (j = end; j + 8 <= k; j += 8) {
                for (r = 0; r < rows; r++) {
                    const double *STREAM_SVM_RESTRICT row = R + (top + r) * lda + j;
                    for (l = 0; l < 8; l++) sums[r][l] += row[l] * x[j + l];
                }
            }
            for (r = 0; r < rows; r++) {
                const double *row = R + (top + r) * lda;
                Py_ssize_t tail;
                total[r] = ((sums[r][0] + sums[r][1]) + (sums[r][2] + sums[r][3]))
                           + ((sums[r][4] + sums[r][5]) + (sums[r][6] + sums[r][7]));
                for (tail = j; tail < k; tail++) total[r] += row[tail] * x[tail];
            }
            for (r = rows - 1; r >= 0; r--) {
                const double *row = R + (top + r) * lda;
                double value = x[top + r] - total[r];
                Py_ssize_t c;
                for (c = top + r + 1; c < end; c++) value -= row[c] * x[c];
                x[top + r] = value / row[top + r];
            }
            end = top;
        }
    }

    /* (gamma v + coef0)^degree in place for n values, degree >= 1: by repeated squaring, 256
       values at a time (each pass over them vectorizes), the same multiplications in the same
       order for every value whatever the vector width. Its rounding error grows with the
       degree (measured against pow: 1 ulp at degree 3, 8 at 13, 46 at 64), as a power of the
       base's own rounding does; pow took about 10 ns a value, five times the rest of a
       polynomial column at 20 features. */
    STREAM_SVM_CLONES
    static void stream_svm_poly_values(Py_ssize_t n, double gamma, double coef0, long degree,
                                       double *STREAM_SVM_RESTRICT values)
    {
        double base[256];
        Py_ssize_t start, i, m;
        long e;
        int first;
        for (start = 0; start < n; start += 256) {
            double *STREAM_SVM_RESTRICT v = values + start;
            m = n - start < 256 ? n - start : 256;
            for (i = 0; i < m; i++) base[i] = gamma * v[i] + coef0;
            first = 1;
            for (e = degree; e > 0; e >>= 1) {
                if (e & 1) {
                    if (first) {
                        for (i = 0; i < m; i++) v[i] = base[i];
                    } else {
                        for (i = 0; i < m; i++) v[i] = v[i] * base[i];
                    }
                    first = 0;
                }
                if (e > 1) {
                    for (i = 0; i < m; i++) base[i] = base[i] * base[i];
                }
            }
        }
    }

    /* y[i] += a x[i] for i < n: each element's one multiplication and one addition, the
       same bits at every vector width (no fused multiply-add: see setup.py). */
    STREAM_SVM_CLONES
    static void stream_svm_axpy(Py_ssize_t n, double a, const double *STREAM_SVM_RESTRICT x,
                                double *STREAM_SVM_RESTRICT y)
    {
        Py_ssize_t i;
        for (i = 0; i < n; i++) y[i] = y[i] + a * x[i];
    }

    """
    double stream_svm_dot(Py_ssize_t k, const double* a, const double* b) noexcept nogil
    void stream_svm_axpy(Py_ssize_t n, double a, const double* x, double* y) noexcept nogil
    void stream_svm_poly_values(Py_ssize_t n, double gamma, double coef0, long degree,
                                double* values) noexcept nogil
    void stream_svm_solve_transposed(Py_ssize_t k, const double* R, Py_ssize_t lda,
                                     double* x) noexcept nogil
    void stream_svm_solve(Py_ssize_t k, const double* R, Py_ssize_t lda, double* x) noexcept nogil
    void stream_svm_features_block(int squared_distance, const double* XT, Py_ssize_t stride,
                                   Py_ssize_t dim, Py_ssize_t n, const double* Q,
                                   Py_ssize_t q_stride, const long* positions,
                                   Py_ssize_t m, double* out, Py_ssize_t out_stride) noexcept nogil
    double stream_svm_point_events(Py_ssize_t n, int mode, double db, const double* y,
                                   const double* driven, double* change,
                                   const signed char* status, const unsigned char* blocked,
                                   const double* gap, const double* g, double tol_g,
                                   signed char error_code, signed char reserve_code,
                                   signed char adding_code, double* point_eta) noexcept nogil
    double stream_svm_point_events_portable(
        Py_ssize_t n, int mode, double db, const double* y, const double* driven,
        double* change, const signed char* status, const unsigned char* blocked,
        const double* gap, const double* g, double tol_g, signed char error_code,
        signed char reserve_code, signed char adding_code, double* point_eta) noexcept nogil
    Py_ssize_t stream_svm_next_at_most(Py_ssize_t start, Py_ssize_t n, const double* values,
                                       double bound) noexcept nogil
    Py_ssize_t stream_svm_next_at_most_portable(Py_ssize_t start, Py_ssize_t n,
                                                const double* values, double bound) noexcept nogil
    void stream_svm_columns_times(Py_ssize_t n, Py_ssize_t k, const double* columns,
                                  Py_ssize_t lda, const double* beta, double* out) noexcept nogil
    void stream_svm_move_error_column(Py_ssize_t n, const double* column, double weight,
                                      double C, int joining, double* h, double* h_abs,
                                      double* h_drift) noexcept nogil
    void stream_svm_accumulate_column(Py_ssize_t n, const double* row, double weight,
                                      double* sums, double* sizes) noexcept nogil
    void stream_svm_take_step(Py_ssize_t n, double step, int scale_driven, const double* change,
                              double* g, double* driven) noexcept nogil
    void stream_svm_margin_sums(Py_ssize_t n, Py_ssize_t k, const double* columns,
                                Py_ssize_t lda, const long* store, const long* margin,
                                const double* alpha, const double* y, double* g,
                                double* terms) noexcept nogil
    void stream_svm_init() noexcept nogil
    void stream_svm_rbf_values(Py_ssize_t n, double gamma, double* column) noexcept nogil
    void stream_svm_rbf_values_portable(Py_ssize_t n, double gamma, double* column) noexcept nogil
    int stream_svm_rbf_values_gathers() noexcept nogil
    double stream_svm_largest_sensitivity(Py_ssize_t n, const double* change,
                                          const signed char* status,
                                          const unsigned char* blocked, const double* gap,
                                          double tol_g, signed char error_code,
                                          signed char reserve_code,
                                          signed char adding_code) noexcept nogil


stream_svm_init()  # exp's table, and the loops chosen for this processor


def rbf_values(double[::1] column, double gamma, bint portable=False) -> bool:
    """``column[i] = exp(-gamma column[i])`` in place, as the breakpoint loop computes an RBF
    column from squared distances; with ``portable``, by the loop that runs everywhere
    instead of the one chosen for this processor (for tests: both give the same bits).
    Returns whether the chosen loop is the AVX-512 one."""
    if column.shape[0] == 0:
        return stream_svm_rbf_values_gathers() != 0
    with nogil:
        if portable:
            stream_svm_rbf_values_portable(column.shape[0], gamma, &column[0])
        else:
            stream_svm_rbf_values(column.shape[0], gamma, &column[0])
    return stream_svm_rbf_values_gathers() != 0


cdef inline void _features_against(int kind, double[:, ::1] XT, Py_ssize_t n, long p,
                                   double* out) noexcept nogil:
    """out[i] = |x_i - x_p|^2 (RBF) or <x_i, x_p> (the others) for i < n, from the features
    stored feature by feature (``XT[f, i]``): each feature's row is contiguous, so the loop
    over the points vectorizes. Each point's sum runs over the features in order, as SciPy's
    ``cdist(..., "sqeuclidean")`` sums them: the same values to the last bit."""
    cdef Py_ssize_t stride = XT.strides[0] // sizeof(double)
    stream_svm_features_block(kind == RBF, &XT[0, 0], stride, XT.shape[0], n, &XT[0, 0], stride,
                              &p, 1, out, 0)


def kernel_columns(int kind, double[:, ::1] XT, Py_ssize_t n, long[::1] positions,
                   double gamma, int degree, double coef0, double[:, ::1] out,
                   bint exponentiate=True, double[:, ::1] QT=None) -> None:
    """``out[c, i] = K(x_i, x_p)`` for i < n and p = ``positions[c]``, with the points'
    features stored feature by feature (``XT[f, i]``; p may lie beyond n), for the built-in
    kernels (``kind``: KERNEL_LINEAR <a,b>, KERNEL_RBF exp(-gamma |a-b|^2), KERNEL_POLY
    (gamma <a,b> + coef0)^degree), without the GIL. With ``QT`` (as many features as XT,
    stored alike) x_p is its column p instead, a query held apart from the points (no copy
    of them per query). With ``exponentiate`` False an RBF column is left at
    -gamma |a-b|^2, for the caller's vectorized exp."""
    cdef Py_ssize_t i, c, m = positions.shape[0]
    cdef double* column
    cdef double[:, ::1] queries = XT if QT is None else QT
    if out.shape[0] < m or out.shape[1] < n or XT.shape[1] < n:
        raise ValueError("out or XT is too small")
    if queries.shape[0] != XT.shape[0]:
        raise ValueError(f"QT has {queries.shape[0]} features, XT {XT.shape[0]}")
    for c in range(m):
        if not 0 <= positions[c] < queries.shape[1]:
            raise ValueError(f"position {positions[c]} is not among the {queries.shape[1]} "
                             "points")
    if m == 0:
        return
    with nogil:
        # The features' part of all the columns at once (see stream_svm_features_block), then
        # each column's kernel function.
        stream_svm_features_block(kind == RBF, &XT[0, 0], XT.strides[0] // sizeof(double),
                                  XT.shape[0], n, &queries[0, 0],
                                  queries.strides[0] // sizeof(double), &positions[0], m,
                                  &out[0, 0], out.strides[0] // sizeof(double))
        for c in range(m):
            column = &out[c, 0]
            if kind == RBF and exponentiate:
                stream_svm_rbf_values(n, gamma, column)
            elif kind == RBF:
                for i in range(n):
                    column[i] = -gamma * column[i]
            elif kind == POLY:
                stream_svm_poly_values(n, gamma, coef0, degree, column)


# ---------------------------------------------------------------------------------------------
# The breakpoint loop (PathEngine._follow_path): everything that happens per breakpoint.
#
# It is resumable: when it needs Python (a kernel column of a user-callable kernel, or more
# capacity for the margin set) it returns a request code with its state saved in LoopArrays
# (and in the engine's arrays), and the caller calls it again after serving the request.

from libc.float cimport DBL_EPSILON
from libc.math cimport fabs, INFINITY, isfinite, sqrt
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

import numpy as np

cdef enum:
    MARGIN = 0
    ERROR = 1
    RESERVE = 2
    ADDING = 3
    REMOVING = 4

# Return codes of LoopArrays.follow, and the slots of the float scalars (``fs``) and integer
# scalars (``ints``) the loop keeps between calls.
cdef enum:
    DONE_ = 0
    NEED_COLUMN_ = 1
    NEED_CAPACITY_ = 2
    LIMIT_ = 3
    EMPTY_MARGIN_ = 4
    NON_FINITE_ = 5

cdef enum:
    F_B_ = 0
    F_T_ = 1
    F_ARRIVED_ = 2
    F_NO_IMBALANCE_ = 3
    F_DIAG_SCALE_ = 4
    F_ARRIVED_REMOVING_ = 5
    F_ADDS_DONE_ = 6

cdef enum:
    I_STEPS_ = 0
    I_BREAKPOINTS_ = 1
    I_FRESH_ = 2
    I_PENDING_ = 3
    I_K_ = 4
    I_W_VALID_ = 5
    I_LIMIT_ = 6
    I_COLUMN_READY_ = 7
    I_RECENT_NEXT_ = 8
    I_REUSED_ = 9
    I_Z_VALID_ = 10
    I_ZERO_STEPS_ = 11
    I_BLAND_ = 12

DONE, NEED_COLUMN, NEED_CAPACITY, LIMIT, EMPTY_MARGIN, NON_FINITE = (
    DONE_, NEED_COLUMN_, NEED_CAPACITY_, LIMIT_, EMPTY_MARGIN_, NON_FINITE_)
F_B, F_T, F_ARRIVED, F_NO_IMBALANCE, F_DIAG_SCALE = (
    F_B_, F_T_, F_ARRIVED_, F_NO_IMBALANCE_, F_DIAG_SCALE_)
(I_STEPS, I_BREAKPOINTS, I_FRESH, I_PENDING, I_K, I_W_VALID, I_LIMIT, I_COLUMN_READY,
 I_RECENT_NEXT, I_REUSED, I_Z_VALID) = (
    I_STEPS_, I_BREAKPOINTS_, I_FRESH_, I_PENDING_, I_K_, I_W_VALID_, I_LIMIT_,
    I_COLUMN_READY_, I_RECENT_NEXT_, I_REUSED_, I_Z_VALID_)
#: Length of the ``ints`` array.
N_INTS = 13
cdef enum:
    N_INTS_ = 13

# Migration counters (``counts``), in this order.
MIGRATIONS = ("margin->error", "margin->reserve", "added->margin", "refused",
              "reserve->margin", "error->margin", "added->error", "flipped")
cdef enum:
    M_MARGIN_ERROR = 0
    M_MARGIN_RESERVE = 1
    M_ADDED_MARGIN = 2
    M_REFUSED = 3
    M_RESERVE_MARGIN = 4
    M_ERROR_MARGIN = 5
    M_ADDED_ERROR = 6
    M_FLIPPED = 7

cdef int REFRESH_STEPS = 64


cdef void _margin_remove(double[:, ::1] R, double[:, ::1] columns, long[::1] margin,
                         long[::1] store, long[::1] slot_of, Py_ssize_t n, Py_ssize_t k,
                         Py_ssize_t slot, double* column, double* w,
                         double* z) noexcept nogil:
    """Remove S's member at factor ``slot``: its factor column (Givens, rotating ``w`` and ``z``
    too when not NULL), its kernel column (copied to ``column``; the last stored column takes its row,
    so the rows stay packed and no other column moves), and its place in ``margin`` and
    ``store``, the slots after it moving one down."""
    cdef Py_ssize_t i, row = store[slot], last = k - 1
    cdef long position = margin[slot]
    memcpy(column, &columns[row, 0], n * sizeof(double))
    if row != last:
        memcpy(&columns[row, 0], &columns[last, 0], n * sizeof(double))
        for i in range(k):
            if store[i] == last:
                store[i] = row
                break
    _delete_factor_column(R, k, slot, w, z)
    for i in range(slot, k - 1):
        margin[i] = margin[i + 1]
        store[i] = store[i + 1]
        slot_of[margin[i]] -= 1
    slot_of[position] = -1


cdef bint _margin_add(double[:, ::1] R, double[:, ::1] columns, long[::1] margin,
                      long[::1] store, long[::1] slot_of, signed char[::1] status, Py_ssize_t n,
                      Py_ssize_t k, long position, double* column, double* t, double diag_scale,
                      double degeneracy_tol, double* work, double* w, double* z,
                      double z_entry) noexcept nogil:
    """Append a point to S given its kernel column (capacity for k + 1 must exist), extending
    ``w`` = R^-T 1 and ``z`` = R^-T r (r gaining ``z_entry``) when not NULL; False when the
    point is degenerate (its Schur complement in P is numerically zero)."""
    cdef double diag = column[position], pivot2, scale
    cdef Py_ssize_t i, lda = R.shape[1]
    if k == 0:
        # t on the kernel's scale (see PathEngine._shift).
        scale = diag if diag > diag_scale else diag_scale
        t[0] = scale if scale > 0 else 1.0
        pivot2 = diag + t[0]
        if pivot2 <= 0:
            return False
        R[0, 0] = sqrt(pivot2)
        if w != NULL:
            w[0] = 1.0 / R[0, 0]
        if z != NULL:
            z[0] = z_entry / R[0, 0]
    else:
        for i in range(k):
            work[i] = column[margin[i]] + t[0]
        stream_svm_solve_transposed(k, &R[0, 0], lda, work)
        for i in range(k):
            if not isfinite(work[i]):
                return False
        pivot2 = diag + t[0] - stream_svm_dot(k, work, work)
        if pivot2 <= degeneracy_tol * (diag + t[0]):
            return False
        for i in range(k):
            R[i, k] = work[i]
            R[k, i] = 0.0
        R[k, k] = sqrt(pivot2)
        if w != NULL:
            # The new last row of R'w = 1: r'w + R_kk w_k = 1.
            w[k] = (1.0 - stream_svm_dot(k, work, w)) / R[k, k]
        if z != NULL:
            z[k] = (z_entry - stream_svm_dot(k, work, z)) / R[k, k]
    # The rows of ``columns`` are packed: the new column takes row k (where the loop put it
    # already).
    if column != &columns[k, 0]:
        memcpy(&columns[k, 0], column, n * sizeof(double))
    store[k] = k
    slot_of[position] = k
    margin[k] = position
    status[position] = MARGIN
    return True


cdef inline void _move_error_column(double[::1] h, double[::1] h_abs, double[::1] h_drift,
                                    Py_ssize_t n, const double* column, double weight, double C,
                                    bint joining) noexcept nogil:
    """h += weight * column (joining E) or -= (leaving), with h's size and drift bound."""
    if n:
        stream_svm_move_error_column(n, column, weight, C, joining, &h[0], &h_abs[0],
                                     &h_drift[0])


cdef class LoopArrays:
    """The breakpoint loop's arrays between calls: views of the engine's arrays (stored points',
    S's, the recent columns), and the loop's own scratch and scalars, which it allocates and
    keeps from path to path.

    One path is :meth:`bind`, :meth:`reserve`, :meth:`begin`, then :meth:`follow` until it
    returns DONE (or a failure), serving its requests in between, and :meth:`outcome`. The
    engine's arrays are passed before every call, as the engine replaces those that grow:
    a view is acquired (about 100 ns) only for an array that is not the one already held.
    Everything a path needs to start is set here in one call: after the loop has streamed S's
    kernel columns through the caches, each interpreter step of the Python around it costs
    a cache miss or more.
    """
    cdef list _held
    cdef double[:, ::1] XT, columns, R, recent
    cdef double[::1] y, p, gap, alpha, g, h, h_abs, h_drift, w, driven_effect, column, work
    cdef double[::1] change, point_eta, margin_events, fs, beta_D
    cdef signed char[::1] status
    cdef long[::1] slot_of, margin, store, recent_of, margin_candidate, ints, counts
    cdef long[::1] zero_sets  # (see _sets_seen_again)
    cdef unsigned char[::1] blocked, adding, active
    cdef object margin_array  # the array ``margin`` views (a view's own copy is slower)
    cdef Py_ssize_t rows, capacity
    cdef Py_ssize_t factor_room  # the factor's room at the last reserve (its layout in work)

    def __cinit__(self):
        self._held = [None] * 16
        self.rows = self.capacity = self.factor_room = 0
        self.fs = np.empty(7)
        self.ints = np.zeros(N_INTS, dtype=np.int64)
        self.counts = np.zeros(len(MIGRATIONS), dtype=np.int64)
        self.zero_sets = np.zeros(ZERO_SETS, dtype=np.int64)
        self.margin_array = np.empty(0, dtype=np.int64)
        self.margin = self.margin_array

    def bind(self, XT, y, p, gap, alpha, g, status, slot_of, h, h_abs, h_drift, columns, R,
             store, recent, recent_of) -> None:
        """Hold views of the engine's arrays (see the class)."""
        cdef list held = self._held
        if XT is not held[0]:
            self.XT = XT
            held[0] = XT
        if y is not held[1]:
            self.y = y
            held[1] = y
        if p is not held[2]:
            self.p = p
            held[2] = p
        if gap is not held[3]:
            self.gap = gap
            held[3] = gap
        if alpha is not held[4]:
            self.alpha = alpha
            held[4] = alpha
        if g is not held[5]:
            self.g = g
            held[5] = g
        if status is not held[6]:
            self.status = status
            held[6] = status
        if slot_of is not held[7]:
            self.slot_of = slot_of
            held[7] = slot_of
        if h is not held[8]:
            self.h = h
            held[8] = h
        if h_abs is not held[9]:
            self.h_abs = h_abs
            held[9] = h_abs
        if h_drift is not held[10]:
            self.h_drift = h_drift
            held[10] = h_drift
        if columns is not held[11]:
            self.columns = columns
            held[11] = columns
        if R is not held[12]:
            self.R = R
            held[12] = R
        if store is not held[13]:
            self.store = store
            held[13] = store
        if recent is not held[14]:
            self.recent = recent
            held[14] = recent
        if recent_of is not held[15]:
            self.recent_of = recent_of
            held[15] = recent_of

    def reserve(self, Py_ssize_t rows, Py_ssize_t capacity) -> None:
        """Scratch for ``rows`` stored points and ``capacity`` members of S (the factor's room).
        A factor of another room in the middle of a path keeps the members and drops what the
        loop derived from the factor's layout (it computes that again): the loop keeps it in
        ``work`` at offsets that follow the factor's room, which a restored engine can make
        smaller than this scratch's."""
        cdef Py_ssize_t k
        if capacity != self.factor_room:
            self.ints[I_W_VALID_] = 0
            self.ints[I_Z_VALID_] = 0
            self.factor_room = capacity
        if rows > self.rows:
            self.driven_effect = np.empty(rows)
            self.change = np.empty(rows)
            self.point_eta = np.empty(rows)
            self.margin_events = np.empty(2 * rows)
            self.margin_candidate = np.empty(rows, dtype=np.int64)
            self.blocked = np.empty(rows, dtype=np.uint8)
            self.column = np.empty(rows)
            self.beta_D = np.empty(rows)
            self.adding = np.empty(rows, dtype=np.uint8)
            self.active = np.empty(rows, dtype=np.uint8)
            self.rows = rows
        if capacity > self.capacity:
            k = min(self.ints[I_K_], self.capacity)
            margin = np.full(capacity, -1, dtype=np.int64)
            margin[:k] = self.margin_array[:k]
            self.margin_array = margin
            self.margin = margin
            self.w = np.zeros(capacity)
            self.work = np.zeros(4 * capacity)
            self.ints[I_W_VALID_] = 0
            self.ints[I_Z_VALID_] = 0
            self.capacity = capacity

    def begin(self, const long[::1] D, const long[::1] members, double b, double t,
              double diag_scale, Py_ssize_t limit, Py_ssize_t recent_next) -> None:
        """Start a path driving the points ``D`` (bound and reserved first), from S's
        ``members`` (in factor order), b, t and the kernel's scale."""
        cdef Py_ssize_t i, j, k = members.shape[0], m = D.shape[0]
        if k > self.capacity or m > self.rows:
            raise ValueError(f"{k} members or {m} driven points exceed the room reserved")
        for j in range(m):
            if not 0 <= D[j] < self.status.shape[0]:
                raise ValueError(f"driven position {D[j]} is not a stored point's")
        for i in range(self.capacity):
            self.margin[i] = members[i] if i < k else -1
        self.fs[F_B_] = b
        self.fs[F_T_] = t
        self.fs[F_ARRIVED_] = -1.0  # a new path: the loop sets up its moves
        self.fs[F_NO_IMBALANCE_] = -1.0
        self.fs[F_DIAG_SCALE_] = diag_scale
        self.fs[F_ADDS_DONE_] = 0.0
        for i in range(N_INTS_):
            self.ints[i] = 0
        self.ints[I_PENDING_] = -1
        self.ints[I_K_] = k
        self.ints[I_LIMIT_] = limit
        self.ints[I_RECENT_NEXT_] = recent_next
        for i in range(self.counts.shape[0]):
            self.counts[i] = 0
        for j in range(m):
            self.adding[j] = self.status[D[j]] == ADDING
            self.active[j] = 1

    def follow(self, int kernel_kind, double gamma, int degree, double coef0, double ridge,
               Py_ssize_t n, double C, double kkt_tol, double degeneracy_tol,
               long[::1] D, double[:, ::1] K_D) -> int:
        """Run PathEngine._follow_path's loop from the saved state; returns a code (DONE, or a
        request, or a failure: LIMIT, EMPTY_MARGIN, NON_FINITE). ``kernel_kind`` -1 is a
        user-callable kernel: a stored point's column is then requested (NEED_COLUMN, the
        position in :attr:`pending`), given by :meth:`supply_column` before the next call.
        Kernel columns are rows here, contiguous over the points:
        ``K_D[j, i] = K(x_i, x_D[j])``, and ``columns`` holds S's."""
        cdef int code
        if D.shape[0] > self.rows or K_D.shape[0] < D.shape[0] or K_D.shape[1] < n:
            raise ValueError("the driven points do not fit the room reserved")
        with nogil:
            code = _follow(kernel_kind, gamma, degree, coef0, ridge, self.XT, n, C, kkt_tol,
                           degeneracy_tol, self.y, self.p, self.gap, self.alpha, self.g,
                           self.status, self.slot_of, self.h, self.h_abs, self.h_drift,
                           self.columns, self.R, self.margin, self.store, self.w, D, K_D,
                           self.adding, self.active, self.blocked, self.beta_D,
                           self.driven_effect, self.fs, self.ints, self.counts, self.column,
                           self.work, self.recent, self.recent_of, self.change,
                           self.point_eta, self.margin_events, self.margin_candidate,
                           self.zero_sets)
        return code

    @property
    def members(self) -> int:
        """How many points S holds now."""
        return self.ints[I_K_]

    @property
    def pending(self) -> int:
        """The position whose kernel column the loop asked for (NEED_COLUMN)."""
        return self.ints[I_PENDING_]

    @property
    def steps(self) -> int:
        return self.ints[I_STEPS_]

    def supply_column(self, const double[::1] values) -> None:
        """The requested column, K(x_i, x_pending) + ridge at pending, for every stored i."""
        cdef Py_ssize_t i
        if values.shape[0] > self.rows:
            raise ValueError(f"a column of {values.shape[0]} values for {self.rows} rows")
        for i in range(values.shape[0]):
            self.column[i] = values[i]
        self.ints[I_COLUMN_READY_] = 1

    def outcome(self) -> tuple:
        """Where the path stopped: (S's members in factor order (a new array), b, t, the next
        recent-column slot, steps, breakpoints, columns reused, ((migration, times), ...)
        for the migrations that happened)."""
        cdef Py_ssize_t k = self.ints[I_K_], c
        cdef list migrations = []
        for c in range(self.counts.shape[0]):
            if self.counts[c]:
                migrations.append((MIGRATIONS[c], self.counts[c]))
        return (self.margin_array[:k].copy(), self.fs[F_B_], self.fs[F_T_],
                self.ints[I_RECENT_NEXT_], self.ints[I_STEPS_], self.ints[I_BREAKPOINTS_],
                self.ints[I_REUSED_], migrations)


def point_events(int mode, double db, const double[::1] y, const double[::1] driven,
                 double[::1] change, const signed char[::1] status,
                 const unsigned char[::1] blocked, const double[::1] gap, const double[::1] g,
                 double tol_g, double[::1] point_eta, bint portable=False) -> float:
    """A breakpoint's pass over the points, as the loop runs it (for tests): ``change``
    becomes the sensitivities of g (mode 0: ``y * ((change + driven) + db)``, 1: ``y * db``,
    2: ``y * driven``), ``point_eta`` each point's step to its event (inf: none) given its
    state in ``status`` (MARGIN, ERROR, RESERVE, ADDING) and ``blocked``; returns the smallest
    step. With ``portable``, by the loop that runs everywhere instead of the one chosen for
    this processor (both give the same bits)."""
    cdef Py_ssize_t n = y.shape[0]
    if not (driven.shape[0] == change.shape[0] == status.shape[0] == blocked.shape[0]
            == gap.shape[0] == g.shape[0] == point_eta.shape[0] == n):
        raise ValueError("every array needs one entry per point")
    if mode not in (0, 1, 2):
        raise ValueError(f"mode is 0, 1 or 2, not {mode}")
    cdef double smallest
    if n == 0:
        return INFINITY
    with nogil:
        if portable:
            smallest = stream_svm_point_events_portable(
                n, mode, db, &y[0], &driven[0], &change[0], &status[0], &blocked[0], &gap[0],
                &g[0], tol_g, ERROR, RESERVE, ADDING, &point_eta[0])
        else:
            smallest = stream_svm_point_events(
                n, mode, db, &y[0], &driven[0], &change[0], &status[0], &blocked[0], &gap[0],
                &g[0], tol_g, ERROR, RESERVE, ADDING, &point_eta[0])
    return smallest


def avx512_loops() -> bool:
    """Whether the loops chosen at import for this processor are the AVX-512 ones (exp of the
    RBF columns, the breakpoint's pass over the points and its search for events); else the
    portable ones run. Both give the same bits."""
    return stream_svm_rbf_values_gathers() != 0


def next_at_most(const double[::1] values, Py_ssize_t start, double bound,
                 bint portable=False) -> int:
    """The first position at or after ``start`` whose value is at most ``bound`` (the length
    of ``values`` if none), as the loop searches the events at a step (for tests); with
    ``portable``, by the loop that runs everywhere."""
    cdef Py_ssize_t n = values.shape[0], found
    if not 0 <= start <= n:
        raise ValueError(f"start {start} is outside 0..{n}")
    if n == 0:
        return 0
    with nogil:
        if portable:
            found = stream_svm_next_at_most_portable(start, n, &values[0], bound)
        else:
            found = stream_svm_next_at_most(start, n, &values[0], bound)
    return found


cdef int _column_of(int kernel_kind, double gamma, int degree, double coef0, double ridge,
                    double[:, ::1] XT, Py_ssize_t n, long p, double* out) noexcept nogil:
    """K(x_i, x_p) (+ ridge at i = p) for i < n; 1 when a value is not finite."""
    cdef Py_ssize_t i
    _features_against(kernel_kind, XT, n, p, out)
    if kernel_kind == RBF:
        stream_svm_rbf_values(n, gamma, out)  # in [0, 1]: finite
    else:
        if kernel_kind == POLY:
            stream_svm_poly_values(n, gamma, coef0, degree, out)
        for i in range(n):
            if not isfinite(out[i]):
                return 1
    out[p] += ridge
    return 0


cdef enum:
    ZERO_SETS = 256  # the sets of the last this many zero steps are remembered


cdef inline unsigned long long _mix(unsigned long long value) noexcept nogil:
    # splitmix64's finalizer
    value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ULL
    value = (value ^ (value >> 27)) * 0x94d049bb133111ebULL
    return value ^ (value >> 31)


cdef bint _sets_seen_again(signed char[::1] status, unsigned char[::1] blocked, Py_ssize_t n,
                           long zero_steps, long[::1] zero_sets) noexcept nogil:
    """Whether the points' sets (and refusals) are those of an earlier step of this run of
    ``zero_steps`` zero steps (a hash of them, kept for the last ZERO_SETS steps)."""
    cdef Py_ssize_t i, j
    cdef unsigned long long code = 0
    cdef long hashed
    for i in range(n):
        code += _mix(<unsigned long long>i * 16 + <unsigned long long>(status[i] * 2 + 8)
                     + blocked[i])
    hashed = <long>code
    for j in range(zero_steps if zero_steps < ZERO_SETS else ZERO_SETS):
        if zero_sets[j] == hashed:
            return True
    zero_sets[zero_steps % ZERO_SETS] = hashed
    return False


cdef Py_ssize_t _tied_event(double[::1] point_eta, double[::1] change, Py_ssize_t n,
                            long[::1] margin_candidate, double[::1] margin_events,
                            Py_ssize_t n_candidates, double window,
                            Py_ssize_t* chosen, bint lowest) noexcept nogil:
    """How many events lie within ``window``; ``chosen`` gets the position of the one of
    largest sensitivity (|change| of a point, |d alpha| of a margin member), then lowest
    position; with ``lowest``, of lowest position (Bland's rule, see _follow)."""
    cdef Py_ssize_t i, c, n_ties = 0, best = -1
    cdef double best_sensitivity = 0.0, sensitivity
    i = stream_svm_next_at_most(0, n, &point_eta[0], window)
    while i < n:
        n_ties += 1
        sensitivity = fabs(change[i])
        if lowest:
            if best < 0:
                best = i
        elif best < 0 or sensitivity > best_sensitivity:
            best = i
            best_sensitivity = sensitivity
        i = stream_svm_next_at_most(i + 1, n, &point_eta[0], window)
    for c in range(n_candidates):
        if margin_events[2 * c] <= window:
            n_ties += 1
            sensitivity = margin_events[2 * c + 1]
            i = margin_candidate[c]
            if lowest:
                if best < 0 or i < best:
                    best = i
            elif (best < 0 or sensitivity > best_sensitivity
                    or (sensitivity == best_sensitivity and i < best)):
                best = i
                best_sensitivity = sensitivity
    chosen[0] = best
    return n_ties


cdef int _follow(
    int kernel_kind, double gamma, int degree, double coef0, double ridge,
    double[:, ::1] XT, Py_ssize_t n, double C, double kkt_tol, double degeneracy_tol,
    double[::1] y, double[::1] p, double[::1] gap, double[::1] alpha, double[::1] g,
    signed char[::1] status,
    long[::1] slot_of, double[::1] h, double[::1] h_abs, double[::1] h_drift,
    double[:, ::1] columns, double[:, ::1] R, long[::1] margin, long[::1] store,
    double[::1] w, long[::1] D, double[:, ::1] K_D, unsigned char[::1] adding,
    unsigned char[::1] active,
    unsigned char[::1] blocked, double[::1] beta_D, double[::1] driven_effect,
    double[::1] fs, long[::1] ints, long[::1] counts, double[::1] column, double[::1] work,
    double[:, ::1] recent, long[::1] recent_of,
    double[::1] change, double[::1] point_eta, double[::1] margin_events,
    long[::1] margin_candidate, long[::1] zero_sets,
) noexcept nogil:
    cdef Py_ssize_t i, j, m = D.shape[0], k, chosen, index, slot, capacity = R.shape[0]
    cdef Py_ssize_t n_ties, n_candidates
    cdef Py_ssize_t lda_r = R.shape[1]
    cdef double eps = DBL_EPSILON, C_ = C
    cdef double beta_sum, beta_scale, beta_S_scale, db, scale, tol_g, tol_a, eta_min, step
    cdef double shifted_db, v_sum, value, eta_unit, coefficient_scale, window, s_max
    cdef double sens_max, d_alpha, margin_eta_min
    cdef bint any_active, bias_only, finish, adds_done, bland
    cdef signed char state
    cdef Py_ssize_t lda_cols = columns.shape[1], lda_kd = K_D.shape[1]
    cdef double* leaving
    # work: [0, capacity) scratch, then beta_S in factor order, then beta_S by storage row,
    # then z = R^-T r for r = -driven_effect_S (kept up to date as S changes, see below).
    cdef double* beta_S = &work[capacity]
    cdef double* beta_stored = &work[2 * capacity]
    cdef double* z = &work[3 * capacity]

    if fs[F_ARRIVED_] < 0.0:
        # A new path: the driven moves beta_D and their contribution K_D beta_D (by the
        # refresh below), and what is left of the moves once it is round-off of those this
        # update started with: the path has arrived (its direction would be noise, e.g. a
        # spurious imbalance of an empty margin set). The equality sum(y alpha) = 0 holds to
        # the round-off of the coefficients' sum, which is not C's: with C * K large the
        # solution's coefficients are far below C, and a C-sized threshold dropped whole
        # moves (removals of such points).
        ints[I_FRESH_] = REFRESH_STEPS
        for i in range(n):  # no point is refused entry yet (the buffer is reused)
            blocked[i] = 0
        beta_scale = 0.0
        d_alpha = 0.0  # the removals' part
        for j in range(m):
            if adding[j]:
                beta_scale += C_ - alpha[D[j]]
            else:
                beta_scale += alpha[D[j]]
                d_alpha += alpha[D[j]]
        value = 0.0
        for i in range(n):
            value += alpha[i]
        fs[F_ARRIVED_] = 1e4 * eps * (beta_scale if beta_scale > value else value)
        fs[F_NO_IMBALANCE_] = fs[F_ARRIVED_]
        # Once no added point is driven any more, what is left are removals, whose moves are
        # the size of the coefficients, not of C: with C * K large (C = 1e12 on a window of
        # two points) a C-sized threshold took whole removals for round-off and dropped them,
        # breaking sum(y alpha) = 0.
        fs[F_ARRIVED_REMOVING_] = 1e4 * eps * (d_alpha if d_alpha > value else value)

    # A migration into S interrupted by a request: finish it first.
    if ints[I_PENDING_] >= 0:
        code = _enter_margin(kernel_kind, gamma, degree, coef0, ridge, XT, n, C_, degeneracy_tol,
                             y, alpha, g, status, slot_of, h, h_abs, h_drift, columns, R, margin,
                             store, w, D, K_D, active, blocked, beta_D, driven_effect, fs, ints,
                             counts, column, work, recent, recent_of)
        if code != DONE_:
            return code

    while True:
        any_active = False
        for j in range(m):
            if active[j]:
                any_active = True
                break
        if not any_active:
            break
        if fs[F_ADDS_DONE_] == 0.0:
            adds_done = True
            for j in range(m):
                if active[j] and adding[j]:
                    adds_done = False
                    break
            if adds_done:
                fs[F_ADDS_DONE_] = 1.0
                if fs[F_ARRIVED_REMOVING_] < fs[F_ARRIVED_]:
                    fs[F_ARRIVED_] = fs[F_ARRIVED_REMOVING_]
                if fs[F_ARRIVED_REMOVING_] < fs[F_NO_IMBALANCE_]:
                    fs[F_NO_IMBALANCE_] = fs[F_ARRIVED_REMOVING_]
        if ints[I_STEPS_] >= ints[I_LIMIT_]:
            return LIMIT_
        if ints[I_FRESH_] >= REFRESH_STEPS:  # bound the round-off of the scaled contribution
            for j in range(m):
                if active[j]:
                    beta_D[j] = y[D[j]] * ((C_ - alpha[D[j]]) if adding[j] else -alpha[D[j]])
                else:
                    beta_D[j] = 0.0
            # The compiled loop rather than BLAS's dgemv: this product is small, and a
            # threaded BLAS would leave its threads spinning beside the caller (the daemon's
            # Kafka threads) after every path.
            stream_svm_columns_times(n, m, &K_D[0, 0], lda_kd, &beta_D[0], &driven_effect[0])
            ints[I_FRESH_] = 0
            ints[I_Z_VALID_] = 0
        beta_sum = 0.0
        beta_scale = 0.0
        for j in range(m):
            beta_sum += beta_D[j]
            beta_scale += fabs(beta_D[j])
        if beta_scale <= fs[F_ARRIVED_]:
            for j in range(m):
                if active[j]:
                    alpha[D[j]] = C_ if adding[j] else 0.0
            break
        k = ints[I_K_]
        bias_only = False
        if fabs(beta_sum) <= fs[F_NO_IMBALANCE_]:
            beta_sum = 0.0
        if k:
            # beta_S, db from K_SS beta + db 1 = -driven_effect_S, 1' beta = -beta_sum, through
            # P = R'R = K_SS + t 11' and w = R^-T 1: with z = R^-T r, 1'P^-1 r = w'z and
            # 1'P^-1 1 = w'w, so beta_S = R^-1 (z - w shifted_db). w and z are kept up to date
            # as S changes (a column added or removed costs O(|S|) more for each), and z as
            # r scales with the driven moves; z is solved afresh when the driven contribution
            # changes otherwise (a driven point joins S, the periodic recomputation): most
            # breakpoints take one triangular solve instead of two.
            if not ints[I_W_VALID_]:
                for i in range(k):
                    w[i] = 1.0
                stream_svm_solve_transposed(k, &R[0, 0], lda_r, &w[0])
                ints[I_W_VALID_] = 1
            if not ints[I_Z_VALID_]:
                for i in range(k):
                    z[i] = -driven_effect[margin[i]]
                stream_svm_solve_transposed(k, &R[0, 0], lda_r, z)
                ints[I_Z_VALID_] = 1
            memcpy(beta_S, z, k * sizeof(double))
            shifted_db = (stream_svm_dot(k, &w[0], beta_S) + beta_sum) / stream_svm_dot(
                k, &w[0], &w[0])
            for i in range(k):
                beta_S[i] = beta_S[i] - w[i] * shifted_db
            stream_svm_solve(k, &R[0, 0], lda_r, beta_S)
            db = shifted_db + fs[F_T_] * (-beta_sum)
            # K_S beta_S over S's packed kernel columns (storage rows, contiguous per member).
            for i in range(k):
                beta_stored[store[i]] = beta_S[i]
            stream_svm_columns_times(n, k, &columns[0, 0], lda_cols, beta_stored, &change[0])
        else:
            if fabs(beta_sum) > 1e-12 * beta_scale:
                bias_only = True
                db = 1.0 if beta_sum > 0 else -1.0
            else:
                db = 0.0
        # gamma_i = y_i * change_i, where change = K_S beta_S + driven_effect + db (with S),
        # db (a bias-only step) or driven_effect (an empty S, balanced): computed in the pass
        # below; the margin points' first, for the thresholds.
        beta_S_scale = 0.0
        for i in range(k):
            beta_S_scale += fabs(beta_S[i])
        if bias_only:
            scale = fabs(db)
        else:
            scale = fs[F_DIAG_SCALE_] * (beta_S_scale + beta_scale) + fabs(db)
        tol_g = 1e3 * eps * scale
        tol_a = 1e3 * eps * (beta_S_scale + beta_scale)
        if k:
            s_max = 0.0
            v_sum = 0.0
            for i in range(k):
                j = margin[i]
                value = y[j] * ((change[j] + driven_effect[j]) + db)
                if fabs(value) > s_max:
                    s_max = fabs(value)
                v_sum += beta_S[i]
            if 10.0 * s_max > tol_g:
                tol_g = 10.0 * s_max
            if 10.0 * fabs(v_sum + beta_sum) > tol_a:
                tol_a = 10.0 * fabs(v_sum + beta_sum)

        # g's sensitivities, then the events: error/added points rising to the margin, reserve
        # points falling to it, or rising to their other side (a flip). Every point gets its
        # step length (inf: no event) in ``point_eta``, for the smallest one and the tie
        # search after the step (one compiled pass that vectorizes); the margin points' events
        # are listed with theirs (``margin_events``: eta, sensitivity).
        eta_min = stream_svm_point_events(
            n, 0 if k else (1 if bias_only else 2), db, &y[0], &driven_effect[0], &change[0],
            &status[0], &blocked[0], &gap[0], &g[0], tol_g, ERROR, RESERVE, ADDING,
            &point_eta[0])
        n_candidates = 0
        margin_eta_min = INFINITY
        if k and not bias_only:
            for i in range(k):
                d_alpha = y[margin[i]] * beta_S[i]
                value = INFINITY
                if d_alpha > tol_a:
                    value = (C_ - alpha[margin[i]]) / d_alpha
                elif d_alpha < -tol_a:
                    value = -alpha[margin[i]] / d_alpha
                if value < 0.0:
                    value = 0.0
                if value < INFINITY:
                    margin_candidate[n_candidates] = margin[i]
                    margin_events[2 * n_candidates] = value
                    margin_events[2 * n_candidates + 1] = fabs(d_alpha)
                    n_candidates += 1
                if value < eta_min:
                    eta_min = value
                if value < margin_eta_min:
                    margin_eta_min = value
        finish = (not bias_only) and eta_min >= 1.0
        if finish and margin_eta_min <= 1.0 + 1e-13:
            # A member reaches its bound together with the end of the moves (a tie at eta = 1,
            # judged on eta's scale as every tie): it leaves S at its bound, exactly, instead of
            # keeping the round-off of its move (3e-17 that would fix b, where the sums force
            # the coefficient to 0).
            finish = False
            eta_min = 1.0
        if finish:
            step = 1.0
        elif not isfinite(eta_min):
            if bias_only and fabs(beta_sum) <= 1e-4 * kkt_tol * C_:
                # Round-off that no point can absorb (see PathEngine._follow_path).
                fs[F_NO_IMBALANCE_] = fabs(beta_sum)
                continue
            return EMPTY_MARGIN_
        else:
            step = eta_min

        if not bias_only:
            for i in range(k):
                value = alpha[margin[i]] + step * (y[margin[i]] * beta_S[i])
                alpha[margin[i]] = 0.0 if value < 0.0 else (C_ if value > C_ else value)
            for j in range(m):
                if active[j]:
                    alpha[D[j]] += step * y[D[j]] * beta_D[j]
        fs[F_B_] += step * db
        ints[I_STEPS_] += 1
        if finish:
            for i in range(n):
                g[i] += step * change[i]
            for j in range(m):
                if active[j]:
                    alpha[D[j]] = C_ if adding[j] else 0.0
            break
        if not bias_only:
            for j in range(m):
                beta_D[j] *= 1.0 - step
            ints[I_FRESH_] += 1

        # g moves, the driven contribution shrinks (two loops that vectorize), and among the
        # events at eta_min (ties within a window on eta's scale) the one of largest
        # sensitivity, then lowest position, is kept (see PathEngine._follow_path).
        stream_svm_take_step(n, step, not bias_only, &change[0], &g[0], &driven_effect[0])
        if not bias_only and ints[I_Z_VALID_]:
            value = 1.0 - step  # r = -driven_effect_S shrinks with it
            for i in range(k):
                z[i] *= value
        window = eta_min + 1e-13 * (eta_min if eta_min > 1.0 else 1.0)
        # Where many points sit exactly at their events together (the margin of a model that
        # has learned one class only holds every point at g = 0), steps of length 0 can take
        # points in and out of S in a cycle that never ends (four negative points and one
        # positive under a linear kernel cycled through eight sets until max_breakpoints):
        # nothing moves in such a step, so the same sets lead to the same choice again. Once
        # a run of zero steps comes back to sets it has been in, its ties go to the lowest
        # position (Bland's rule for degenerate pivots), which breaks the cycle; every other
        # path keeps its choices.
        if step == 0.0:
            if not ints[I_BLAND_]:
                ints[I_BLAND_] = _sets_seen_again(status, blocked, n, ints[I_ZERO_STEPS_],
                                                  zero_sets)
            ints[I_ZERO_STEPS_] += 1
        else:
            ints[I_ZERO_STEPS_] = 0
            ints[I_BLAND_] = 0
        bland = ints[I_BLAND_] != 0
        n_ties = _tied_event(point_eta, change, n, margin_candidate, margin_events, n_candidates,
                             window, &chosen, bland)
        if n_ties > 1:
            eta_unit = 1.0
            sens_max = stream_svm_largest_sensitivity(n, &change[0], &status[0], &blocked[0],
                                                      &gap[0], tol_g, ERROR, RESERVE, ADDING)
            if sens_max > 0.0 and 1.0 / sens_max < eta_unit:
                eta_unit = 1.0 / sens_max
            if not bias_only:
                coefficient_scale = 0.0
                for i in range(n):
                    if alpha[i] > coefficient_scale:
                        coefficient_scale = alpha[i]
                if coefficient_scale > 0 and coefficient_scale / beta_scale < eta_unit:
                    eta_unit = coefficient_scale / beta_scale
            window = eta_min + 1e-13 * (eta_min if eta_min > eta_unit else eta_unit)
            _tied_event(point_eta, change, n, margin_candidate, margin_events, n_candidates,
                        window, &chosen, bland)
        if status[chosen] == RESERVE and change[chosen] > 0.0:
            # a flip: the point joins S on its other side
            y[chosen] = -y[chosen]
            p[chosen] = gap[chosen] - p[chosen]
            g[chosen] = gap[chosen] - g[chosen]
            counts[M_FLIPPED] += 1
        ints[I_BREAKPOINTS_] += 1
        state = status[chosen]
        if state == MARGIN:
            slot = slot_of[chosen]
            d_alpha = y[chosen] * beta_S[slot]
            # Paths move points in and out of S again and again: the column it leaves with
            # goes to the recent columns, so that its return costs a copy instead of n kernel
            # evaluations (copied there straight from S's storage).
            leaving = &column[0]
            if recent.shape[0]:
                index = ints[I_RECENT_NEXT_]
                recent_of[index] = chosen
                leaving = &recent[index, 0]
                ints[I_RECENT_NEXT_] = (index + 1) % recent.shape[0]
            _margin_remove(R, columns, margin, store, slot_of, n, k, slot, leaving,
                           &w[0] if ints[I_W_VALID_] else NULL,
                           z if ints[I_Z_VALID_] else NULL)
            ints[I_K_] = k - 1
            # A point refused entry was in the span of S; with S smaller it may not be.
            for i in range(n):
                blocked[i] = 0
            if d_alpha > 0:
                alpha[chosen] = C_
                status[chosen] = ERROR
                _move_error_column(h, h_abs, h_drift, n, leaving, C_ * y[chosen], C_, True)
                counts[M_MARGIN_ERROR] += 1
            else:
                alpha[chosen] = 0.0
                status[chosen] = RESERVE
                counts[M_MARGIN_RESERVE] += 1
        else:
            ints[I_PENDING_] = chosen
            code = _enter_margin(kernel_kind, gamma, degree, coef0, ridge, XT, n, C_,
                                 degeneracy_tol, y, alpha, g, status, slot_of, h, h_abs, h_drift,
                                 columns, R, margin, store, w, D, K_D, active, blocked, beta_D,
                                 driven_effect, fs, ints, counts, column, work, recent,
                                 recent_of)
            if code != DONE_:
                return code

    # Points still driven to C at the end join E: their contributions summed per row first.
    any_active = False
    for j in range(m):
        if active[j] and adding[j]:
            status[D[j]] = ERROR
            alpha[D[j]] = C_
            counts[M_ADDED_ERROR] += 1
            any_active = True
    if any_active:
        # Per point, the sums over these points in their order (in change and point_eta,
        # free now).
        for i in range(n):
            change[i] = 0.0
            point_eta[i] = 0.0
        for j in range(m):
            if active[j] and adding[j]:
                stream_svm_accumulate_column(n, &K_D[j, 0], C_ * y[D[j]], &change[0],
                                             &point_eta[0])
        for i in range(n):
            h[i] += change[i]
            h_abs[i] += point_eta[i] * C_
            h_drift[i] += point_eta[i] * C_
    return DONE_


cdef int _enter_margin(
    int kernel_kind, double gamma, int degree, double coef0, double ridge,
    double[:, ::1] XT, Py_ssize_t n, double C, double degeneracy_tol,
    double[::1] y, double[::1] alpha, double[::1] g, signed char[::1] status,
    long[::1] slot_of, double[::1] h, double[::1] h_abs, double[::1] h_drift,
    double[:, ::1] columns, double[:, ::1] R, long[::1] margin, long[::1] store, double[::1] w,
    long[::1] D, double[:, ::1] K_D, unsigned char[::1] active,
    unsigned char[::1] blocked, double[::1] beta_D, double[::1] driven_effect,
    double[::1] fs, long[::1] ints, long[::1] counts, double[::1] column, double[::1] work,
    double[:, ::1] recent, long[::1] recent_of,
) noexcept nogil:
    """The pending point (``ints[I_PENDING_]``, not in S) enters S, or is refused entry. Its
    kernel column comes from the driven points' columns (a point being added), from the
    columns of points that left S earlier on this path (``recent``, positions in
    ``recent_of``), or is computed (or asked of Python for a user-callable kernel)."""
    cdef long chosen = ints[I_PENDING_]
    cdef Py_ssize_t k = ints[I_K_], i, j, index = -1, m = D.shape[0], cached = -1
    cdef double* entering
    cdef signed char state = status[chosen]
    cdef double weight, rest
    if k + 1 > R.shape[0] or k + 1 > columns.shape[0]:
        return NEED_CAPACITY_
    # The column goes straight to S's storage row k (the next free one; unused if the point
    # is refused entry), not through the scratch column.
    entering = &columns[k, 0]
    if state == ADDING:
        for j in range(m):
            if D[j] == chosen:
                index = j
                break
        memcpy(entering, &K_D[index, 0], n * sizeof(double))
    else:
        for j in range(recent_of.shape[0]):
            if recent_of[j] == chosen:
                cached = j
                break
        if cached >= 0:
            memcpy(entering, &recent[cached, 0], n * sizeof(double))
            ints[I_REUSED_] += 1
        elif kernel_kind < 0:
            if not ints[I_COLUMN_READY_]:
                return NEED_COLUMN_
            memcpy(entering, &column[0], n * sizeof(double))  # supplied by Python
        elif _column_of(kernel_kind, gamma, degree, coef0, ridge, XT, n, chosen, entering):
            return NON_FINITE_
    ints[I_COLUMN_READY_] = 0
    ints[I_PENDING_] = -1
    if _margin_add(R, columns, margin, store, slot_of, status, n, k, chosen, entering,
                   &fs[F_T_], fs[F_DIAG_SCALE_], degeneracy_tol, &work[0],
                   &w[0] if ints[I_W_VALID_] else NULL,
                   &work[3 * R.shape[0]] if ints[I_Z_VALID_] else NULL,
                   -driven_effect[chosen]):
        ints[I_K_] = k + 1
        g[chosen] = 0.0
        if state == ADDING:
            weight = beta_D[index]
            for i in range(n):
                driven_effect[i] -= K_D[index, i] * weight
            ints[I_Z_VALID_] = 0  # the driven contribution changed at every member
            beta_D[index] = 0.0
            active[index] = 0
            # The subtraction leaves eps |weight| K of round-off in the driven contribution.
            # Where this point's move dwarfs every move still driven (a point added at a large
            # C entering S early, beside removals of coefficients far below C), that round-off
            # dwarfs what the remaining contribution can resolve, and the rest of the path
            # carries it into S's coefficients, below REFINE_TOL's reach (C = 1e8: decision
            # values up to 9e-9 off the optimum after one add-and-forget update, where a fresh
            # fit is within 1e-13). The contribution is recomputed from the moves still driven
            # at the next step instead.
            rest = 0.0
            for j in range(m):
                rest += fabs(beta_D[j])
            if rest > 0.0 and fabs(weight) > 16.0 * rest:
                ints[I_FRESH_] = REFRESH_STEPS
            counts[M_ADDED_MARGIN] += 1
        elif state == ERROR:
            _move_error_column(h, h_abs, h_drift, n, entering, C * y[chosen], C, False)
            counts[M_ERROR_MARGIN] += 1
        else:
            counts[M_RESERVE_MARGIN] += 1
    else:
        blocked[chosen] = 1
        counts[M_REFUSED] += 1
    return DONE_


def refresh_g(double[:, ::1] columns, long[::1] store, Py_ssize_t n, long[::1] margin,
              double[::1] y, double[::1] p, double[::1] gap, double[::1] alpha, signed char[::1] status, double[::1] h,
              double[::1] h_abs, double[::1] h_drift, double b, double kkt_tol, double[::1] g,
              double[::1] terms):
    """Refresh g_i = y_i f(x_i) + p_i with f = h + b + sum_S K(x_i, x_s) y_s alpha_s, and the
    magnitude of the terms summed into it, |p_i| + |b| + h_abs_i + sum_S |K(x_i, x_s)| alpha_s
    (PathEngine.g_terms), from S's packed kernel columns (``store`` maps S's factor order to
    their rows); returns what the checks after an update need: (the largest |g| of S
    relative to its terms, whether every point holds its KKT condition to ``kkt_tol``
    relative to its terms, whether h's accumulated round-off may matter next to that
    tolerance, |sum y alpha| relative to sum alpha: 0 when that is 0)."""
    cdef Py_ssize_t i, k = margin.shape[0]
    cdef double abs_b = fabs(b), violation, residual = 0.0, eps = DBL_EPSILON
    cdef double balance = 0.0, total = 0.0
    cdef bint kkt_ok = True, drifted = False, any_error = False, drift_matters = False
    if g.shape[0] < n or terms.shape[0] < n or store.shape[0] < k:
        raise ValueError("g, terms or store is too short")
    if n == 0:
        return 0.0, True, False, 0.0
    with nogil:
        # Column by column (contiguous rows of ``columns``), each point's sum in S's order,
        # four columns per pass over the points (see stream_svm_margin_sums).
        stream_svm_margin_sums(n, k, &columns[0, 0] if columns.shape[0] else NULL,
                               columns.shape[1], &store[0] if k else NULL,
                               &margin[0] if k else NULL, &alpha[0], &y[0], &g[0], &terms[0])
        for i in range(n):
            balance += y[i] * alpha[i]
            total += alpha[i]
            g[i] = y[i] * (h[i] + b + g[i]) + p[i]
            terms[i] = fabs(p[i]) + abs_b + h_abs[i] + terms[i]
            if status[i] == ERROR:
                any_error = True
                violation = g[i] if g[i] > 0.0 else 0.0
            elif status[i] == MARGIN:
                violation = fabs(g[i])
                if violation / terms[i] > residual:
                    residual = violation / terms[i]
            else:  # reserve: 0 <= g <= gap (the other side's g is gap - g)
                violation = -g[i] if g[i] < 0.0 else (g[i] - gap[i] if g[i] > gap[i] else 0.0)
            if not (isfinite(g[i]) and violation <= kkt_tol * terms[i]):
                kkt_ok = False
            if h_drift[i] != 0.0:
                drifted = True
                if eps * h_drift[i] > 1e-2 * kkt_tol * terms[i]:
                    drift_matters = True
    # h is exactly 0 without error points: recomputing it then costs nothing.
    return (residual, kkt_ok, drifted and (drift_matters or not any_error),
            fabs(balance) / total if total > 0.0 else 0.0)


def admit_points(const double[:, ::1] block, const long[::1] new, const long[::1] new_rows,
                 const long[::1] margin, const long[::1] margin_rows, const long[::1] store,
                 const long[::1] error, const long[::1] error_rows,
                 const long[::1] recent_slots, const long[::1] recent_rows,
                 double[:, ::1] columns, double[:, ::1] recent, double[::1] y,
                 double[::1] p, const double[::1] gap, const double[::1] alpha, double[::1] g,
                 double[::1] h, double[::1] h_abs, double[::1] h_drift,
                 signed char[::1] status, double C, double b, double[::1] new_terms,
                 Py_ssize_t scan_error=-1):
    """Take in new points from their kernel values: ``block[c, r]`` is K(x_new[c], x) for the
    stored point whose row is r (``*_rows`` give the rows of the new points themselves, of S's
    members, of E's and of the points holding recent columns, -1 for a recent slot that holds
    none; the rows are positions when the block holds whole columns). For each new point: its
    entries in S's kernel columns (by ``store``) and in the recent columns (by
    ``recent_slots``), E's contribution h and its size h_abs, h's drift 0, g = y f + p with
    f = h + b + sum_S K y alpha. A point with a finite gap then takes the side nearer to its
    violation (the other side's g is gap - g: y, p and g change sides); one whose condition
    holds (g >= 0) goes to the reserve set, and ``new_terms`` gets the size of the terms of its
    g (|p| + |b| + h_abs + sum_S |K| alpha, for the KKT check). Returns the largest
    K(x_new, x_new), the scale the factor's shift must follow, and how many went to the
    reserve set. With ``scan_error`` >= 0 (whole columns), ``error`` and ``error_rows`` are
    not given: E's members are the positions below it whose status is ERROR, in the same
    (ascending) order. One pass without the GIL, in place of two dozen numpy calls on a few
    points each."""
    cdef Py_ssize_t c, j, m = new.shape[0], k = margin.shape[0], errors = error.shape[0]
    cdef Py_ssize_t kept = recent_slots.shape[0], position, reserved = 0
    cdef double diagonal = -INFINITY, contribution, size, margin_sum, margin_size, value
    cdef const double* row
    cdef long* found = NULL
    cdef const long* error_at = NULL
    cdef const long* error_row_at = NULL
    if (new_rows.shape[0] != m or block.shape[0] < m or new_terms.shape[0] < m
            or margin_rows.shape[0] != k
            or store.shape[0] < k or error_rows.shape[0] != errors
            or recent_rows.shape[0] != kept or scan_error > status.shape[0]
            or scan_error > block.shape[1]):
        raise ValueError("the rows do not match the points")
    if scan_error >= 0:
        found = <long*>malloc((scan_error + 1) * sizeof(long))
        if found == NULL:
            raise MemoryError()
        errors = 0
        for j in range(scan_error):
            if status[j] == ERROR:
                found[errors] = j
                errors += 1
        error_at = error_row_at = found
    elif errors:
        error_at, error_row_at = &error[0], &error_rows[0]
    with nogil:
        for c in range(m):
            row = &block[c, 0]
            position = new[c]
            if row[new_rows[c]] > diagonal:
                diagonal = row[new_rows[c]]
            for j in range(k):
                columns[store[j], position] = row[margin_rows[j]]
            for j in range(kept):
                if recent_rows[j] >= 0:
                    recent[recent_slots[j], position] = row[recent_rows[j]]
            contribution = 0.0
            size = 0.0
            for j in range(errors):
                value = row[error_row_at[j]]
                contribution = contribution + value * (C * y[error_at[j]])
                size = size + fabs(value)
            margin_sum = 0.0
            margin_size = 0.0
            for j in range(k):
                value = row[margin_rows[j]]
                margin_sum = margin_sum + (y[margin[j]] * alpha[margin[j]]) * value
                margin_size = margin_size + alpha[margin[j]] * fabs(value)
            h[position] = contribution
            h_abs[position] = size * C
            h_drift[position] = 0.0
            g[position] = y[position] * (contribution + b + margin_sum) + p[position]
            if g[position] > gap[position] - g[position]:
                y[position] = -y[position]
                p[position] = gap[position] - p[position]
                g[position] = gap[position] - g[position]
            if g[position] >= 0.0:
                status[position] = RESERVE
                reserved += 1
            new_terms[c] = fabs(p[position]) + fabs(b) + h_abs[position] + margin_size
    free(found)
    return diagonal, reserved


def rows_times(const double[:, ::1] rows, const double[::1] weights, double shift,
               double[::1] out) -> None:
    """``out[c] = rows[c] . weights + shift`` for every row (a prediction's kernel values
    against the support vectors, times their coefficients, plus b), without the GIL and on
    this thread alone: a threaded BLAS would leave threads spinning beside the caller after
    every prediction, for a product too small to gain from them."""
    cdef Py_ssize_t c, m = rows.shape[0], width = rows.shape[1]
    if weights.shape[0] != width or out.shape[0] != m:
        raise ValueError(f"{m} x {width} rows, {weights.shape[0]} weights, {out.shape[0]} outputs")
    if width == 0:
        out[:] = shift
        return
    with nogil:
        for c in range(m):
            out[c] = stream_svm_dot(width, &rows[c, 0], &weights[0]) + shift


def fourier_angles(const double[:, ::1] rows, const double[:, ::1] frequencies,
                   const double[::1] phase, double[:, ::1] out) -> None:
    """``out[r] = (sum_j rows[r, j] frequencies[j]) + phase``, the sum taken over j in
    ascending order with the zero features skipped (the angles of a random Fourier map).

    A BLAS product's rounding depends on the matrix's shape (its blocking and kernels differ
    with the inner dimension), so a sample's angles would change in their last bits once the
    map has grown by a feature the sample reads as 0, and forgetting it would no longer
    subtract exactly what learning it added. Here the additions are the same whatever the
    width: a feature added later that reads 0 adds nothing."""
    cdef Py_ssize_t r, j, c, m = rows.shape[0], width = rows.shape[1]
    cdef Py_ssize_t components = frequencies.shape[1]
    cdef double value
    if (width > frequencies.shape[0] or phase.shape[0] != components
            or out.shape[0] != m or out.shape[1] != components):
        raise ValueError(f"{m} x {width} rows, {frequencies.shape[0]} x {components} "
                         f"frequencies, {phase.shape[0]} phases, "
                         f"{out.shape[0]} x {out.shape[1]} outputs")
    if components == 0:
        return
    with nogil:
        for r in range(m):
            for c in range(components):
                out[r, c] = 0.0
            for j in range(width):
                value = rows[r, j]
                if value != 0.0:
                    stream_svm_axpy(components, value, &frequencies[j, 0], &out[r, 0])
            # The phase last, as in (rows @ frequencies) + phase: a sum of two features is
            # then the same whichever comes first.
            for c in range(components):
                out[r, c] = out[r, c] + phase[c]


def count_free(const long[::1] members, const double[::1] alpha, double upper,
               double lower=0.0) -> int:
    """How many of ``members`` (positions) have ``lower`` < alpha < ``upper``."""
    cdef Py_ssize_t j, count = 0, n = alpha.shape[0]
    for j in range(members.shape[0]):
        if not 0 <= members[j] < n:
            raise ValueError(f"position {members[j]} is outside the {n} coefficients")
    with nogil:
        for j in range(members.shape[0]):
            if lower < alpha[members[j]] < upper:
                count += 1
    return count


def has_repeats(const double[:, ::1] X, const long[::1] positions) -> bool:
    """Whether some point of ``positions`` (rows of ``X``) has the features of the one listed
    before it (the two points of a regression sample): one pass, usually finding none."""
    cdef Py_ssize_t c, f, m = positions.shape[0], rows = X.shape[0], dim = X.shape[1]
    cdef bint same = False
    for c in range(m):
        if not 0 <= positions[c] < rows:
            raise ValueError(f"position {positions[c]} is not among the {rows} rows")
    with nogil:
        for c in range(1, m):
            same = True
            for f in range(dim):
                if X[positions[c], f] != X[positions[c - 1], f]:
                    same = False
                    break
            if same:
                break
    return same


def move_error_columns(const double[:, ::1] block, const double[::1] labels, double C,
                       bint joining, Py_ssize_t n, double[::1] h, double[::1] h_abs,
                       double[::1] h_drift) -> None:
    """Add (points joining E) or subtract (points leaving E) their contributions
    C y_c K(x_i, x_c) to h for i < n (``block[c, i]``: the points' kernel columns as rows),
    keeping h's size (h_abs) and its round-off bound (h_drift) up to date: column by column,
    as the breakpoint loop moves a point into or out of E."""
    cdef Py_ssize_t c, m = block.shape[0]
    if labels.shape[0] != m or (m and block.shape[1] < n) or h.shape[0] < n \
            or h_abs.shape[0] < n or h_drift.shape[0] < n:
        raise ValueError("the arrays do not match the points")
    if n == 0:
        return
    with nogil:
        for c in range(m):
            _move_error_column(h, h_abs, h_drift, n, &block[c, 0], C * labels[c], C, joining)


def swap_remove(const long[::1] removed, Py_ssize_t n, double[:, ::1] X,
                double[::1] y, double[::1] p, double[::1] gap, double[::1] alpha,
                double[::1] g, double[::1] h, double[::1] h_abs, double[::1] h_drift,
                signed char[::1] status, long[::1] seq, long[::1] slot, double[:, ::1] XT,
                double[:, ::1] columns, long[::1] margin, double[:, ::1] recent,
                long[::1] recent_of, long[::1] holes, long[::1] movers) -> int:
    """Remove the stored points at the (distinct) positions ``removed`` from the first n, none
    of them in S: the points after the new end n - len(removed) that stay fill the holes the
    removed points leave below it, both taken in descending order (what removing them one at
    a time, highest position first, would do). Moves their rows of X, their entries in the
    per-point vectors, in the feature-by-feature copy ``XT`` (none kept: no rows), in S's
    kernel columns (the first len(margin)) and in the recent columns, S's member list and the
    recent columns' owners (-1 for a removed owner). ``holes`` and ``movers`` (room for
    len(removed)) get the moves; returns their count. One pass without the GIL, in place of
    fifteen fancy-indexed copies and the Python loops that planned them."""
    cdef Py_ssize_t j, r, c, count = 0, m = removed.shape[0], dim = X.shape[1], hole, mover
    cdef Py_ssize_t k = margin.shape[0], end = n - m, limit = X.shape[0], owner
    cdef unsigned char* gone
    cdef long* moved_to
    limit = min(limit, y.shape[0], p.shape[0], gap.shape[0], alpha.shape[0], g.shape[0],
                h.shape[0], h_abs.shape[0], h_drift.shape[0], status.shape[0], seq.shape[0],
                slot.shape[0])
    if XT.shape[0]:
        limit = min(limit, XT.shape[1])
    if k:
        limit = min(limit, columns.shape[1])
    if recent.shape[0]:
        limit = min(limit, recent.shape[1])
    if (n > limit or end < 0 or k > columns.shape[0] or XT.shape[0] not in (0, dim)
            or holes.shape[0] < m or movers.shape[0] < m
            or recent_of.shape[0] != recent.shape[0]):
        raise ValueError("the positions do not match the arrays")
    if m == 0:
        return 0
    gone = <unsigned char*>calloc(n, 1)
    moved_to = <long*>malloc(n * sizeof(long))
    if gone == NULL or moved_to == NULL:
        free(gone)
        free(moved_to)
        raise MemoryError()
    try:
        for j in range(m):
            if not 0 <= removed[j] < n or gone[removed[j]]:
                raise ValueError(f"position {removed[j]} is outside the {n} stored points or "
                                 "listed twice")
            if slot[removed[j]] >= 0:
                raise ValueError(f"position {removed[j]} is in the margin set")
            gone[removed[j]] = 1
        with nogil:
            # Holes below the new end and movers above it, each in descending order: as many
            # of one as of the other.
            hole = end - 1
            mover = n - 1
            while True:
                while hole >= 0 and not gone[hole]:
                    hole -= 1
                while mover >= end and gone[mover]:
                    mover -= 1
                if hole < 0 or mover < end:
                    break
                holes[count] = hole
                movers[count] = mover
                count += 1
                hole -= 1
                mover -= 1
            for j in range(count):
                hole, mover = holes[j], movers[j]
                for r in range(dim):
                    X[hole, r] = X[mover, r]
                status[hole] = status[mover]
                seq[hole] = seq[mover]
                slot[hole] = slot[mover]
                y[hole] = y[mover]
                p[hole] = p[mover]
                gap[hole] = gap[mover]
                alpha[hole] = alpha[mover]
                g[hole] = g[mover]
                h[hole] = h[mover]
                h_abs[hole] = h_abs[mover]
                h_drift[hole] = h_drift[mover]
                if slot[hole] >= 0:
                    margin[slot[hole]] = hole
            for r in range(XT.shape[0]):
                for j in range(count):
                    XT[r, holes[j]] = XT[r, movers[j]]
            for c in range(k):
                for j in range(count):
                    columns[c, holes[j]] = columns[c, movers[j]]
            # The recent columns follow their points: dropped with them, or to their holes.
            for j in range(n):
                moved_to[j] = -1 if gone[j] else j
            for j in range(count):
                moved_to[movers[j]] = holes[j]
            for c in range(recent.shape[0]):
                owner = recent_of[c]
                if owner >= 0:
                    recent_of[c] = moved_to[owner] if owner < n else -1
                    if recent_of[c] >= 0:
                        for j in range(count):
                            recent[c, holes[j]] = recent[c, movers[j]]
    finally:
        free(gone)
        free(moved_to)
    return count


def margin_remove(double[:, ::1] R, double[:, ::1] columns, long[::1] margin, long[::1] store,
                  long[::1] slot_of, Py_ssize_t n, Py_ssize_t slot, double[::1] column) -> None:
    """Remove S's member at factor ``slot`` (of the ``margin.shape[0]`` members) outside the
    loop: its factor column by Givens rotations in ``R[:k, :k]``, its kernel column copied to
    ``column`` (the last packed column takes its row of ``columns``), ``margin`` and ``store``
    shifted after it."""
    cdef Py_ssize_t k = margin.shape[0]
    if not (0 <= slot < k <= R.shape[0] and k <= columns.shape[0] and k <= store.shape[0]
            and n <= columns.shape[1] and column.shape[0] >= n):
        raise ValueError(f"slot {slot} is not among the {k} members of S")
    with nogil:
        _margin_remove(R, columns, margin, store, slot_of, n, k, slot, &column[0], NULL, NULL)


def keep_rows(double[:, ::1] block, const unsigned char[::1] keep) -> int:
    """Move the rows of ``block`` marked in ``keep`` (one flag per leading row) up over the
    others, in order, in place; returns how many were kept."""
    cdef Py_ssize_t r, kept = 0, m = keep.shape[0], width = block.shape[1]
    if m > block.shape[0]:
        raise ValueError(f"{m} flags for {block.shape[0]} rows")
    with nogil:
        for r in range(m):
            if keep[r]:
                if r != kept:
                    memcpy(&block[kept, 0], &block[r, 0], width * sizeof(double))
                kept += 1
    return kept


def leave_sets(const long[::1] removed, signed char[::1] status, const double[::1] alpha,
               double[:, ::1] R, double[:, ::1] columns, long[::1] margin, long[::1] store,
               long[::1] slot_of, Py_ssize_t k, Py_ssize_t n, double[:, ::1] block,
               long[::1] order) -> tuple:
    """Points to remove leave their sets, in the order given: S's members one at a time (as
    ``margin_remove``, each one's kernel column copied to the next row of ``block``, kept
    there only if its coefficient is not 0), then every one marked REMOVING. ``order`` gets
    the positions the path must drive to 0 (S's members with a coefficient, in the order
    given, then E's), then those whose coefficient is 0 already. Returns (S's size now, how
    many of S's members and of E's members are to be driven). RuntimeError, with nothing
    changed, for a reserve point whose coefficient is not 0 (a broken engine: it must stop
    rather than drop it)."""
    cdef Py_ssize_t c, m = removed.shape[0], driven = 0, errors = 0, settled = 0, position
    if (order.shape[0] < m or block.shape[0] < m or (m and block.shape[1] < n)
            or k > margin.shape[0] or k > R.shape[0] or k > columns.shape[0]
            or k > store.shape[0] or n > columns.shape[1]
            or slot_of.shape[0] < status.shape[0] or alpha.shape[0] < status.shape[0]):
        raise ValueError("the arrays do not fit the points to remove")
    for c in range(m):
        position = removed[c]
        if not 0 <= position < status.shape[0]:
            raise ValueError(f"position {position} is not a stored point's")
        if status[position] != MARGIN and status[position] != ERROR and alpha[position] != 0.0:
            raise RuntimeError("a reserve point to remove has a coefficient other than 0")
        if status[position] == MARGIN and not 0 <= slot_of[position] < k:
            raise ValueError(f"S's member {position} has no slot among the {k} members")
    with nogil:
        for c in range(m):
            position = removed[c]
            if status[position] == MARGIN:
                _margin_remove(R, columns, margin, store, slot_of, n, k, slot_of[position],
                               &block[driven, 0], NULL, NULL)
                k -= 1
                if alpha[position] != 0.0:
                    order[driven] = position
                    driven += 1
        for c in range(m):
            position = removed[c]
            if status[position] == ERROR and alpha[position] != 0.0:
                order[driven + errors] = position
                errors += 1
        for c in range(m):
            position = removed[c]
            if alpha[position] == 0.0:
                order[driven + errors + settled] = position
                settled += 1
            status[position] = REMOVING
    return k, driven, errors


# What check_points reports: the points to add are valid, or the first input found wrong.
cdef enum:
    POINTS_VALID_ = 0
    FEATURES_NOT_FINITE_ = 1
    LABEL_NOT_SIGN_ = 2
    LINEAR_NOT_FINITE_ = 3
    GAP_NOT_NONNEGATIVE_ = 4

POINTS_VALID, FEATURES_NOT_FINITE, LABEL_NOT_SIGN, LINEAR_NOT_FINITE, GAP_NOT_NONNEGATIVE = (
    POINTS_VALID_, FEATURES_NOT_FINITE_, LABEL_NOT_SIGN_, LINEAR_NOT_FINITE_,
    GAP_NOT_NONNEGATIVE_)


cdef int _check_points(const double[:, ::1] X, const double[::1] y, const double[::1] linear,
                       const double[::1] gap) noexcept nogil:
    cdef Py_ssize_t i, j
    for i in range(X.shape[0]):
        for j in range(X.shape[1]):
            if not isfinite(X[i, j]):
                return FEATURES_NOT_FINITE_
    for i in range(y.shape[0]):
        if y[i] != 1.0 and y[i] != -1.0:
            return LABEL_NOT_SIGN_
    for i in range(linear.shape[0]):
        if not isfinite(linear[i]):
            return LINEAR_NOT_FINITE_
    for i in range(gap.shape[0]):
        if not gap[i] >= 0.0:  # nan fails too
            return GAP_NOT_NONNEGATIVE_
    return POINTS_VALID_


def check_points(const double[:, ::1] X, const double[::1] y, const double[::1] linear,
                 const double[::1] gap) -> int:
    """Whether points to add are valid (``POINTS_VALID``), else the first input, in this order,
    holding a wrong value: a feature not finite, a label not +1 or -1, a linear term not finite,
    a gap not a number >= 0 (inf is one). One pass each, in place of a dozen numpy calls on a
    point or a few."""
    cdef int code
    if y.shape[0] != X.shape[0] or linear.shape[0] != X.shape[0] or gap.shape[0] != X.shape[0]:
        raise ValueError("the inputs hold different numbers of points")
    with nogil:
        code = _check_points(X, y, linear, gap)
    return code


def append_points(Py_ssize_t n, const double[:, ::1] X_add, const double[::1] y_add,
                  const double[::1] linear, const double[::1] gap_add, double[:, ::1] X,
                  double[:, ::1] XT, double[::1] y, double[::1] p, double[::1] gap,
                  double[::1] alpha, double[::1] g, double[::1] h, signed char[::1] status,
                  long[::1] slot_of, long[::1] seq, long first_seq) -> None:
    """Store new points at positions n, n + 1, ...: their features (in X and, when it is kept,
    no rows otherwise, the feature-by-feature copy XT), labels, linear terms and gaps, alpha,
    g and h 0, status ADDING, no slot in S, sequence numbers from ``first_seq``. The arrays must
    have room (checked). One pass in place of fourteen slice assignments."""
    cdef Py_ssize_t i, j, m = X_add.shape[0], dim = X.shape[1], position
    cdef Py_ssize_t room = min(X.shape[0], y.shape[0], p.shape[0], gap.shape[0], alpha.shape[0],
                               g.shape[0], h.shape[0], status.shape[0], slot_of.shape[0],
                               seq.shape[0])
    if XT.shape[0]:
        room = min(room, XT.shape[1])
    if (X_add.shape[1] != dim or y_add.shape[0] != m or linear.shape[0] != m
            or gap_add.shape[0] != m or XT.shape[0] not in (0, dim)):
        raise ValueError("the new points do not match the stored arrays")
    if n < 0 or n + m > room:
        raise ValueError(f"no room for {m} more points after {n}")
    with nogil:
        for i in range(m):
            position = n + i
            for j in range(dim):
                X[position, j] = X_add[i, j]
            for j in range(XT.shape[0]):
                XT[j, position] = X_add[i, j]
            y[position] = y_add[i]
            p[position] = linear[i]
            gap[position] = gap_add[i]
            alpha[position] = 0.0
            g[position] = 0.0
            h[position] = 0.0
            status[position] = ADDING
            slot_of[position] = -1
            seq[position] = first_seq + i
