/* cffi declarations for aicpu_kernels/attention_ref.h. Values written "..." are filled in
 * by the compiler from the real header. Needs aicpu_tiling.cdef.h first (aicpu_tiling_params). */
#define AICPU_ATTENTION_FP32 ...
#define AICPU_ATTENTION_FP16 ...
#define AICPU_ATTENTION_BF16 ...

#define AICPU_ATTENTION_E_ARGS ...
#define AICPU_ATTENTION_E_TILING ...
#define AICPU_ATTENTION_E_BLOCK_ID ...

#define AICPU_ATTENTION_STACK_BYTES ...

#define AICPU_ATTENTION_KV_ND ...
#define AICPU_ATTENTION_KV_NZ ...

typedef struct {
    const float *k_scale;
    const float *k_offset;
    const float *v_scale;
    const float *v_offset;
    int32_t layout;
} aicpu_attention_kv_int8;

int aicpu_attention_core(const aicpu_tiling_params *params, const int32_t *tiling, int32_t core,
                         uint32_t flags, int32_t dtype, float scale, float soft_cap,
                         const float *sinks, int32_t sliding_window,
                         const aicpu_attention_kv_int8 *kv_int8, const void *query,
                         const void *key_cache, const void *value_cache,
                         int32_t num_blocks, int64_t key_block_stride,
                         int64_t value_block_stride, const int32_t *block_table,
                         const int32_t *cu_seqlens_q, const int32_t *seqlens_kv,
                         void *out, float *partial_out,
                         float *partial_lse);
int32_t aicpu_attention_num_sibling_sets(const aicpu_tiling_params *params);
int aicpu_attention_core_siblings(const aicpu_tiling_params *params, const int32_t *tiling,
                                  int32_t first_core, uint32_t flags, int32_t dtype, float scale,
                                  float soft_cap, const float *sinks, int32_t sliding_window,
                                  const aicpu_attention_kv_int8 *kv_int8, const void *query,
                                  const void *key_cache, const void *value_cache,
                                  int32_t num_blocks, int64_t key_block_stride,
                                  int64_t value_block_stride, const int32_t *block_table,
                                  const int32_t *cu_seqlens_q, const int32_t *seqlens_kv,
                                  void *out, float *partial_out,
                                  float *partial_lse);
int aicpu_attention_core_span(const aicpu_tiling_params *params, const int32_t *tiling,
                              int32_t first_core, int32_t num_cores, uint32_t flags,
                              int32_t dtype, float scale, float soft_cap, const float *sinks,
                              int32_t sliding_window, const aicpu_attention_kv_int8 *kv_int8,
                              const void *query, const void *key_cache,
                              const void *value_cache, int32_t num_blocks,
                              int64_t key_block_stride, int64_t value_block_stride,
                              const int32_t *block_table, const int32_t *cu_seqlens_q,
                              const int32_t *seqlens_kv, void *out, float *partial_out,
                              float *partial_lse);
int aicpu_attention_finalize(const aicpu_tiling_params *params, const int32_t *tiling,
                             int32_t dtype, const int32_t *cu_seqlens_q, void *out,
                             const float *partial_out, const float *partial_lse,
                             const float *sinks);
void aicpu_attention_set_block_log(int32_t *log, int32_t capacity, int32_t *count);
const char *aicpu_attention_strerror(int status);

float aicpu_attention_half_to_float(uint16_t h);
uint16_t aicpu_attention_float_to_half(float f);
float aicpu_attention_bf16_to_float(uint16_t b);
uint16_t aicpu_attention_float_to_bf16(float f);

#define AICPU_ATTENTION_ISA_PORTABLE ...
#define AICPU_ATTENTION_ISA_AVX2 ...
#define AICPU_ATTENTION_ISA_AVX512 ...
#define AICPU_ATTENTION_NUM_ISA ...
#define AICPU_ATTENTION_E_ISA ...
const char *aicpu_attention_isa_name(int32_t isa);
int aicpu_attention_isa_supported(int32_t isa);
int32_t aicpu_attention_isa_best(void);
int32_t aicpu_attention_isa_active(void);
int aicpu_attention_set_isa(int32_t isa);
