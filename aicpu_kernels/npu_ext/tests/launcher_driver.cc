/*
 * launcher_driver.cc -- host test of npu_ext/runtime_launcher.cpp against the recording
 * stand-in runtime (cann_stub/npu/recording_runtime.cc, NOT CANN: host definitions of the
 * ACL functions declared by the torch_npu wheel's real acl/acl_rt.h, which both files are
 * compiled against). Launches run the host build of the entry aicpu_tiling_kernel(void *args). Run by tests/test_npu_ext.py; prints
 * "PASS <case>" per case and exits non-zero on the first failure.
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "recording_runtime.h"
#include "runtime_launcher.h"

extern "C" uint32_t aicpu_tiling_kernel(void *args);

namespace {
int g_failures = 0;

void Expect(bool ok, const char *what, const std::string &detail = "")
{
    if (!ok) {
        std::printf("FAIL %s %s\n", what, detail.c_str());
        ++g_failures;
    }
}

std::string Joined(const std::vector<std::string> &log)
{
    std::string s;
    for (const auto &l : log) s += l + "\n";
    return s;
}

aicpu_tiling_params Params()
{
    aicpu_tiling_params p;
    std::memset(&p, 0, sizeof(p));
    p.num_q_heads = 32, p.num_kv_heads = 8, p.head_dim = 128, p.block_size = 128;
    p.max_batch = 4, p.max_tokens = 16, p.max_blocks_per_req = 64, p.num_cores = 6;
    p.q_tile = 16, p.cost_kv_load = 4, p.cost_qk_tile = 1, p.cost_segment = 32;
    return p;
}

/* "Device" buffers (host memory here): lengths, live batch, tiling. */
struct Buffers {
    int32_t cu[5] = {0, 1, 2, 3, 4};
    int32_t kv[4] = {300, 1, 4000, 77};
    int32_t live = 4;
    int32_t epoch = 1;
    std::vector<int32_t> tiling;
};

aicpu_tiling_kernel_args Block(const aicpu_tiling_params &p, Buffers &b)
{
    aicpu_tiling_kernel_args a;
    aicpu_tiling_kernel_args_init(&a, &p, AICPU_TILING_CAUSAL);
    b.tiling.assign(aicpu_tiling_bytes(&p) / 4, -7);
    a.cu_seqlens_q = AICPU_TILING_ADDR(b.cu);
    a.seqlens_kv = AICPU_TILING_ADDR(b.kv);
    a.live_batch = AICPU_TILING_ADDR(&b.live);
    a.step_epoch = AICPU_TILING_ADDR(&b.epoch);
    a.batch = 4;
    a.buffer = AICPU_TILING_ADDR(b.tiling.data());
    a.buffer_bytes = b.tiling.size() * 4;
    return a;
}

bool MatchesDirect(const aicpu_tiling_params &p, const Buffers &b)
{
    std::vector<int32_t> want(b.tiling.size(), 0);
    aicpu_tiling_plan(&p, b.cu, b.kv, b.live, b.epoch, AICPU_TILING_CAUSAL, want.data(),
                      want.size() * 4);
    return want == b.tiling && b.tiling[AICPU_TILING_HDR_EPOCH] == b.epoch;
}
} // namespace

