// The NPU twin's plain-tensor device: torch's PrivateUse1 device (renamed `npu` from Python)
// made of host memory, so that a twin tensor is an ordinary torch.Tensor (no wrapper subclass).
//
// What lives here, and why in C++: the pieces torch only takes from C++.
//   * an allocator over host memory (c10::SetAllocator for PrivateUse1) with live accounting
//     per device, the model of memory.py (allocated, reserved with a cache, peaks, the device
//     size and torch.OutOfMemoryError): torch.npu.memory_allocated & co. read it;
//   * a device guard (C10_REGISTER_GUARD_IMPL): the device count (AICPU_TILING_TWIN_DEVICES,
//     default 2) and the current device, per thread as aclrtSetDevice binds a device to the
//     calling thread;
//   * the PrivateUse1 hooks torch 2.13 asks for (is_available, device count, resize of
//     untyped storages, ...);
//   * the aten kernels that only make or reshape tensors (no device work): empty,
//     empty_strided, as_strided, view, _reshape_alias, resize_, set_ on a storage;
//   * `aicpu_twin::host_alias`: a CPU tensor over the same bytes as an npu tensor: what a
//     device task reads and writes (device.inner).
// Every other aten op, copies and .item() included, reaches the one Python boxed fallback
// (plain_tensors.py), which hands it to the twin's rules in device.py: queued on a stream,
// recorded by a capture, synchronised by a host read.
//
// Device memory is host memory here; fresh memory is filled with 0xA5 (device.POISON in
// device.py): garbage until a kernel writes it, as on the device.
//
// Built by plain_tensors.py with -Wall -Wextra -Werror, torch's headers as -isystem.

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace aicpu_twin {
namespace {

constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;
// device.py's device_count_from_env() allows 1 to 64 (c10::DeviceIndex is int8_t)
constexpr int kMaxDevices = 64;
constexpr unsigned char kPoison = 0xA5;

int device_count_from_env() {
  const char* text = std::getenv("AICPU_TILING_TWIN_DEVICES");
  if (text == nullptr || *text == '\0') {
    return 2;
  }
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  TORCH_CHECK(*end == '\0' && value >= 1 && value <= kMaxDevices,
              "AICPU_TILING_TWIN_DEVICES must be a whole number from 1 to ", kMaxDevices,
              ", got '", text, "'");
  return static_cast<int>(value);
}

int device_count() {
  static const int count = device_count_from_env();
  return count;
}

void check_device(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < device_count(), "invalid npu device ordinal ", int(index),
              ": the twin has ", device_count(),
              " devices (set AICPU_TILING_TWIN_DEVICES for more)");
}

// aclrtSetDevice binds the device to the calling thread (as cudaSetDevice does): each thread
// starts on device 0.
thread_local c10::DeviceIndex current_device = 0;

// ---- memory accounting -------------------------------------------------------------------
// The model of pyruntime/npu_twin/memory.py (DeviceMemory), per device: torch_npu's caching
// allocator as its callers see it. Every block is rounded up to 512 bytes (Ascend/pytorch,
// torch_npu/csrc/core/npu/NPUCachingAllocator.cpp: kMinBlockSize = 512); `allocated` is what
// live blocks hold; `reserved` grows to cover it and keeps freed blocks cached until
// empty_cache() (no fragmentation is modelled); an allocation that would take `reserved` past
// the device size first empties the cache, then raises torch.OutOfMemoryError with
// torch_npu's text ("NPU out of memory. Tried to allocate", in libtorch_npu.so).
constexpr size_t kBlockRound = 512;
constexpr int64_t kDefaultTotal = int64_t{64} << 30;  // memory.DEFAULT_TOTAL

struct DeviceStats {
  std::mutex lock;
  int64_t total = kDefaultTotal;
  int64_t allocated = 0;
  int64_t reserved = 0;
  int64_t peak_allocated = 0;
  int64_t peak_reserved = 0;
  int64_t blocks = 0;
  int64_t peak_blocks = 0;
  int64_t allocations = 0;
  int64_t frees = 0;
  int64_t allocated_total = 0;
  int64_t freed_total = 0;
  int64_t num_ooms = 0;
};

std::array<DeviceStats, kMaxDevices> stats;

// torch's format_size, as memory.py's _size prints it
std::string format_size(int64_t bytes) {
  char text[64];
  if (bytes < 1024) {
    std::snprintf(text, sizeof text, "%lld bytes", static_cast<long long>(bytes));
  } else if (bytes < (int64_t{1} << 20)) {
    std::snprintf(text, sizeof text, "%.2f KiB", static_cast<double>(bytes) / 1024.0);
  } else if (bytes < (int64_t{1} << 30)) {
    std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / 1048576.0);
  } else {
    std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / 1073741824.0);
  }
  return text;
}

