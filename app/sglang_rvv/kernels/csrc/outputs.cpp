// The ops' outputs. A decode step allocates and frees the same few small outputs call after call
// (a projection's, a norm's, an MLP's), and each round trip through at::empty (the dispatcher,
// posix_memalign and free, the profiler's report) cost about 2 k instructions under emulation,
// a sixth of a projection call's outside its kernel. So a dying output's block, up to 1 MiB, is
// kept for the next output of its size class, a few blocks per class: a lock-free exchange and
// no allocation. Larger outputs, and every output while the profiler records memory or while
// another CPU allocator is installed, come from torch's CPU allocator, as at::empty's do.

#include "outputs.h"

#include <array>
#include <atomic>
#include <cstddef>
#include <utility>

#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

namespace sglang_rvv {
namespace {

constexpr int kMinClass = 8;   // 256 bytes
constexpr int kMaxClass = 20;  // 1 MiB: an lm_head's output row at the supported vocabularies
constexpr int kClasses = kMaxClass - kMinClass + 1;
constexpr int kSlots = 4;  // blocks kept per class: at most 4 x 2 MiB in all

// Trivially destructible: a tensor that dies during exit still finds it.
std::array<std::array<std::atomic<void*>, kSlots>, kClasses> g_kept{};

// The smallest class c with 2^c >= n bytes.
int size_class(size_t n) {
  int c = kMinClass;
  while ((size_t{1} << c) < n) ++c;
  return c;
}

// A block's deleter, one per class: keep it in a free slot, else free it.
template <int Class>
void release(void* block) {
  for (std::atomic<void*>& slot : g_kept[Class - kMinClass]) {
    void* empty = nullptr;
    if (slot.load(std::memory_order_relaxed) == nullptr &&
        slot.compare_exchange_strong(empty, block, std::memory_order_release, std::memory_order_relaxed)) {
      return;
    }
  }
  c10::free_cpu(block);
}

template <size_t... I>
constexpr std::array<c10::DeleterFnPtr, kClasses> deleters(std::index_sequence<I...>) {
  return {&release<kMinClass + static_cast<int>(I)>...};
}

constexpr std::array<c10::DeleterFnPtr, kClasses> kDeleters = deleters(std::make_index_sequence<kClasses>());

class ReusingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    c10::Allocator* cpu = c10::GetCPUAllocator();
    if (n == 0 || n > (size_t{1} << kMaxClass) || cpu != c10::GetDefaultCPUAllocator() ||
        c10::memoryProfilingEnabled()) {
      return cpu->allocate(n);
    }
    const int c = size_class(n);
    void* block = nullptr;
    for (std::atomic<void*>& slot : g_kept[c - kMinClass]) {
      if (slot.load(std::memory_order_relaxed) != nullptr &&
          (block = slot.exchange(nullptr, std::memory_order_acquire)) != nullptr) {
        break;
      }
    }
    if (block == nullptr) block = c10::alloc_cpu(size_t{1} << c);
    return {block, block, kDeleters[c - kMinClass], c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

}  // namespace

at::Tensor new_output(at::IntArrayRef sizes, at::ScalarType dtype) {
  static ReusingAllocator* const allocator = new ReusingAllocator();  // kept for the process, as g_kept
  return at::Tensor(at::detail::empty_generic(sizes, allocator, c10::DispatchKeySet(c10::DispatchKey::CPU), dtype,
                                              std::nullopt));
}

}  // namespace sglang_rvv
