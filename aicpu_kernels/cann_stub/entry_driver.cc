/*
 * NOT CANN. Host test driver for the AI-CPU entry points, built against the
 * declaration-compatible stand-in in this directory (see cann_stub_testing.h).
 *
 * Drives both wrappers with host buffers and checks that each writes exactly the bytes
 * (and returns the code) that a direct aicpu_tiling_plan() call implies:
 *   - the classic aicpu::CpuKernel "AicpuTilingPlan" (looked up through the registry
 *     that REGISTER_CPU_KERNEL fills), fed through CpuKernelContext tensors + attrs;
 *   - the Ascend C entry aicpu_tiling_kernel(void *args), fed an argument block.
 *
 * Usage: entry_driver list | all | <case> | random <count> <seed>
 * Prints "PASS <case>" or "FAIL <case>: <why>" lines; exits 0 when all pass.
 * Used by tests/test_aicpu_entry.py; also built by CMake with -DAICPU_TILING_TARGET=host_stub.
 */
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "aicpu_api.h"
#include "cann_stub_testing.h"
#include "cpu_kernel.h"
#include "status.h"

#include "../aicpu/tiling_kernel_args.h"
#include "../aicpu_tiling.h"

extern "C" uint32_t aicpu_tiling_kernel(void *args);

namespace {

using aicpu::CpuKernelUtils;
using Words = std::vector<int32_t>;

const int32_t kSentinel = static_cast<int32_t>(0xA5A5A5A5u);
std::string g_why;

bool Fail(const std::string &why)
{
    g_why = why;
    return false;
}

aicpu_tiling_params BaseParams()
{
    aicpu_tiling_params p;
    std::memset(&p, 0, sizeof p);
    p.num_q_heads = 8;
    p.num_kv_heads = 2;
    p.head_dim = 128;
    p.block_size = 16;
    p.max_batch = 8;
    p.max_tokens = 64;
    p.max_blocks_per_req = 64;
    p.num_cores = 6;
    p.q_tile = 4;
    p.cost_kv_load = AICPU_TILING_DEFAULT_COST_KV_LOAD;
    p.cost_qk_tile = AICPU_TILING_DEFAULT_COST_QK_TILE;
    p.cost_segment = AICPU_TILING_DEFAULT_COST_SEGMENT;
    return p;
}

/* Words of a tiling buffer for p; at least one word so .data() is never null. */
size_t BufWords(const aicpu_tiling_params &p)
{
    const size_t bytes = aicpu_tiling_bytes(&p);
    return bytes ? bytes / 4 : AICPU_TILING_HDR_WORDS;
}

struct Direct {
    int status;
    Words buf;
};

Direct RunDirect(const aicpu_tiling_params &p, const Words &cu, const Words &kv, int32_t batch,
                 uint32_t flags, size_t bytes, size_t words)
{
    Direct d;
    d.buf.assign(words, kSentinel);
    d.status = aicpu_tiling_plan(&p, cu.data(), kv.data(), batch, 0, flags, d.buf.data(), bytes);
    return d;
}

uint32_t Expected(int status)
{
    return (status == AICPU_TILING_E_PARAMS || status == AICPU_TILING_E_BUFFER) ? 1u : 0u;
}

/* ---- classic model ---- */

struct Classic {
    bool with_live = false;    /* add input 2 */
    int32_t live = 0;
    bool live_null = false;    /* input 2 present with no data (absent optional) */
    bool drop_attr = false;    /* leave out `drop_name` */
    std::string drop_name;
    bool set_causal = true;    /* pass the causal attribute */
    int64_t bad_attr_value = 0;
    std::string bad_attr;      /* attribute to set to bad_attr_value */
    int64_t cu_elements = -2;  /* override NumElements() of input 0 (-2: exact) */
    bool drop_output = false;
};

uint32_t RunClassic(const aicpu_tiling_params &p, uint32_t flags, Words cu, Words kv,
                    Words *out, size_t out_bytes, const Classic &o = Classic())
{
    std::shared_ptr<aicpu::CpuKernel> k = CpuKernelUtils::CreateKernel("AicpuTilingPlan");
    if (!k) {
        return 99;
    }
    auto ctx = CpuKernelUtils::NewContext("AicpuTilingPlan");
    const int64_t cu_n = o.cu_elements == -2 ? static_cast<int64_t>(cu.size()) : o.cu_elements;
    CpuKernelUtils::AddInput(*ctx, cu.data(), 4 * cu.size(), cu_n);
    CpuKernelUtils::AddInput(*ctx, kv.empty() ? nullptr : kv.data(), 4 * kv.size(),
                             static_cast<int64_t>(kv.size()));
    int32_t live = o.live;
    if (o.with_live) {
        CpuKernelUtils::AddInput(*ctx, o.live_null ? nullptr : &live, o.live_null ? 0 : 4,
                                 o.live_null ? 0 : 1);
    }
    if (!o.drop_output) {
        CpuKernelUtils::AddOutput(*ctx, out->data(), out_bytes,
                                  static_cast<int64_t>(out_bytes / 4));
    }
    const struct {
        const char *name;
        int32_t value;
    } attrs[] = {
        {"num_q_heads", p.num_q_heads}, {"num_kv_heads", p.num_kv_heads},
        {"head_dim", p.head_dim},       {"block_size", p.block_size},
        {"max_batch", p.max_batch},     {"max_tokens", p.max_tokens},
        {"max_blocks_per_req", p.max_blocks_per_req},
        {"num_cores", p.num_cores},     {"q_tile", p.q_tile},
        {"cost_kv_load", p.cost_kv_load}, {"cost_qk_tile", p.cost_qk_tile},
        {"cost_segment", p.cost_segment}, {"sliding_window", p.sliding_window},
    };
    for (const auto &a : attrs) {
        if (!(o.drop_attr && o.drop_name == a.name)) {
            CpuKernelUtils::SetAttrInt(*ctx, a.name, a.value);
        }
    }
    if (o.set_causal) {
        CpuKernelUtils::SetAttrInt(*ctx, "causal", (flags & AICPU_TILING_CAUSAL) ? 1 : 0);
    }
    if (!o.bad_attr.empty()) {
        CpuKernelUtils::SetAttrInt(*ctx, o.bad_attr, o.bad_attr_value);
    }
    return k->Compute(*ctx);
}

/* ---- Ascend C model ---- */

uint32_t RunAscendC(aicpu_tiling_kernel_args *args, bool *barrier_ok)
{
    const unsigned long before = AscendC::StubDataStoreBarrierCount();
    const uint32_t r = aicpu_tiling_kernel(args);
    *barrier_ok = AscendC::StubDataStoreBarrierCount() == before + 1;
    return r;
}

aicpu_tiling_kernel_args MakeArgs(const aicpu_tiling_params &p, uint32_t flags, Words &cu,
                                  Words &kv, int32_t batch, int32_t *live, Words &out,
                                  size_t out_bytes)
{
    aicpu_tiling_kernel_args a;
    aicpu_tiling_kernel_args_init(&a, &p, flags);
    a.cu_seqlens_q = AICPU_TILING_ADDR(cu.data());
    a.seqlens_kv = AICPU_TILING_ADDR(kv.empty() ? nullptr : kv.data());
    a.live_batch = AICPU_TILING_ADDR(live);
    a.batch = batch;
    a.buffer = AICPU_TILING_ADDR(out.data());
    a.buffer_bytes = out_bytes;
    return a;
}

std::string Describe(const Words &a, const Words &b)
{
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        if (a[i] != b[i]) {
            char s[128];
            std::snprintf(s, sizeof s, "word %zu differs: %d vs %d (of %zu)", i, a[i], b[i],
                          a.size());
            return s;
        }
    }
    return "sizes differ";
}

