/* cffi declarations for aicpu_kernels/attention_mla_ref.h. Values written "..." are filled in
 * by the compiler from the real header. Needs aicpu_tiling.cdef.h first (aicpu_tiling_params). */
#define AICPU_MLA_STACK_BYTES ...

int aicpu_mla_params_check(const aicpu_tiling_params *params, int32_t kv_lora_rank);
int aicpu_mla_core(const aicpu_tiling_params *params, int32_t kv_lora_rank, const int32_t *tiling,
                   int32_t core, uint32_t flags, int32_t dtype, float scale, const void *q_nope,
                   const void *q_pe, const void *kv_c_cache, const void *k_pe_cache,
                   int32_t num_blocks, const int32_t *block_table, const int32_t *cu_seqlens_q,
                   const int32_t *seqlens_kv, void *out, float *partial_out,
                   float *partial_lse);
int aicpu_mla_finalize(const aicpu_tiling_params *params, int32_t kv_lora_rank,
                       const int32_t *tiling, int32_t dtype, const int32_t *cu_seqlens_q,
                       void *out, const float *partial_out, const float *partial_lse);
