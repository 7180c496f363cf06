// Ends the scope of <certattn/arch/macros.hpp>. No include guard.
#undef CERTATTN_X86
#undef CERTATTN_TARGET_AVX2
#undef CERTATTN_TARGET_AVX512
#undef CERTATTN_ARCH_BEGIN
#undef CERTATTN_ARCH_END
#undef CERTATTN_PORTABLE_SIMD
#undef CERTATTN_NO_FP_CONTRACT