// Accounts a block of `size` bytes on `device`, or raises torch.OutOfMemoryError.
void account_allocation(c10::DeviceIndex device, int64_t size) {
  DeviceStats& s = stats[static_cast<size_t>(device)];
  int64_t free_bytes = 0;
  int64_t already = 0;
  int64_t reserved_now = 0;
  int64_t total = 0;
  {
    std::lock_guard<std::mutex> hold(s.lock);
    const int64_t allocated = s.allocated + size;
    int64_t reserved = std::max(s.reserved, allocated);
    if (reserved > s.total) {
      reserved = allocated;  // the allocator frees its cache and retries
    }
    if (reserved <= s.total) {
      s.allocated = allocated;
      s.reserved = reserved;
      s.peak_allocated = std::max(s.peak_allocated, allocated);
      s.peak_reserved = std::max(s.peak_reserved, reserved);
      s.blocks += 1;
      s.peak_blocks = std::max(s.peak_blocks, s.blocks);
      s.allocations += 1;
      s.allocated_total += size;
      return;
    }
    s.num_ooms += 1;
    free_bytes = s.total - s.reserved;
    already = s.allocated;
    reserved_now = s.reserved;
    total = s.total;
  }
  TORCH_CHECK_WITH(OutOfMemoryError, false, "NPU out of memory. Tried to allocate ",
                   format_size(size), " (NPU ", int(device), "; ", format_size(total),
                   " total capacity; ", format_size(already), " already allocated; ",
                   format_size(free_bytes), " free; ", format_size(reserved_now),
                   " reserved in total by PyTorch) (npu-twin: device size from "
                   "AICPU_TILING_TWIN_DEVICE_MEMORY)");
}

struct Block {
  void* memory;
  int64_t size;
  c10::DeviceIndex device;
};

void free_block(void* context) {
  auto* block = static_cast<Block*>(context);
  DeviceStats& s = stats[static_cast<size_t>(block->device)];
  {
    std::lock_guard<std::mutex> hold(s.lock);
    s.allocated -= block->size;  // the block stays reserved (cached)
    s.blocks -= 1;
    s.frees += 1;
    s.freed_total += block->size;
  }
  std::free(block->memory);
  delete block;
}

struct HostBackedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t bytes) override {
    const c10::DeviceIndex device = current_device;
    check_device(device);
    const c10::Device where(kNpu, device);
    if (bytes == 0) {
      return c10::DataPtr(nullptr, nullptr, &noop_delete, where);
    }
    const size_t rounded = (bytes + kBlockRound - 1) / kBlockRound * kBlockRound;
    account_allocation(device, static_cast<int64_t>(rounded));
    void* memory = std::aligned_alloc(64, rounded);
    TORCH_CHECK(memory != nullptr, "npu twin: out of host memory allocating ", bytes, " bytes");
    std::memset(memory, kPoison, rounded);
    auto* block = new Block{memory, static_cast<int64_t>(rounded), device};
    return c10::DataPtr(memory, block, &free_block, where);
  }

  void copy_data(void* dest, const void* src, size_t count) const override {
    std::memcpy(dest, src, count);
  }

  static void noop_delete(void*) {}
};

HostBackedAllocator allocator;

// ---- pinned host memory -------------------------------------------------------------------
// torch_npu registers its CachingHostAllocator as PrivateUse1's pinned-memory allocator
// (torch_npu/csrc/core/npu/CachingHostAllocator.cpp, through its PrivateUse1 hooks'
// getPinnedMemoryAllocator). torch asks the accelerator's hooks for it whenever C++ makes a
// host tensor with pin_memory=true: `_to_copy` of an npu tensor to the CPU with
// non_blocking=True (aten/src/ATen/native/TensorConversions.cpp, `pin_out`), which vLLM's
// AsyncGPUModelRunnerOutput does with the sampled token ids (vllm/v1/worker/
// gpu_model_runner.py). Host memory, remembered as pinned while it lives, so that
// is_pinned() (hooks' isPinnedPtr and the twin's copy rules, `is_pinned_ptr`) says so.
std::mutex pinned_lock;
std::unordered_set<const void*> pinned_blocks;

void free_pinned(void* memory) {
  {
    std::lock_guard<std::mutex> hold(pinned_lock);
    pinned_blocks.erase(memory);
  }
  std::free(memory);
}