int main()
{
    using stub_runtime::CallLog;
    stub_runtime::RegisterCpuFunction(AICPU_TILING_RUNTIME_OP_TYPE, aicpu_tiling_kernel);
    const aicpu_tiling_params p = Params();
    aclrtStream caller = nullptr;
    aclrtCreateStreamWithConfig(&caller, 0, 0); /* stream#1: the "current NPU stream" */
    Buffers b;
    aicpu_tiling_kernel_args args = Block(p, b);

    {
        aicpu_tiling_npu::RuntimeLauncher l;
        CallLog().clear();
        Expect(l.Launch(args, caller) == -1 && CallLog().empty(), "launch_before_load");
        Expect(l.LastError().find("not loaded") != std::string::npos, "launch_before_load_msg");
        std::printf("PASS launch_before_load\n");

        Expect(l.Load("/opt/k/" AICPU_TILING_RUNTIME_JSON) == 0, "load", l.LastError());
        /* Mode 1 (option 3 = ACL_RT_BINARY_LOAD_OPT_CPU_KERNEL_MODE, value 1) on the JSON
         * whose stem is the .so's, the JSON's op type, a flag-0 stream, two ACL_EVENT_SYNC
         * (flag 1) events. */
        const std::vector<std::string> load = {
            "aclrtBinaryLoadFromFile /opt/k/libaicpu_tiling_runtime.json opt" +
                std::to_string(ACL_RT_BINARY_LOAD_OPT_CPU_KERNEL_MODE) + "=1",
            "aclrtBinaryGetFunction binary#2 AicpuTilingKernel",
            "aclrtCreateStreamWithConfig 0 0",
            "aclrtCreateEventExWithFlag " + std::to_string(ACL_EVENT_SYNC),
            "aclrtCreateEventExWithFlag " + std::to_string(ACL_EVENT_SYNC),
        };
        Expect(ACL_RT_BINARY_LOAD_OPT_CPU_KERNEL_MODE == 3 && ACL_EVENT_SYNC == 1u,
               "real_header_constants");
        Expect(CallLog() == load, "load_sequence", Joined(CallLog()));
        CallLog().clear();
        Expect(l.Load("/opt/k/" AICPU_TILING_RUNTIME_JSON) == 0 && CallLog().empty(), "reload_same");
        Expect(l.Load("/elsewhere.json") == -1 && CallLog().empty(), "reload_other");
        std::printf("PASS load\n");

        Expect(l.Launch(args, caller) == 0, "launch", l.LastError());
        const std::vector<std::string> launch = {
            "aclrtRecordEvent event#5 stream#1",
            "aclrtStreamWaitEvent stream#4 event#5",
            "aclrtLaunchKernelWithHostArgs func#3 1 stream#4 cfg=attrs attrs=0 bytes=" +
                std::to_string(sizeof(aicpu_tiling_kernel_args)) + " placeholders=null/0",
            "aclrtRecordEvent event#6 stream#4",
            "aclrtStreamWaitEvent stream#1 event#6",
        };
        Expect(CallLog() == launch, "launch_sequence", Joined(CallLog()));
        Expect(MatchesDirect(p, b) && stub_runtime::Results().back() == AICPU_TILING_KERNEL_OK,
               "launch_result");
        std::printf("PASS launch\n");

        CallLog().clear();
        aicpu_tiling_kernel_args bad = args;
        bad.batch = 2; /* live batch with arrays shorter than max_batch */
        Expect(l.Launch(bad, caller) == -1 && CallLog().empty(), "bad_block_not_launched");
        std::printf("PASS bad_block\n");

        /* Captured once, replayed with fresh lengths and epochs: the frozen block's
         * addresses read the new data at every replay, and the tiling echoes each epoch. */
        stub_runtime::BeginCapture();
        Expect(l.Launch(args, caller) == 0, "capture_launch");
        stub_runtime::EndCapture();
        const int32_t steps[3][4] = {{17, 4096, 5, 900}, {2, 2, 2, 2}, {8000, 1, 1, 1}};
        for (int s = 0; s < 3; ++s) {
            std::memcpy(b.kv, steps[s], sizeof(b.kv));
            b.live = 4 - s; /* the live batch changes too */
            b.epoch = 100 + s; /* and the epoch the host writes beside them */
            std::fill(b.tiling.begin(), b.tiling.end(), -7);
            stub_runtime::Replay();
            Expect(MatchesDirect(p, b), "replay_reads_fresh_lengths", std::to_string(s));
        }
        std::printf("PASS capture_replay\n");

        stub_runtime::StubFailNext("aclrtLaunchKernelWithHostArgs", 9);
        Expect(l.Launch(args, caller) == 9, "launch_failure_code");
        Expect(l.LastError().find("aclrtLaunchKernelWithHostArgs") != std::string::npos,
               "launch_failure_msg");
        std::printf("PASS launch_failure\n");

        /* Unload gives every handle back, events and stream before the binary. */
        CallLog().clear();
        l.Unload();
        const std::vector<std::string> unload = {
            "aclrtDestroyEvent event#6", "aclrtDestroyEvent event#5",
            "aclrtDestroyStream stream#4", "aclrtBinaryUnLoad binary#2",
        };
        Expect(CallLog() == unload && !l.Loaded(), "unload_sequence", Joined(CallLog()));
        std::printf("PASS unload\n");
    }
    {
        /* A launcher going out of scope calls no ACL function: the process's static one
         * is destroyed after torch_npu has finalized ACL (runtime_launcher.cpp). */
        CallLog().clear();
        {
            aicpu_tiling_npu::RuntimeLauncher l;
            Expect(l.Load("/opt/k/" AICPU_TILING_RUNTIME_JSON) == 0, "load_again", l.LastError());
            CallLog().clear();
        }
        Expect(CallLog().empty(), "destructor_calls_no_acl", Joined(CallLog()));
        std::printf("PASS destructor\n");
    }
    {
        aicpu_tiling_npu::RuntimeLauncher l;
        CallLog().clear();
        stub_runtime::StubFailNext("aclrtBinaryGetFunction", 7);
        Expect(l.Load("/opt/k/" AICPU_TILING_RUNTIME_JSON) == 7 && !l.Loaded(), "load_failure");
        Expect(l.LastError().find("aclrtBinaryGetFunction") != std::string::npos, "load_failure_msg");
        Expect(CallLog().back().rfind("aclrtBinaryUnLoad", 0) == 0, "load_failure_unloads",
               Joined(CallLog()));
        std::printf("PASS load_failure\n");
    }
    return g_failures == 0 ? 0 : 1;
}