/*
 * The core check: for these inputs, the classic kernel (without and with the live batch
 * input) and the Ascend C entry (without and with a live batch pointer) each return the
 * code and write the bytes implied by a direct aicpu_tiling_plan() call.
 * cu/kv hold `batch` requests for the plain calls; for the live-batch calls they are
 * padded with zero-length requests to max_batch.
 */
bool CheckAll(const aicpu_tiling_params &p, uint32_t flags, const Words &cu_in,
              const Words &kv_in, int32_t batch, size_t out_bytes, int *status_out = nullptr)
{
    const size_t words = out_bytes / 4 + 1; /* one spare word, never written */
    Direct d = RunDirect(p, cu_in, kv_in, batch, flags, out_bytes, words);
    if (status_out) {
        *status_out = d.status;
    }
    const uint32_t want = Expected(d.status);

    /* Arrays padded to max_batch for the live-batch variants. */
    Words cu_pad = cu_in, kv_pad = kv_in;
    const int32_t last = cu_in.empty() ? 0 : cu_in.back();
    /* Capacity of the padded arrays: max_batch, or more when the caller's arrays hold
     * more. Never the batch itself: live values past max_batch are never read. */
    const size_t cap = static_cast<size_t>(p.max_batch) > kv_in.size()
                           ? static_cast<size_t>(p.max_batch) : kv_in.size();
    if (p.max_batch >= 1) {
        while (kv_pad.size() < cap) kv_pad.push_back(0);
        while (cu_pad.size() < cap + 1) cu_pad.push_back(last);
    }
    /* Batch values outside [0, capacity] cannot be described by a tensor shape; the
     * plain classic variant is skipped for them. */
    const bool plain_ok = batch >= 0 && static_cast<size_t>(batch) == kv_in.size()
                          && cu_in.size() == kv_in.size() + 1;

    for (int variant = 0; variant < 4; ++variant) {
        Words out(words, kSentinel);
        uint32_t r = 0;
        bool barrier_ok = true;
        const char *name = "";
        if (variant == 0) {
            if (!plain_ok) continue;
            name = "classic";
            r = RunClassic(p, flags, cu_in, kv_in, &out, out_bytes);
        } else if (variant == 1) {
            if (p.max_batch < 1) continue;
            name = "classic+live";
            Classic o;
            o.with_live = true;
            o.live = batch;
            r = RunClassic(p, flags, cu_pad, kv_pad, &out, out_bytes, o);
        } else if (variant == 2) {
            if (batch < 0) continue;
            name = "ascendc";
            Words cu = cu_in, kv = kv_in;
            if (cu.size() < static_cast<size_t>(batch) + 1 || kv.size() < static_cast<size_t>(batch))
                continue;
            aicpu_tiling_kernel_args a = MakeArgs(p, flags, cu, kv, batch, nullptr, out, out_bytes);
            r = RunAscendC(&a, &barrier_ok);
        } else {
            if (p.max_batch < 1) continue;
            name = "ascendc+live";
            int32_t live = batch;
            aicpu_tiling_kernel_args a = MakeArgs(p, flags, cu_pad, kv_pad,
                                                  static_cast<int32_t>(cap), &live, out, out_bytes);
            r = RunAscendC(&a, &barrier_ok);
        }
        if (r != want) {
            char s[160];
            std::snprintf(s, sizeof s, "%s returned %u, expected %u (plan status %d)", name, r,
                          want, d.status);
            return Fail(s);
        }
        if (!barrier_ok) {
            return Fail(std::string(name) + ": DataStoreBarrier not called exactly once");
        }
        if (out != d.buf) {
            return Fail(std::string(name) + ": buffer differs from direct call: "
                        + Describe(out, d.buf));
        }
    }
    return true;
}

/* A small mixed batch: decode, speculative, prefill chunk, padded slot. */
void MixedBatch(Words *cu, Words *kv)
{
    *cu = {0, 1, 4, 20, 20, 21};
    *kv = {100, 37, 16, 0, 900};
}

/* ---- named cases ---- */

bool CaseRegistry()
{
    if (!CpuKernelUtils::CreateKernel("AicpuTilingPlan")) {
        return Fail("no kernel registered under \"AicpuTilingPlan\"");
    }
    return true;
}

bool CaseDecode()
{
    const aicpu_tiling_params p = BaseParams();
    Words cu = {0, 1, 2, 3, 4}, kv = {5, 300, 17, 1000};
    int st = -1;
    if (!CheckAll(p, AICPU_TILING_CAUSAL, cu, kv, 4, aicpu_tiling_bytes(&p), &st)) return false;
    return st == AICPU_TILING_OK ? true : Fail("plan status " + std::to_string(st));
}

bool CaseMixedCausal()
{
    const aicpu_tiling_params p = BaseParams();
    Words cu, kv;
    MixedBatch(&cu, &kv);
    int st = -1;
    if (!CheckAll(p, AICPU_TILING_CAUSAL, cu, kv, 5, aicpu_tiling_bytes(&p), &st)) return false;
    return st == AICPU_TILING_OK ? true : Fail("plan status " + std::to_string(st));
}

bool CaseNonCausal()
{
    const aicpu_tiling_params p = BaseParams();
    Words cu, kv;
    MixedBatch(&cu, &kv);
    kv[3] = 0; /* padded slot stays valid */
    int st = -1;
    if (!CheckAll(p, 0, cu, kv, 5, aicpu_tiling_bytes(&p), &st)) return false;
    return st == AICPU_TILING_OK ? true : Fail("plan status " + std::to_string(st));
}