struct PinnedHostAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t bytes) override {
    const c10::Device where(c10::DeviceType::CPU);
    if (bytes == 0) {
      return c10::DataPtr(nullptr, nullptr, &noop_delete, where);
    }
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* memory = std::aligned_alloc(64, rounded);
    TORCH_CHECK(memory != nullptr, "npu twin: out of host memory pinning ", bytes, " bytes");
    {
      std::lock_guard<std::mutex> hold(pinned_lock);
      pinned_blocks.insert(memory);
    }
    return c10::DataPtr(memory, memory, &free_pinned, where);
  }

  void copy_data(void* dest, const void* src, size_t count) const override {
    std::memcpy(dest, src, count);
  }

  static void noop_delete(void*) {}
};

PinnedHostAllocator pinned_allocator;

bool is_pinned_block(const void* data) {
  std::lock_guard<std::mutex> hold(pinned_lock);
  return pinned_blocks.count(data) != 0;
}

bool is_pinned_ptr(int64_t data) {
  return is_pinned_block(reinterpret_cast<const void*>(static_cast<intptr_t>(data)));
}

// ---- device guard -------------------------------------------------------------------------
struct NpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  NpuGuardImpl() = default;
  explicit NpuGuardImpl(c10::DeviceType type) {
    TORCH_INTERNAL_ASSERT(type == kNpu);
  }
  c10::DeviceType type() const override {
    return kNpu;
  }
  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device old = getDevice();
    setDevice(device);
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(kNpu, current_device);
  }
  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kNpu, "npu twin: cannot set a ", device.type(), " device");
    check_device(device.index());
    current_device = device.index();
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    current_device = device.index();
  }
  // One stream per device for now: the twin's streams live in Python (device.py) and are
  // not yet ported onto this layer.
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuardImpl);

// ---- hooks ------------------------------------------------------------------------------
void resize_storage_bytes(c10::StorageImpl* storage, size_t bytes) {
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  c10::OptionalDeviceGuard guard(storage->device());
  c10::DataPtr fresh = allocator.allocate(bytes);
  const size_t keep = std::min(bytes, storage->nbytes());
  if (keep > 0) {
    std::memcpy(fresh.get(), storage->data(), keep);
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(bytes);
}

struct NpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return true;
  }
  bool hasPrimaryContext(c10::DeviceIndex index) const override {
    check_device(index);
    return true;
  }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    check_device(index);
    current_device = index;
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return current_device;
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const c10::DeviceIndex old = current_device;
    setCurrentDevice(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(kNpu, current_device);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t bytes) const override {
    resize_storage_bytes(storage.unsafeGetStorageImpl(), bytes);
  }
  // torch's _to_copy allocates the host side of a non_blocking device-to-host copy with
  // pin_memory=True (aten/src/ATen/native/TensorConversions.cpp), which asks this hook;
  // torch_npu 2.10.0.post4 overrides both (torch_npu/csrc/core/npu/NPUHooksInterface.h of the
  // wheel: getPinnedMemoryAllocator, isPinnedPtr) with its CachingHostAllocator
  // (csrc/core/npu/CachingHostAllocator.h). vLLM's AsyncGPUModelRunnerOutput
  // (gpu_model_runner.py) does such a copy every step.
  bool isPinnedPtr(const void* data) const override {
    return is_pinned_block(data);
  }
  at::Allocator* getPinnedMemoryAllocator() const override {
    return &pinned_allocator;
  }
};

NpuHooks hooks;

