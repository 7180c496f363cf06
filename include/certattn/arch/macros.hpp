// certattn's internal macros for the instruction-set kernels. Every header that uses them
// includes this file after its other includes and <certattn/arch/macros_undef.hpp> at its
// end, so none of them leaks into the includer. No include guard: each such header
// defines them afresh.
//
//   CERTATTN_X86             1 on x86-64 with GCC or Clang (the runtime-dispatched kernels)
//   CERTATTN_TARGET_AVX2     function attribute of an AVX2 + FMA + F16C kernel
//   CERTATTN_TARGET_AVX512   function attribute of an AVX-512 (F/BW/DQ/VL/VNNI) kernel
//   CERTATTN_ARCH_BEGIN/END  silence GCC's false -Wmaybe-uninitialized inside its own
//                            AVX-512 intrinsic headers (the `__Y = __Y` idiom of
//                            _mm512_undefined_*); Clang has neither the false positive nor
//                            the first warning group
//   CERTATTN_PORTABLE_SIMD   1 where the portable (xsimd) kernels run: NEON on aarch64,
//                            and x86-64 targets with FMA (-mfma, -mavx2 -mfma,
//                            -march=native on a current CPU); elsewhere, including the
//                            default x86-64 target (SSE2), their scalar twins run
//                            (arch/portable.hpp says why)
//   CERTATTN_NO_FP_CONTRACT  keeps GCC from fusing a product and a sum in one function
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CERTATTN_X86 1
#define CERTATTN_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define CERTATTN_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))
#if defined(__clang__)
#define CERTATTN_ARCH_BEGIN
#define CERTATTN_ARCH_END
#else
#define CERTATTN_ARCH_BEGIN                                       \
  _Pragma("GCC diagnostic push")                                  \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"") \
          _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define CERTATTN_ARCH_END _Pragma("GCC diagnostic pop")
#endif
#else
#define CERTATTN_X86 0
#define CERTATTN_TARGET_AVX2
#define CERTATTN_TARGET_AVX512
#define CERTATTN_ARCH_BEGIN
#define CERTATTN_ARCH_END
#endif

#if (defined(__aarch64__) && defined(__ARM_NEON)) || (defined(__x86_64__) && defined(__FMA__))
#define CERTATTN_PORTABLE_SIMD 1
#else
#define CERTATTN_PORTABLE_SIMD 0
#endif

#if defined(__clang__)
// Clang contracts only within one source expression: intrinsics are never fused.
#define CERTATTN_NO_FP_CONTRACT
#else
#define CERTATTN_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#endif