bool CaseSlidingWindow()
{
    /* ABI v5: the window travels in the classic attribute and in the Ascend C argument
     * block's params; both write the direct call's bytes. Without causal it is E_PARAMS,
     * which both entries refuse. */
    aicpu_tiling_params p = BaseParams();
    p.sliding_window = 20;
    Words cu, kv;
    MixedBatch(&cu, &kv);
    int st = -1;
    if (!CheckAll(p, AICPU_TILING_CAUSAL, cu, kv, 5, aicpu_tiling_bytes(&p), &st)) return false;
    if (st != AICPU_TILING_OK) return Fail("windowed plan status " + std::to_string(st));
    if (!CheckAll(p, 0, cu, kv, 5, aicpu_tiling_bytes(&p), &st)) return false;
    return st == AICPU_TILING_E_PARAMS ? true
                                       : Fail("window without causal: status " + std::to_string(st));
}

bool CaseEmptyBatch()
{
    const aicpu_tiling_params p = BaseParams();
    int st = -1;
    if (!CheckAll(p, AICPU_TILING_CAUSAL, Words{0}, Words{}, 0, aicpu_tiling_bytes(&p), &st))
        return false;
    return st == AICPU_TILING_OK ? true : Fail("plan status " + std::to_string(st));
}

bool CaseInvalidInput()
{
    /* Each input error: the buffer holds the offence, the kernels return OK. */
    const aicpu_tiling_params p = BaseParams();
    const size_t bytes = aicpu_tiling_bytes(&p);
    struct {
        Words cu, kv;
        int want;
    } cases[] = {
        {{0, 3, 2}, {10, 10}, AICPU_TILING_E_QUERY_DECREASING},
        {{1, 2}, {10}, AICPU_TILING_E_QUERY_START},
        {{0, 65}, {100}, AICPU_TILING_E_QUERY_OVERFLOW},
        {{0, 1, 2}, {10, -1}, AICPU_TILING_E_KV_NEGATIVE},
        {{0, 4}, {3}, AICPU_TILING_E_KV_SHORT},
        {{0, 1}, {64 * 16 + 1}, AICPU_TILING_E_KV_CAPACITY},
    };
    for (auto &c : cases) {
        int st = -1;
        if (!CheckAll(p, AICPU_TILING_CAUSAL, c.cu, c.kv, static_cast<int32_t>(c.kv.size()),
                      bytes, &st))
            return false;
        if (st != c.want) {
            return Fail("plan status " + std::to_string(st) + ", expected " + std::to_string(c.want));
        }
    }
    /* Header names the offence, as written through the wrapper. */
    Words cu = {0, 3, 2}, kv = {10, 10};
    Words out(bytes / 4, kSentinel);
    if (RunClassic(p, AICPU_TILING_CAUSAL, cu, kv, &out, bytes) != aicpu::KERNEL_STATUS_OK)
        return Fail("classic did not return KERNEL_STATUS_OK on an input error");
    if (out[AICPU_TILING_HDR_MAGIC] != AICPU_TILING_MAGIC
        || out[AICPU_TILING_HDR_STATUS] != AICPU_TILING_E_QUERY_DECREASING
        || out[AICPU_TILING_HDR_BAD_REQUEST] != 1)
        return Fail("header does not name the offence");
    return true;
}

bool CaseLiveBatch()
{
    /* Live batch smaller than the arrays: only the first `live` requests are planned. */
    const aicpu_tiling_params p = BaseParams();
    const size_t bytes = aicpu_tiling_bytes(&p);
    Words cu = {0, 1, 2, 3, 4, 5, 6, 7, 8}, kv = {10, 20, 30, 40, 50, 60, 70, 80};
    for (int32_t live = 0; live <= p.max_batch; ++live) {
        Words cu_live(cu.begin(), cu.begin() + live + 1), kv_live(kv.begin(), kv.begin() + live);
        Direct d = RunDirect(p, cu_live, kv_live, live, AICPU_TILING_CAUSAL, bytes, bytes / 4);
        Words out(bytes / 4, kSentinel);
        Classic o;
        o.with_live = true;
        o.live = live;
        if (RunClassic(p, AICPU_TILING_CAUSAL, cu, kv, &out, bytes, o) != 0 || out != d.buf)
            return Fail("classic live batch " + std::to_string(live));
        Words out2(bytes / 4, kSentinel);
        int32_t lv = live;
        aicpu_tiling_kernel_args a = MakeArgs(p, AICPU_TILING_CAUSAL, cu, kv, 8, &lv, out2, bytes);
        bool barrier_ok = false;
        if (RunAscendC(&a, &barrier_ok) != 0 || out2 != d.buf || !barrier_ok)
            return Fail("ascendc live batch " + std::to_string(live));
        if (out[AICPU_TILING_HDR_BATCH] != live)
            return Fail("header batch != live batch");
    }
    /* An absent optional input (no data) means: no live batch. */
    Words out(bytes / 4, kSentinel);
    Classic o;
    o.with_live = true;
    o.live_null = true;
    Direct d = RunDirect(p, cu, kv, 8, AICPU_TILING_CAUSAL, bytes, bytes / 4);
    if (RunClassic(p, AICPU_TILING_CAUSAL, cu, kv, &out, bytes, o) != 0 || out != d.buf)
        return Fail("absent optional live batch input");
    return true;
}

bool CaseLiveBatchOutOfRange()
{
    /* Live values outside [0, max_batch]: E_BATCH in the header, kernels return OK. */
    const aicpu_tiling_params p = BaseParams();
    Words cu = {0, 1, 2, 3, 4, 5, 6, 7, 8}, kv = {10, 20, 30, 40, 50, 60, 70, 80};
    for (int32_t live : {-1, 9, 1 << 30}) {
        int st = -1;
        if (!CheckAll(p, AICPU_TILING_CAUSAL, cu, kv, live, aicpu_tiling_bytes(&p), &st))
            return false;
        if (st != AICPU_TILING_E_BATCH)
            return Fail("plan status " + std::to_string(st) + " for live " + std::to_string(live));
    }
    return true;
}

bool UntouchedAnd(const Words &out, uint32_t r, uint32_t want, const char *what)
{
    if (r != want) {
        return Fail(std::string(what) + ": returned " + std::to_string(r) + ", expected "
                    + std::to_string(want));
    }
    for (int32_t w : out) {
        if (w != kSentinel) return Fail(std::string(what) + ": buffer was written");
    }
    return true;
}

bool CaseSmallBuffer()
{
    const aicpu_tiling_params p = BaseParams();
    const size_t bytes = aicpu_tiling_bytes(&p);
    Words cu, kv;
    MixedBatch(&cu, &kv);
    for (size_t small : {bytes - 4, bytes - 64, size_t(60), size_t(0)}) {
        int st = -1;
        if (!CheckAll(p, AICPU_TILING_CAUSAL, cu, kv, 5, small, &st)) return false;
        if (st != AICPU_TILING_E_BUFFER) return Fail("plan status " + std::to_string(st));
        Words out(bytes / 4, kSentinel);
        if (!UntouchedAnd(out, RunClassic(p, AICPU_TILING_CAUSAL, cu, kv, &out, small),
                          aicpu::KERNEL_STATUS_PARAM_INVALID, "classic small buffer"))
            return false;
    }
    /* One spare byte more than needed is fine. */
    return CheckAll(p, AICPU_TILING_CAUSAL, cu, kv, 5, bytes + 4);
}

