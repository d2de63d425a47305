/*
 * NOT CANN. This file is part of a declaration-compatible stand-in for the few public
 * CANN interfaces that aicpu_kernels/aicpu/ uses, written for this repository so that CI
 * can compile and test the AI-CPU wrappers on a host without CANN. It contains no CANN
 * code; only the names and signatures match the public CANN headers. Real builds
 * (tools/build_aicpu_kernel.sh) never see this directory.
 */
/* Host implementation of the stand-in: just enough for tests/test_aicpu_entry.py. */
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "aicpu_api.h"
#include "cann_stub_testing.h"
#include "cpu_kernel.h"

namespace aicpu {

Tensor::Tensor(void *data, uint64_t bytes, int64_t elements)
    : data_(data), bytes_(bytes), elements_(elements)
{
}
void *Tensor::GetData() const { return data_; }
uint64_t Tensor::GetDataSize() const { return bytes_; }
int64_t Tensor::NumElements() const { return elements_; }

AttrValue::AttrValue(int64_t value) : value_(value) {}
AttrValue::AttrValue(const std::vector<int64_t> &list) : value_(0), list_(list) {}
int64_t AttrValue::GetInt() const { return value_; }
std::vector<int64_t> AttrValue::GetListInt() const { return list_; }

CpuKernelContext::CpuKernelContext(DeviceType type) { (void)type; }
std::string CpuKernelContext::GetOpType() const { return op_; }
Tensor *CpuKernelContext::Input(uint32_t index) const
{
    return index < inputs_.size() ? inputs_[index].get() : nullptr;
}
Tensor *CpuKernelContext::Output(uint32_t index) const
{
    return index < outputs_.size() ? outputs_[index].get() : nullptr;
}
AttrValue *CpuKernelContext::GetAttr(std::string name) const
{
    auto it = attrs_.find(name);
    return it == attrs_.end() ? nullptr : it->second.get();
}
uint32_t CpuKernelContext::GetInputsSize() const { return static_cast<uint32_t>(inputs_.size()); }
uint32_t CpuKernelContext::GetOutputsSize() const
{
    return static_cast<uint32_t>(outputs_.size());
}

namespace {
std::map<std::string, KERNEL_CREATOR_FUN> &Registry()
{
    static std::map<std::string, KERNEL_CREATOR_FUN> registry;
    return registry;
}
} // namespace

bool RegistCpuKernel(const std::string &type, const KERNEL_CREATOR_FUN &fun)
{
    return Registry().emplace(type, fun).second;
}

std::unique_ptr<CpuKernelContext> CpuKernelUtils::NewContext(const std::string &op)
{
    std::unique_ptr<CpuKernelContext> ctx(new CpuKernelContext(HOST));
    ctx->op_ = op;
    return ctx;
}
void CpuKernelUtils::AddInput(CpuKernelContext &ctx, void *data, uint64_t bytes, int64_t elements)
{
    ctx.inputs_.push_back(std::shared_ptr<Tensor>(new Tensor(data, bytes, elements)));
}
void CpuKernelUtils::AddOutput(CpuKernelContext &ctx, void *data, uint64_t bytes,
                               int64_t elements)
{
    ctx.outputs_.push_back(std::shared_ptr<Tensor>(new Tensor(data, bytes, elements)));
}
void CpuKernelUtils::SetAttrInt(CpuKernelContext &ctx, const std::string &name, int64_t value)
{
    ctx.attrs_[name] = std::shared_ptr<AttrValue>(new AttrValue(value));
}
void CpuKernelUtils::SetAttrListInt(CpuKernelContext &ctx, const std::string &name,
                                    const std::vector<int64_t> &values)
{
    ctx.attrs_[name] = std::shared_ptr<AttrValue>(new AttrValue(values));
}
std::shared_ptr<CpuKernel> CpuKernelUtils::CreateKernel(const std::string &type)
{
    auto it = Registry().find(type);
    return it == Registry().end() ? nullptr : it->second();
}

} // namespace aicpu

namespace AscendC {
namespace {
std::atomic<unsigned long> g_barriers(0);
}
void DataStoreBarrier()
{
    std::atomic_thread_fence(std::memory_order_seq_cst);
    g_barriers.fetch_add(1);
}
unsigned long StubDataStoreBarrierCount() { return g_barriers.load(); }
} // namespace AscendC
