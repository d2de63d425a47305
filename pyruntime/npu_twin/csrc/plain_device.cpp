// The NPU twin's plain-tensor device: torch's PrivateUse1 device (renamed `npu` from Python)
// made of host memory, so that a twin tensor is an ordinary torch.Tensor (no wrapper subclass).
//
// What lives here, and why in C++: the pieces torch only takes from C++.
//   * an allocator over host memory (c10::SetAllocator for PrivateUse1) with live accounting
//     per device: allocated, reserved, peak (torch.npu.memory_allocated & co. read it);
//   * a device guard (C10_REGISTER_GUARD_IMPL): the device count (AICPU_TILING_TWIN_DEVICES,
//     default 2) and the current device, per thread as aclrtSetDevice binds a device to the
//     calling thread;
//   * the PrivateUse1 hooks torch 2.13 asks for (is_available, device count, resize of
//     untyped storages, ...);
//   * the few aten kernels every tensor needs before any op runs: empty, empty_strided,
//     as_strided, view, _reshape_alias, resize_, set_ on a storage, _copy_from(_and_resize),
//     _local_scalar_dense;
//   * `aicpu_twin::host_alias`: a CPU tensor over the same bytes as an npu tensor, which the
//     Python boxed fallback (plain_tensors.py) uses to run every other aten op on the host.
// Every other aten op reaches that one Python fallback: it is the single dispatch point where
// the twin's rules (queued execution, capture records, ...) are to plug in.
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
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace aicpu_twin {
namespace {

constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;
// torch's c10::DeviceIndex is int8_t; 16 is more than any test asks for
constexpr int kMaxDevices = 16;
constexpr unsigned char kPoison = 0xA5;
// Blocks are rounded up as torch_npu's caching allocator rounds them (Ascend/pytorch,
// torch_npu/csrc/core/npu/NPUCachingAllocator.cpp: kMinBlockSize = 512, "all sizes are rounded
// to at least 512 bytes"): `reserved` counts rounded blocks, `allocated` the bytes asked for.
// There is no cache: a freed block goes back at once, so reserved falls with allocated.
constexpr size_t kBlockRound = 512;

int device_count_from_env() {
  const char* text = std::getenv("AICPU_TILING_TWIN_DEVICES");
  if (text == nullptr || *text == '\0') {
    return 2;
  }
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  TORCH_CHECK(*end == '\0' && value >= 1 && value <= kMaxDevices,
              "AICPU_TILING_TWIN_DEVICES must be a whole number from 1 to ", kMaxDevices,
              " (the number of twin npu devices), not '", text, "'");
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
struct DeviceStats {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> reserved{0};
  std::atomic<int64_t> peak_allocated{0};
  std::atomic<int64_t> peak_reserved{0};
  std::atomic<int64_t> live_blocks{0};
};

std::array<DeviceStats, kMaxDevices> stats;

void raise_peak(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load();
  while (value > seen && !peak.compare_exchange_weak(seen, value)) {
  }
}

struct Block {
  void* memory;
  int64_t bytes;
  int64_t rounded;
  c10::DeviceIndex device;
};

void free_block(void* context) {
  auto* block = static_cast<Block*>(context);
  DeviceStats& s = stats[static_cast<size_t>(block->device)];
  s.allocated -= block->bytes;
  s.reserved -= block->rounded;
  s.live_blocks -= 1;
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
    void* memory = std::aligned_alloc(64, rounded);
    TORCH_CHECK(memory != nullptr, "npu twin: out of host memory allocating ", bytes, " bytes");
    std::memset(memory, kPoison, rounded);
    auto* block = new Block{memory, static_cast<int64_t>(bytes), static_cast<int64_t>(rounded),
                            device};
    DeviceStats& s = stats[static_cast<size_t>(device)];
    raise_peak(s.peak_allocated, s.allocated += block->bytes);
    raise_peak(s.peak_reserved, s.reserved += block->rounded);
    s.live_blocks += 1;
    return c10::DataPtr(memory, block, &free_block, where);
  }

  void copy_data(void* dest, const void* src, size_t count) const override {
    std::memcpy(dest, src, count);
  }

  static void noop_delete(void*) {}
};

HostBackedAllocator allocator;

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
  at::Tensor alias = at::empty({0}, tensor.options().device(c10::kCPU));
  alias.set_(host, tensor.storage_offset(), tensor.sizes(), tensor.strides());
  return alias;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool) {
  host_alias(dst).copy_(host_alias(self));
  return dst;
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

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
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

at::Scalar local_scalar_dense(const at::Tensor& self) {
  return host_alias(self).item();
}

std::vector<int64_t> memory_stats(int64_t device) {
  check_device(static_cast<c10::DeviceIndex>(device));
  const DeviceStats& s = stats[static_cast<size_t>(device)];
  return {s.allocated.load(), s.reserved.load(), s.peak_allocated.load(),
          s.peak_reserved.load(), s.live_blocks.load()};
}

void reset_peak_memory_stats(int64_t device) {
  check_device(static_cast<c10::DeviceIndex>(device));
  DeviceStats& s = stats[static_cast<size_t>(device)];
  s.peak_allocated = s.allocated.load();
  s.peak_reserved = s.reserved.load();
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
  m.impl("_copy_from", &copy_from);
  m.impl("_copy_from_and_resize", &copy_from_and_resize);
  m.impl("_local_scalar_dense", &local_scalar_dense);
}

TORCH_LIBRARY(aicpu_twin, m) {
  m.def("host_alias(Tensor self) -> Tensor", &host_alias);
  m.def("memory_stats(int device) -> int[]", &memory_stats);
  m.def("reset_peak_memory_stats(int device) -> ()", &reset_peak_memory_stats);
  m.def("device_count() -> int", &twin_device_count);
  m.def("current_device() -> int", &twin_current_device);
  m.def("set_device(int device) -> ()", &twin_set_device);
}

}  // namespace aicpu_twin