bool CaseBadParams()
{
    /* Invalid static params: PARAM_INVALID; the header is written as the core documents. */
    aicpu_tiling_params p = BaseParams();
    const size_t bytes = aicpu_tiling_bytes(&p);
    Words cu, kv;
    MixedBatch(&cu, &kv);
    p.num_kv_heads = 3; /* 8 % 3 != 0 */
    int st = -1;
    if (!CheckAll(p, AICPU_TILING_CAUSAL, cu, kv, 5, bytes, &st)) return false;
    if (st != AICPU_TILING_E_PARAMS) return Fail("plan status " + std::to_string(st));
    p = BaseParams();
    p.num_cores = 0;
    if (!CheckAll(p, AICPU_TILING_CAUSAL, cu, kv, 5, bytes, &st)) return false;
    return st == AICPU_TILING_E_PARAMS ? true : Fail("plan status " + std::to_string(st));
}

bool CaseClassicPlumbing()
{
    const aicpu_tiling_params p = BaseParams();
    const size_t bytes = aicpu_tiling_bytes(&p);
    const uint32_t bad = aicpu::KERNEL_STATUS_PARAM_INVALID;
    Words cu, kv;
    MixedBatch(&cu, &kv);
    struct {
        const char *what;
        std::function<uint32_t(Words *)> run;
    } cases[] = {
        {"missing required attr", [&](Words *o) {
             Classic c; c.drop_attr = true; c.drop_name = "num_cores";
             return RunClassic(p, AICPU_TILING_CAUSAL, cu, kv, o, bytes, c); }},
        {"attr beyond int32", [&](Words *o) {
             Classic c; c.bad_attr = "head_dim"; c.bad_attr_value = int64_t(1) << 32 | 128;
             return RunClassic(p, AICPU_TILING_CAUSAL, cu, kv, o, bytes, c); }},
        {"causal attr not 0/1", [&](Words *o) {
             Classic c; c.bad_attr = "causal"; c.bad_attr_value = 2;
             return RunClassic(p, AICPU_TILING_CAUSAL, cu, kv, o, bytes, c); }},
        {"cu_seqlens_q shorter than seqlens_kv + 1", [&](Words *o) {
             Words cu2(cu.begin(), cu.end() - 1);
             return RunClassic(p, AICPU_TILING_CAUSAL, cu2, kv, o, bytes); }},
        {"element count contradicts int32", [&](Words *o) {
             Classic c; c.cu_elements = static_cast<int64_t>(cu.size()) * 2;
             return RunClassic(p, AICPU_TILING_CAUSAL, cu, kv, o, bytes, c); }},
        {"live batch with arrays under max_batch", [&](Words *o) {
             Classic c; c.with_live = true; c.live = 2;
             return RunClassic(p, AICPU_TILING_CAUSAL, cu, kv, o, bytes, c); }},
        {"missing output", [&](Words *o) {
             Classic c; c.drop_output = true;
             return RunClassic(p, AICPU_TILING_CAUSAL, cu, kv, o, bytes, c); }},
    };
    for (auto &c : cases) {
        Words out(bytes / 4, kSentinel);
        if (!UntouchedAnd(out, c.run(&out), bad, c.what)) return false;
    }
    /* Optional attributes left out: defaults from the header, causal = 1. */
    Words out(bytes / 4, kSentinel);
    Classic c;
    c.set_causal = false;
    Direct d = RunDirect(p, cu, kv, 5, AICPU_TILING_CAUSAL, bytes, bytes / 4);
    if (RunClassic(p, AICPU_TILING_CAUSAL, cu, kv, &out, bytes, c) != 0 || out != d.buf)
        return Fail("causal attribute default");
    return true;
}

bool CaseAscendCPlumbing()
{
    const aicpu_tiling_params p = BaseParams();
    const size_t bytes = aicpu_tiling_bytes(&p);
    Words cu, kv;
    MixedBatch(&cu, &kv);
    int32_t live = 3;
    struct {
        const char *what;
        std::function<void(aicpu_tiling_kernel_args *)> spoil;
    } cases[] = {
        {"args_bytes mismatch", [](aicpu_tiling_kernel_args *a) { a->args_bytes -= 8; }},
        {"args_version mismatch", [](aicpu_tiling_kernel_args *a) { a->args_version = 99; }},
        {"null buffer", [](aicpu_tiling_kernel_args *a) { a->buffer = 0; }},
        {"null cu_seqlens_q", [](aicpu_tiling_kernel_args *a) { a->cu_seqlens_q = 0; }},
        {"null seqlens_kv", [](aicpu_tiling_kernel_args *a) { a->seqlens_kv = 0; }},
        {"negative batch", [](aicpu_tiling_kernel_args *a) { a->batch = -1; }},
        {"live batch with arrays under max_batch",
         [&](aicpu_tiling_kernel_args *a) { a->live_batch = AICPU_TILING_ADDR(&live); }},
    };
    for (auto &c : cases) {
        Words out(bytes / 4, kSentinel);
        aicpu_tiling_kernel_args a = MakeArgs(p, AICPU_TILING_CAUSAL, cu, kv, 5, nullptr, out, bytes);
        c.spoil(&a);
        bool barrier_ok = false;
        const uint32_t r = RunAscendC(&a, &barrier_ok);
        if (!barrier_ok) return Fail(std::string(c.what) + ": no barrier on the error path");
        if (!UntouchedAnd(out, r, AICPU_TILING_KERNEL_INVALID, c.what)) return false;
    }
    bool barrier_ok = false;
    if (RunAscendC(nullptr, &barrier_ok) != AICPU_TILING_KERNEL_INVALID || !barrier_ok)
        return Fail("null args");
    return true;
}

/* ---- classic model, several tilings per launch ---- */

using Plans = std::vector<aicpu_tiling_params>;

/* The `params` list attribute of these plans: each plan's fields in struct order. */
std::vector<int64_t> ParamsList(const Plans &plans)
{
    std::vector<int64_t> v;
    for (const aicpu_tiling_params &p : plans) {
        const int32_t fields[] = {p.num_q_heads, p.num_kv_heads, p.head_dim, p.block_size,
                                  p.max_batch, p.max_tokens, p.max_blocks_per_req,
                                  p.num_cores, p.q_tile, p.cost_kv_load, p.cost_qk_tile,
                                  p.cost_segment, p.sliding_window};
        v.insert(v.end(), fields, fields + sizeof fields / sizeof fields[0]);
    }
    return v;
}

struct Multi {
    bool with_live = false;       /* add input 2 */
    int32_t live = 0;
    bool with_epoch = false;      /* add input 3 */
    int32_t epoch = 0;
    bool scalar_attrs = false;    /* also set plans[0]'s fields as scalar attributes */
    bool list_attr = true;        /* set `params` from the plans */
    bool list_override = false;   /* set `params` to `list` instead */
    std::vector<int64_t> list;
};