// ---- the kernels every tensor needs -----------------------------------------------------
c10::Device npu_device(std::optional<c10::Device> device) {
  const c10::DeviceIndex index =
      device.has_value() && device->has_index() ? device->index() : current_device;
  check_device(index);
  return c10::Device(kNpu, index);
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout>, std::optional<at::Device> device,
                               std::optional<bool>, std::optional<at::MemoryFormat> format) {
  c10::OptionalDeviceGuard guard(npu_device(device));
  return at::detail::empty_generic(size, &allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                         std::optional<at::Device> device, std::optional<bool>) {
  c10::OptionalDeviceGuard guard(npu_device(device));
  return at::detail::empty_strided_generic(size, stride, &allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

void keep_storage_alive(void* context) {
  delete static_cast<c10::Storage*>(context);
}

// A CPU tensor over the same bytes as `tensor` (same storage offset, sizes, strides); it keeps
// the npu storage alive. CPU tensors come back as they are.
at::Tensor host_alias(const at::Tensor& tensor) {
  if (tensor.device().is_cpu()) {
    return tensor;
  }
  TORCH_CHECK(tensor.device().type() == kNpu, "host_alias: not an npu tensor: ",
              tensor.device());
  const c10::Storage& storage = tensor.storage();
  c10::DataPtr bytes(storage.mutable_data(), new c10::Storage(storage), &keep_storage_alive,
                     c10::Device(c10::kCPU));
  c10::Storage host(c10::Storage::use_byte_size_t(), storage.nbytes(), std::move(bytes),
                    /*allocator=*/nullptr, /*resizable=*/false);
  // A normal tensor even under torch.inference_mode: the device thread (outside inference
  // mode) writes device memory through it (device.device_memory does the same).
  c10::InferenceMode normal(false);
  at::Tensor alias = at::empty({0}, tensor.options().device(c10::kCPU));
  alias.set_(host, tensor.storage_offset(), tensor.sizes(), tensor.strides());
  return alias;
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<at::MemoryFormat> format) {
  TORCH_CHECK(!format.has_value() || *format == at::MemoryFormat::Contiguous ||
                  *format == at::MemoryFormat::Preserve,
              "npu twin: resize_ supports the contiguous memory format only, not ", *format);
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  const size_t needed =
      static_cast<size_t>((self.storage_offset() + self.numel()) * self.element_size());
  if (self.numel() > 0 && needed > self.storage().nbytes()) {
    resize_storage_bytes(self.storage().unsafeGetStorageImpl(), needed);
  }
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset,
                        c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK(source.device() == self.device(), "set_: the storage is on ", source.device(),
              " and the tensor on ", self.device());
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_sizes_and_strides(size, stride, offset);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const int64_t items = static_cast<int64_t>(source.nbytes()) / self.element_size();
  return set_storage(self, std::move(source), 0, {items}, {1});
}

// The order of plain_tensors.STAT_NAMES.
std::vector<int64_t> memory_stats(int64_t device) {
  check_device(static_cast<c10::DeviceIndex>(device));
  DeviceStats& s = stats[static_cast<size_t>(device)];
  std::lock_guard<std::mutex> hold(s.lock);
  return {s.allocated,   s.reserved, s.peak_allocated,  s.peak_reserved, s.blocks,
          s.peak_blocks, s.allocations, s.frees, s.allocated_total, s.freed_total,
          s.num_ooms,    s.total};
}

void reset_peak_memory_stats(int64_t device) {
  check_device(static_cast<c10::DeviceIndex>(device));
  DeviceStats& s = stats[static_cast<size_t>(device)];
  std::lock_guard<std::mutex> hold(s.lock);
  s.peak_allocated = s.allocated;
  s.peak_reserved = s.reserved;
  s.peak_blocks = s.blocks;
}

// torch.npu.empty_cache(): the cached (reserved, not allocated) bytes go back.
void empty_cache(int64_t device) {
  check_device(static_cast<c10::DeviceIndex>(device));
  DeviceStats& s = stats[static_cast<size_t>(device)];
  std::lock_guard<std::mutex> hold(s.lock);
  s.reserved = s.allocated;
}

// The device size (memory.total_from_env(), AICPU_TILING_TWIN_DEVICE_MEMORY), set by Python.
void set_memory_total(int64_t device, int64_t total) {
  check_device(static_cast<c10::DeviceIndex>(device));
  TORCH_CHECK(total > 0, "set_memory_total: the device size must be positive, not ", total);
  DeviceStats& s = stats[static_cast<size_t>(device)];
  std::lock_guard<std::mutex> hold(s.lock);
  s.total = total;
}

int64_t twin_device_count() {
  return device_count();
}

int64_t twin_current_device() {
  return current_device;
}

void twin_set_device(int64_t device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "invalid npu device ordinal ", device);
  check_device(static_cast<c10::DeviceIndex>(device));
  current_device = static_cast<c10::DeviceIndex>(device);
}

struct Registration {
  Registration() {
    c10::SetAllocator(kNpu, &allocator);
    at::RegisterPrivateUse1HooksInterface(&hooks);
  }
};

Registration registration;

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &empty_memory_format);
  m.impl("empty_strided", &empty_strided);
  m.impl("as_strided", &at::native::as_strided_tensorimpl);
  m.impl("view", &at::native::view);
  m.impl("_reshape_alias", &at::native::_reshape_alias);
  m.impl("resize_", &resize_);
  m.impl("set_.source_Storage", &set_source_storage);
  m.impl("set_.source_Storage_storage_offset", &set_storage);
}

TORCH_LIBRARY(aicpu_twin, m) {
  m.def("host_alias(Tensor self) -> Tensor", &host_alias);
  m.def("is_pinned_ptr(int data) -> bool", &is_pinned_ptr);
  m.def("memory_stats(int device) -> int[]", &memory_stats);
  m.def("reset_peak_memory_stats(int device) -> ()", &reset_peak_memory_stats);
  m.def("empty_cache(int device) -> ()", &empty_cache);
  m.def("set_memory_total(int device, int total) -> ()", &set_memory_total);
  m.def("device_count() -> int", &twin_device_count);
  m.def("current_device() -> int", &twin_current_device);
  m.def("set_device(int device) -> ()", &twin_set_device);
}

}  // namespace aicpu_twin