/* The classic kernel with one output per buffer in `outs` (each outs[k] holds
 * bytes[k] / 4 words or more) and the `params` list attribute of `plans`. */
uint32_t RunClassicMulti(const Plans &plans, uint32_t flags, Words cu, Words kv,
                         std::vector<Words> *outs, const std::vector<size_t> &bytes,
                         const Multi &o = Multi())
{
    std::shared_ptr<aicpu::CpuKernel> k = CpuKernelUtils::CreateKernel("AicpuTilingPlan");
    if (!k) {
        return 99;
    }
    auto ctx = CpuKernelUtils::NewContext("AicpuTilingPlan");
    CpuKernelUtils::AddInput(*ctx, cu.data(), 4 * cu.size(), static_cast<int64_t>(cu.size()));
    CpuKernelUtils::AddInput(*ctx, kv.empty() ? nullptr : kv.data(), 4 * kv.size(),
                             static_cast<int64_t>(kv.size()));
    int32_t live = o.live, epoch = o.epoch;
    if (o.with_live || o.with_epoch) {
        CpuKernelUtils::AddInput(*ctx, o.with_live ? &live : nullptr, o.with_live ? 4 : 0,
                                 o.with_live ? 1 : 0);
    }
    if (o.with_epoch) {
        CpuKernelUtils::AddInput(*ctx, &epoch, 4, 1);
    }
    for (size_t i = 0; i < outs->size(); ++i) {
        CpuKernelUtils::AddOutput(*ctx, (*outs)[i].data(), bytes[i],
                                  static_cast<int64_t>(bytes[i] / 4));
    }
    if (o.list_attr) {
        CpuKernelUtils::SetAttrListInt(*ctx, "params", o.list_override ? o.list : ParamsList(plans));
    }
    if (o.scalar_attrs && !plans.empty()) {
        const std::vector<int64_t> first = ParamsList(Plans(1, plans[0]));
        const char *names[] = {"num_q_heads", "num_kv_heads", "head_dim", "block_size",
                               "max_batch", "max_tokens", "max_blocks_per_req", "num_cores",
                               "q_tile", "cost_kv_load", "cost_qk_tile", "cost_segment",
                               "sliding_window"};
        for (size_t i = 0; i < first.size(); ++i) {
            CpuKernelUtils::SetAttrInt(*ctx, names[i], first[i]);
        }
    }
    CpuKernelUtils::SetAttrInt(*ctx, "causal", (flags & AICPU_TILING_CAUSAL) ? 1 : 0);
    return k->Compute(*ctx);
}

/* Would the kernel refuse this tiling's buffer before writing anything? (A usable params
 * set -- valid, and no window without causal -- with a buffer under its size.) */
bool RefusedBuffer(const aicpu_tiling_params &p, uint32_t flags, size_t bytes)
{
    const size_t need = aicpu_tiling_bytes(&p);
    const bool window_without_causal = p.sliding_window > 0 && !(flags & AICPU_TILING_CAUSAL);
    return need > 0 && !window_without_causal && bytes < need;
}

/*
 * The multi-tiling check: one classic launch planning `plans` from the same lengths, with
 * and without the live batch input, each with the epoch input. Expected, from direct
 * aicpu_tiling_plan() calls: when some buffer is refused (RefusedBuffer), PARAM_INVALID
 * and no buffer written; else each buffer holds its direct call's bytes, and the launch
 * returns PARAM_INVALID when any direct call returned E_PARAMS or E_BUFFER, else OK.
 */
bool CheckMulti(const Plans &plans, uint32_t flags, const Words &cu_in, const Words &kv_in,
                int32_t batch, const std::vector<size_t> &bytes, int32_t epoch,
                std::vector<int> *statuses = nullptr)
{
    bool refused = false;
    uint32_t want = 0;
    std::vector<Words> direct;
    int32_t max_batch = 0;
    for (size_t k = 0; k < plans.size(); ++k) {
        refused = refused || RefusedBuffer(plans[k], flags, bytes[k]);
        Words buf(bytes[k] / 4 + 1, kSentinel);
        const int st = aicpu_tiling_plan(&plans[k], cu_in.data(), kv_in.data(), batch, epoch,
                                         flags, buf.data(), bytes[k]);
        if (statuses) statuses->push_back(st);
        want |= Expected(st);
        direct.push_back(buf);
        if (plans[k].max_batch > max_batch) max_batch = plans[k].max_batch;
    }
    if (refused) want = aicpu::KERNEL_STATUS_PARAM_INVALID;

    Words cu_pad = cu_in, kv_pad = kv_in;
    const int32_t last = cu_in.empty() ? 0 : cu_in.back();
    const size_t cap = static_cast<size_t>(max_batch) > kv_in.size()
                           ? static_cast<size_t>(max_batch) : kv_in.size();
    while (kv_pad.size() < cap) kv_pad.push_back(0);
    while (cu_pad.size() < cap + 1) cu_pad.push_back(last);
    const bool plain_ok = batch >= 0 && static_cast<size_t>(batch) == kv_in.size()
                          && cu_in.size() == kv_in.size() + 1;

    for (int variant = 0; variant < 2; ++variant) {
        if (variant == 0 && !plain_ok) continue;
        std::vector<Words> outs;
        for (size_t k = 0; k < plans.size(); ++k) outs.push_back(Words(bytes[k] / 4 + 1, kSentinel));
        Multi o;
        o.with_epoch = true;
        o.epoch = epoch;
        o.with_live = variant == 1;
        o.live = batch;
        const uint32_t r = variant == 0
                               ? RunClassicMulti(plans, flags, cu_in, kv_in, &outs, bytes, o)
                               : RunClassicMulti(plans, flags, cu_pad, kv_pad, &outs, bytes, o);
        const char *name = variant == 0 ? "classic multi" : "classic multi+live";
        if (r != want) {
            char s[160];
            std::snprintf(s, sizeof s, "%s of %zu returned %u, expected %u", name, plans.size(),
                          r, want);
            return Fail(s);
        }
        for (size_t k = 0; k < plans.size(); ++k) {
            const Words untouched(bytes[k] / 4 + 1, kSentinel);
            const Words &expect = refused ? untouched : direct[k];
            if (outs[k] != expect) {
                return Fail(std::string(name) + ": tiling " + std::to_string(k)
                            + (refused ? " was written" : " differs from its direct call: ")
                            + (refused ? "" : Describe(outs[k], expect)));
            }
        }
    }
    return true;
}

std::vector<size_t> Sizes(const Plans &plans)
{
    std::vector<size_t> v;
    for (const aicpu_tiling_params &p : plans) v.push_back(4 * BufWords(p));
    return v;
}

bool CaseMultiPlan()
{
    /* gpt-oss's two tilings (no window and a window) from one launch, then the most one
     * launch plans, with different windows, cores and batch capacities. */
    aicpu_tiling_params full = BaseParams(), band = BaseParams();
    band.sliding_window = 20;
    Words cu, kv;
    MixedBatch(&cu, &kv);
    std::vector<int> st;
    if (!CheckMulti({full, band}, AICPU_TILING_CAUSAL, cu, kv, 5, Sizes({full, band}), 7, &st))
        return false;
    if (st != std::vector<int>{AICPU_TILING_OK, AICPU_TILING_OK})
        return Fail("gpt-oss pair: a plan status is not OK");
    Plans four(AICPU_TILING_KERNEL_MAX_PLANS, BaseParams());
    four[1].sliding_window = 3;
    four[2].sliding_window = 128;
    four[2].num_cores = 24;
    four[3].max_batch = 16;
    four[3].q_tile = 1;
    st.clear();
    if (!CheckMulti(four, AICPU_TILING_CAUSAL, cu, kv, 5, Sizes(four), -3, &st)) return false;
    for (int s : st)
        if (s != AICPU_TILING_OK) return Fail("four plans: a plan status is not OK");
    /* The windows make the tilings differ, or this case proves little. */
    std::vector<Words> outs;
    for (const aicpu_tiling_params &p : four) outs.push_back(Words(BufWords(p), kSentinel));
    if (RunClassicMulti(four, AICPU_TILING_CAUSAL, cu, kv, &outs, Sizes(four)) != 0)
        return Fail("four plans: not OK");
    if (outs[0] == outs[1] || Words(outs[0].begin() + AICPU_TILING_HDR_WORDS, outs[0].end())
                                  == Words(outs[1].begin() + AICPU_TILING_HDR_WORDS, outs[1].end()))
        return Fail("a window of 3 planned the same tiling as no window");
    /* Input errors reach every tiling's header; the launch still returns OK. */
    Words bad_cu = {0, 3, 2}, bad_kv = {10, 10};
    st.clear();
    if (!CheckMulti({full, band}, AICPU_TILING_CAUSAL, bad_cu, bad_kv, 2, Sizes({full, band}), 1,
                    &st))
        return false;
    if (st != std::vector<int>{AICPU_TILING_E_QUERY_DECREASING, AICPU_TILING_E_QUERY_DECREASING})
        return Fail("input error not reported in both tilings");
    return true;
}

bool CaseMultiOneTiling()
{
    /* One group in `params` writes what the scalar attributes write (the one-tiling
     * operator), and `params` wins over scalar attributes set beside it. */
    aicpu_tiling_params p = BaseParams();
    p.sliding_window = 20;
    Words cu, kv;
    MixedBatch(&cu, &kv);
    const size_t bytes = aicpu_tiling_bytes(&p);
    Words scalar(bytes / 4, kSentinel);
    if (RunClassic(p, AICPU_TILING_CAUSAL, cu, kv, &scalar, bytes) != 0)
        return Fail("scalar call not OK");
    std::vector<Words> outs(1, Words(bytes / 4, kSentinel));
    if (RunClassicMulti({p}, AICPU_TILING_CAUSAL, cu, kv, &outs, {bytes}) != 0 || outs[0] != scalar)
        return Fail("one group in params differs from the scalar attributes");
    aicpu_tiling_params other = BaseParams(); /* scalar attributes with no window */
    Multi o;
    o.scalar_attrs = true;
    outs.assign(1, Words(bytes / 4, kSentinel));
    if (RunClassicMulti({other}, AICPU_TILING_CAUSAL, cu, kv, &outs, {bytes}, o) != 0)
        return Fail("params beside scalar attributes: not OK");
    o.list_override = true;
    o.list = ParamsList({p});
    outs.assign(1, Words(bytes / 4, kSentinel));
    if (RunClassicMulti({other}, AICPU_TILING_CAUSAL, cu, kv, &outs, {bytes}, o) != 0
        || outs[0] != scalar)
        return Fail("the scalar attributes overrode params");
    /* An empty `params` list is the scalar form. */
    o.list.clear();
    outs.assign(1, Words(bytes / 4, kSentinel));
    Words scalar_other(bytes / 4, kSentinel);
    RunClassic(other, AICPU_TILING_CAUSAL, cu, kv, &scalar_other, bytes);
    if (RunClassicMulti({other}, AICPU_TILING_CAUSAL, cu, kv, &outs, {bytes}, o) != 0
        || outs[0] != scalar_other)
        return Fail("an empty params list is not the scalar form");
    return true;
}

bool CaseMultiErrors()
{
    const aicpu_tiling_params p = BaseParams();
    aicpu_tiling_params band = BaseParams();
    band.sliding_window = 20;
    const Plans pair = {p, band};
    const size_t bytes = aicpu_tiling_bytes(&p);
    const uint32_t bad = aicpu::KERNEL_STATUS_PARAM_INVALID;
    Words cu, kv;
    MixedBatch(&cu, &kv);
    struct Spoil {
        const char *what;
        size_t outputs;
        std::function<uint32_t(std::vector<Words> *, const std::vector<size_t> &)> run;
    };
    const Spoil cases[] = {
        {"two params groups, one output", 1,
         [&](std::vector<Words> *o, const std::vector<size_t> &b) {
             Multi m; m.list_override = true; m.list = ParamsList(pair);
             return RunClassicMulti(pair, AICPU_TILING_CAUSAL, cu, kv, o, b, m); }},
        {"one params group, two outputs", 2,
         [&](std::vector<Words> *o, const std::vector<size_t> &b) {
             Multi m; m.list_override = true; m.list = ParamsList({p});
             return RunClassicMulti(pair, AICPU_TILING_CAUSAL, cu, kv, o, b, m); }},
        {"scalar attributes, two outputs", 2,
         [&](std::vector<Words> *o, const std::vector<size_t> &b) {
             Multi m; m.list_attr = false; m.scalar_attrs = true;
             return RunClassicMulti(pair, AICPU_TILING_CAUSAL, cu, kv, o, b, m); }},
        {"params one value short of two groups", 2,
         [&](std::vector<Words> *o, const std::vector<size_t> &b) {
             Multi m; m.list_override = true; m.list = ParamsList(pair); m.list.pop_back();
             return RunClassicMulti(pair, AICPU_TILING_CAUSAL, cu, kv, o, b, m); }},
        {"params one value past one group", 1,
         [&](std::vector<Words> *o, const std::vector<size_t> &b) {
             Multi m; m.list_override = true; m.list = ParamsList({p}); m.list.push_back(0);
             return RunClassicMulti(pair, AICPU_TILING_CAUSAL, cu, kv, o, b, m); }},
        {"more than AICPU_TILING_KERNEL_MAX_PLANS tilings", AICPU_TILING_KERNEL_MAX_PLANS + 1,
         [&](std::vector<Words> *o, const std::vector<size_t> &b) {
             const Plans many(AICPU_TILING_KERNEL_MAX_PLANS + 1, p);
             return RunClassicMulti(many, AICPU_TILING_CAUSAL, cu, kv, o, b); }},
        {"a params value beyond int32", 2,
         [&](std::vector<Words> *o, const std::vector<size_t> &b) {
             Multi m; m.list_override = true; m.list = ParamsList(pair);
             m.list[13 + 2] = (int64_t(1) << 32) | 128; /* head_dim of the second */
             return RunClassicMulti(pair, AICPU_TILING_CAUSAL, cu, kv, o, b, m); }},
        {"the second buffer too small", 2,
         [&](std::vector<Words> *o, const std::vector<size_t> &b) {
             std::vector<size_t> small = b; small[1] -= 4;
             return RunClassicMulti(pair, AICPU_TILING_CAUSAL, cu, kv, o, small); }},
        {"the second output missing its data", 2,
         [&](std::vector<Words> *o, const std::vector<size_t> &b) {
             std::vector<Words> one(o->begin(), o->begin() + 1);
             one.push_back(Words());
             const uint32_t r = RunClassicMulti(pair, AICPU_TILING_CAUSAL, cu, kv, &one,
                                                {b[0], 0});
             (*o)[0] = one[0];
             return r; }},
        {"live batch with arrays under the second tiling's max_batch", 2,
         [&](std::vector<Words> *o, const std::vector<size_t> &b) {
             Plans grown = pair; grown[1].max_batch = 16;
             Words cu8 = {0, 1, 2, 3, 4, 5, 6, 7, 8}, kv8 = {1, 2, 3, 4, 5, 6, 7, 8};
             Multi m; m.with_live = true; m.live = 2;
             std::vector<size_t> sizes = {b[0], aicpu_tiling_bytes(&grown[1])};
             for (size_t k = 0; k < o->size(); ++k) (*o)[k].assign(sizes[k] / 4 + 1, kSentinel);
             return RunClassicMulti(grown, AICPU_TILING_CAUSAL, cu8, kv8, o, sizes, m); }},
    };
    for (const Spoil &c : cases) {
        std::vector<Words> outs(c.outputs, Words(bytes / 4 + 1, kSentinel));
        const uint32_t r = c.run(&outs, std::vector<size_t>(c.outputs, bytes));
        for (const Words &out : outs) {
            if (!UntouchedAnd(out, r, bad, c.what)) return false;
        }
    }
    /* Invalid params in one tiling: PARAM_INVALID; that tiling holds the E_PARAMS header
     * its direct call writes, the others their tilings (as the Ascend C entry's more[]). */
    Plans spoilt = pair;
    spoilt[1].num_cores = 0;
    std::vector<int> st;
    if (!CheckMulti(spoilt, AICPU_TILING_CAUSAL, cu, kv, 5, {bytes, bytes}, 4, &st)) return false;
    if (st != std::vector<int>{AICPU_TILING_OK, AICPU_TILING_E_PARAMS})
        return Fail("invalid params of the second tiling: unexpected direct statuses");
    /* A window without causal is E_PARAMS for that tiling alone. */
    st.clear();
    if (!CheckMulti(pair, 0, cu, kv, 5, {bytes, bytes}, 4, &st)) return false;
    if (st != std::vector<int>{AICPU_TILING_OK, AICPU_TILING_E_PARAMS})
        return Fail("window without causal: unexpected direct statuses");
    return true;
}

/*
 * classic_io: one classic launch described on stdin, its outputs on stdout, for the
 * Python tests (tests/test_aicpu_entry.py compares each tiling with pyruntime.tiling
 * and the pure-Python oracle). stdin, whitespace-separated integers:
 *   causal live epoch n_cu cu[n_cu] n_kv kv[n_kv] n_params params[n_params]
 *   n_outputs bytes[n_outputs]
 * live / epoch: -1 leaves that optional input out. stdout: "status <r>", then one line
 * per output, "tiling <k>" and its words in decimal.
 */
int ClassicIo()
{
    auto next = []() -> long long {
        long long v = 0;
        if (std::scanf("%lld", &v) != 1) {
            std::fprintf(stderr, "classic_io: malformed input\n");
            std::exit(2);
        }
        return v;
    };
    const long long causal = next(), live = next(), epoch = next();
    Words cu(static_cast<size_t>(next()));
    for (int32_t &v : cu) v = static_cast<int32_t>(next());
    Words kv(static_cast<size_t>(next()));
    for (int32_t &v : kv) v = static_cast<int32_t>(next());
    std::vector<int64_t> params(static_cast<size_t>(next()));
    for (int64_t &v : params) v = next();
    std::vector<size_t> bytes(static_cast<size_t>(next()));
    for (size_t &v : bytes) v = static_cast<size_t>(next());

    std::shared_ptr<aicpu::CpuKernel> k = CpuKernelUtils::CreateKernel("AicpuTilingPlan");
    auto ctx = CpuKernelUtils::NewContext("AicpuTilingPlan");
    CpuKernelUtils::AddInput(*ctx, cu.data(), 4 * cu.size(), static_cast<int64_t>(cu.size()));
    CpuKernelUtils::AddInput(*ctx, kv.empty() ? nullptr : kv.data(), 4 * kv.size(),
                             static_cast<int64_t>(kv.size()));
    int32_t live_v = static_cast<int32_t>(live), epoch_v = static_cast<int32_t>(epoch);
    CpuKernelUtils::AddInput(*ctx, live >= 0 ? &live_v : nullptr, live >= 0 ? 4 : 0,
                             live >= 0 ? 1 : 0);
    CpuKernelUtils::AddInput(*ctx, epoch >= 0 ? &epoch_v : nullptr, epoch >= 0 ? 4 : 0,
                             epoch >= 0 ? 1 : 0);
    std::vector<Words> outs;
    for (size_t b : bytes) outs.push_back(Words(b / 4 + 1, kSentinel));
    for (size_t i = 0; i < outs.size(); ++i) {
        CpuKernelUtils::AddOutput(*ctx, outs[i].data(), bytes[i],
                                  static_cast<int64_t>(bytes[i] / 4));
    }
    CpuKernelUtils::SetAttrListInt(*ctx, "params", params);
    CpuKernelUtils::SetAttrInt(*ctx, "causal", causal);
    std::printf("status %u\n", k->Compute(*ctx));
    for (size_t i = 0; i < outs.size(); ++i) {
        std::printf("tiling %zu", i);
        for (size_t w = 0; w < bytes[i] / 4; ++w) std::printf(" %d", outs[i][w]);
        std::printf("\n");
    }
    return 0;
}

/* ---- random ---- */

struct Rng {
    uint64_t s;
    uint32_t Next()
    {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return static_cast<uint32_t>(s >> 11);
    }
    int32_t Range(int32_t lo, int32_t hi) { return lo + static_cast<int32_t>(Next() % uint32_t(hi - lo + 1)); }
    bool Chance(int percent) { return static_cast<int>(Next() % 100) < percent; }
};

bool CaseRandom(long count, uint64_t seed)
{
    Rng rng{seed * 2654435761u + 1};
    long ok = 0, errors = 0, multi = 0;
    for (long i = 0; i < count; ++i) {
        aicpu_tiling_params p = BaseParams();
        p.num_kv_heads = 1 << rng.Range(0, 3);
        p.num_q_heads = p.num_kv_heads * rng.Range(1, 8);
        p.head_dim = 64 * rng.Range(1, 4);
        p.block_size = 16 << rng.Range(0, 3);
        p.max_batch = rng.Range(1, 40);
        p.max_tokens = rng.Range(1, 600);
        p.max_blocks_per_req = rng.Range(1, 64);
        p.num_cores = rng.Range(1, 48);
        p.q_tile = rng.Range(1, 16);
        p.cost_kv_load = rng.Range(0, 8);
        p.cost_qk_tile = rng.Range(1, 4);
        p.cost_segment = rng.Range(0, 64);
        if (rng.Chance(40)) p.sliding_window = rng.Range(1, 3 * p.block_size); /* ABI v5 */
        if (rng.Chance(3)) p.num_cores = 0; /* invalid params */
        const uint32_t flags = rng.Chance(80) ? AICPU_TILING_CAUSAL : 0u;
        int32_t batch = rng.Range(0, p.max_batch);
        if (rng.Chance(3)) batch = p.max_batch + rng.Range(1, 3);
        const int32_t kv_cap = p.max_blocks_per_req * p.block_size;
        Words cu(1, 0), kv;
        for (int32_t r = 0; r < batch; ++r) {
            int32_t q = rng.Chance(20) ? 0 : (rng.Chance(70) ? rng.Range(1, 2) : rng.Range(1, 40));
            int32_t k = (q == 0 && rng.Chance(50)) ? 0 : q + rng.Range(0, kv_cap - q > 0 ? kv_cap - q : 0);
            if (rng.Chance(1)) q = -rng.Range(1, 3);          /* decreasing offsets */
            if (rng.Chance(1)) k = -1;                          /* negative kv */
            if (rng.Chance(1)) k = kv_cap + 1;                  /* over capacity */
            if (rng.Chance(1) && q > 0) k = q - 1;              /* kv shorter than q */
            cu.push_back(cu.back() + q);
            kv.push_back(k);
        }
        if (rng.Chance(2)) cu[0] = 1;
        size_t bytes = aicpu_tiling_bytes(&p);
        if (bytes == 0) bytes = 4 * BufWords(BaseParams());
        if (rng.Chance(5)) bytes -= 4 * static_cast<size_t>(rng.Range(1, 8));
        int st = -1;
        if (!CheckAll(p, flags, cu, kv, batch, bytes, &st)) {
            g_why = "random case " + std::to_string(i) + ": " + g_why;
            return false;
        }
        (st == AICPU_TILING_OK ? ok : errors) += 1;
        if (rng.Chance(30)) {
            /* The same lengths planned for 2 .. MAX_PLANS tilings in one classic launch:
             * other windows, sometimes other cores, invalid params or a short buffer. */
            Plans plans(1, p);
            const int32_t n = rng.Range(2, AICPU_TILING_KERNEL_MAX_PLANS);
            for (int32_t j = 1; j < n; ++j) {
                aicpu_tiling_params q = p;
                q.sliding_window = rng.Chance(40) ? 0 : rng.Range(1, 3 * p.block_size);
                if (rng.Chance(20)) q.num_cores = rng.Range(1, 48);
                if (rng.Chance(3)) q.num_cores = 0;
                plans.push_back(q);
            }
            std::vector<size_t> sizes;
            for (const aicpu_tiling_params &q : plans) {
                size_t b = aicpu_tiling_bytes(&q);
                if (b == 0) b = 4 * BufWords(BaseParams());
                if (rng.Chance(3)) b -= 4 * static_cast<size_t>(rng.Range(1, 8));
                sizes.push_back(b);
            }
            if (!CheckMulti(plans, flags, cu, kv, batch, sizes, rng.Range(-5, 5))) {
                g_why = "random case " + std::to_string(i) + ": " + g_why;
                return false;
            }
            ++multi;
        }
    }
    std::printf("random: %ld cases, %ld ok, %ld with an error status, %ld multi-tiling\n", count,
                ok, errors, multi);
    if (count >= 100 && (ok == 0 || errors == 0)) return Fail("random mix has no ok or no error cases");
    return true;
}

struct Named {
    const char *name;
    bool (*fn)();
};

const Named kCases[] = {
    {"registry", CaseRegistry},
    {"decode", CaseDecode},
    {"mixed_causal", CaseMixedCausal},
    {"non_causal", CaseNonCausal},
    {"sliding_window", CaseSlidingWindow},
    {"empty_batch", CaseEmptyBatch},
    {"invalid_input", CaseInvalidInput},
    {"live_batch", CaseLiveBatch},
    {"live_batch_out_of_range", CaseLiveBatchOutOfRange},
    {"small_buffer", CaseSmallBuffer},
    {"bad_params", CaseBadParams},
    {"classic_plumbing", CaseClassicPlumbing},
    {"ascendc_plumbing", CaseAscendCPlumbing},
    {"multi_plan", CaseMultiPlan},
    {"multi_one_tiling", CaseMultiOneTiling},
    {"multi_errors", CaseMultiErrors},
};

bool Report(const char *name, bool pass)
{
    if (pass) {
        std::printf("PASS %s\n", name);
    } else {
        std::printf("FAIL %s: %s\n", name, g_why.c_str());
    }
    return pass;
}

} // namespace

int main(int argc, char **argv)
{
    const std::string what = argc > 1 ? argv[1] : "all";
    if (what == "list") {
        for (const auto &c : kCases) std::printf("%s\n", c.name);
        return 0;
    }
    if (what == "classic_io") {
        return ClassicIo();
    }
    if (what == "random") {
        const long count = argc > 2 ? std::atol(argv[2]) : 2000;
        const uint64_t seed = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 1;
        return Report("random", CaseRandom(count, seed)) ? 0 : 1;
    }
    bool all = true, found = false;
    for (const auto &c : kCases) {
        if (what == "all" || what == c.name) {
            found = true;
            all = Report(c.name, c.fn()) && all;
        }
    }
    if (what == "all") {
        found = true;
        all = Report("random", CaseRandom(2000, 1)) && all;
    }
    if (!found) {
        std::fprintf(stderr, "unknown case %s\n", what.c_str());
        return 2;
    }
    return all ? 0 : 1;
}
