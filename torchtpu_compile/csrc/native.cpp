// torchtpu's native pieces: what PyTorch only takes from C++.
//
// * The PrivateUse1 ("tpu") device guard. PyTorch's Python-backed guard
//   (torch._C._acc.DeviceGuard) calls into Python from noexcept methods; the autograd engine
//   calls them while unwinding from a hook's exception, with the error still pending, and
//   the failed Python call turns into std::terminate. This guard never calls Python from a
//   noexcept method: one device (index 0), one stream (the default), as the tpu device has
//   (streams.py). Only synchronizing and querying the stream or device, which may raise, call
//   back into Python (streams.py waits for the device's work).
// * The PrivateUse1 hooks, with a pinned-memory allocator: PyTorch asks the current
//   accelerator's hooks for it in torch.empty(pin_memory=True), Tensor.pin_memory() and
//   is_pinned() -- in CPU-only scripts too, once tpu is registered. PJRT copies from any host
//   memory, so "pinned" is ordinary host memory whose blocks we remember.
// * The tpu generator, torch.Generator(device="tpu"): PyTorch asks the hooks for it.
// * Events (torch.Event(device="tpu"), torch.tpu.Event): the guard records, queries,
//   synchronizes and times them.
// * The device allocator that torch.accelerator's memory API asks (memory_allocated,
//   memory_stats, reset_peak_memory_stats, empty_cache, get_memory_info): its figures are
//   torch.tpu's (tpu_module._for_the_allocator). It allocates nothing: tpu memory is PJRT
//   buffers, made by the device's Python side.
// * report_memory: PJRT buffer allocations and frees, for the profiler's memory timeline
//   (profile_memory=True); only C++ can reach c10::reportMemoryUsageToProfiler.
//
// A plain CPython module (no pybind11): it builds in seconds and loads in a millisecond.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>

#include <torch/csrc/Exceptions.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <map>
#include <mutex>

namespace {

// streams.py's synchronize_device() and device_idle(), given to register_device.
PyObject* synchronize_callback = nullptr;
PyObject* query_callback = nullptr;

// Calls a callback under the GIL; its Python exception, if any, propagates as is (torch's
// bindings restore a python_error).
bool call_back(PyObject* callback) {
  PyGILState_STATE state = PyGILState_Ensure();
  PyObject* result = PyObject_CallNoArgs(callback);
  if (result == nullptr) {
    python_error error;
    error.persist();
    PyGILState_Release(state);
    throw error;
  }
  bool truth = PyObject_IsTrue(result) == 1;
  Py_DECREF(result);
  PyGILState_Release(state);
  return truth;
}

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

c10::Device tpu0() {
  return c10::Device(kTpu, 0);
}

// What an event of the tpu device holds (TpuGuard's record): whether it times, and when it
// was last recorded.
struct TpuEvent {
  bool timing;
  bool recorded = false;
  std::chrono::steady_clock::time_point recorded_at{};
};

struct TpuGuard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kTpu;
  }
  c10::Device exchangeDevice(c10::Device /*device*/) const override {
    return tpu0();
  }
  c10::Device getDevice() const override {
    return tpu0();
  }
  void setDevice(c10::Device /*device*/) const override {}
  void uncheckedSetDevice(c10::Device /*device*/) const noexcept override {}
  c10::Stream getStream(c10::Device /*device*/) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, tpu0());
  }
  c10::Stream getNewStream(c10::Device /*device*/, int /*priority*/) const override {
    return c10::Stream(c10::Stream::DEFAULT, tpu0());
  }
  c10::Stream exchangeStream(c10::Stream /*stream*/) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, tpu0());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return 1;
  }
  // Events: torch.Event(device="tpu") and torch.tpu.Event (streams.py). Ordering is issue
  // order on the one PJRT queue, so a stream waiting on an event (block) has nothing to wait
  // for. Synchronizing or querying an event waits for, or asks about, all work issued so far:
  // a superset of the work before the record, never less. A timing event (enable_timing,
  // EventFlag::BACKEND_DEFAULT) waits for the device when recorded, so its host timestamp
  // marks finished work: the host cannot timestamp the device queue without waiting.
  void record(void** event, const c10::Stream& /*stream*/,
              const c10::DeviceIndex /*device_index*/,
              const c10::EventFlag flag) const override {
    auto* marker = static_cast<TpuEvent*>(*event);
    if (marker == nullptr) {
      marker = new TpuEvent{flag == c10::EventFlag::BACKEND_DEFAULT};
      *event = marker;
    }
    if (marker->timing) {
      call_back(synchronize_callback);
    }
    marker->recorded_at = std::chrono::steady_clock::now();
    marker->recorded = true;
  }
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* event) const override {
    auto* marker = static_cast<TpuEvent*>(event);
    return marker == nullptr || !marker->recorded || call_back(query_callback);
  }
  void synchronizeEvent(void* event) const override {
    auto* marker = static_cast<TpuEvent*>(event);
    if (marker != nullptr && marker->recorded) {
      call_back(synchronize_callback);
    }
  }
  double elapsedTime(void* start, void* end,
                     const c10::DeviceIndex /*device_index*/) const override {
    auto* first = static_cast<TpuEvent*>(start);
    auto* last = static_cast<TpuEvent*>(end);
    TORCH_CHECK(first != nullptr && last != nullptr && first->recorded && last->recorded,
                "Both events must be recorded before calculating elapsed time.");
    TORCH_CHECK(first->timing && last->timing,
                "Both events must be created with argument 'enable_timing=True'.");
    return std::chrono::duration<double, std::milli>(last->recorded_at - first->recorded_at)
        .count();
  }
  void destroyEvent(void* event,
                    const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<TpuEvent*>(event);
  }
  // torch.accelerator.synchronize(), torch.Stream.synchronize()/query() on the tpu stream.
  bool queryStream(const c10::Stream& /*stream*/) const override {
    return call_back(query_callback);
  }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {
    call_back(synchronize_callback);
  }
  void synchronizeDevice(const c10::DeviceIndex /*device_index*/) const override {
    call_back(synchronize_callback);
  }
};

// Host memory that is_pinned() reports as pinned: the blocks this allocator handed out and
// that are still alive, looked up by any address inside them (a view's storage may start
// inside a block).
class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (data) {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_[reinterpret_cast<uintptr_t>(data)] = nbytes;
    }
    return {data, data, &PinnedAllocator::release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &PinnedAllocator::release;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  bool holds(const void* ptr) const {
    auto address = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    auto after = blocks_.upper_bound(address);
    if (after == blocks_.begin()) {
      return false;
    }
    --after;
    return address < after->first + after->second;
  }

  static PinnedAllocator& instance() {
    static auto* allocator = new PinnedAllocator();  // never destroyed: tensors outlive exit
    return *allocator;
  }

 private:
  static void release(void* data) {
    if (!data) {
      return;
    }
    {
      std::lock_guard<std::mutex> lock(instance().mutex_);
      instance().blocks_.erase(reinterpret_cast<uintptr_t>(data));
    }
    c10::free_cpu(data);
  }

  mutable std::mutex mutex_;
  std::map<uintptr_t, size_t> blocks_;  // start address -> bytes
};

// torch.Generator(device="tpu"). Random ops on the tpu draw on the host (torchtpu_eager/rng.py):
// a tpu generator is a CPU generator (mt19937) whose device is tpu:0. The host draw runs
// from a CPU generator given this one's state and writes the advanced state back, so a seed
// gives CPU's numbers and states move between tpu and CPU generators in CPU's byte format.
// Its device being tpu is what makes a CPU op refuse it, as a CPU op refuses a CUDA one.
class TpuGenerator final : public c10::GeneratorImpl {
 public:
  TpuGenerator()
      : c10::GeneratorImpl(tpu0(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        host_(c10::make_intrusive<at::CPUGeneratorImpl>()) {}

  void set_current_seed(uint64_t seed) override {
    host_->set_current_seed(seed);
  }
  // mt19937 has no offset: it reads 0. Pickling and copy.deepcopy save and restore it for
  // every generator but CPU's (CPU's raises here), so 0 is taken back; any other offset is
  // refused as CPU's refuses it.
  void set_offset(uint64_t offset) override {
    if (offset != 0) {
      host_->set_offset(offset);
    }
  }
  uint64_t get_offset() const override {
    return 0;
  }
  uint64_t current_seed() const override {
    return host_->current_seed();
  }
  uint64_t seed() override {
    return host_->seed();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    host_->set_state(new_state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    return host_->get_state();
  }

 private:
  TpuGenerator* clone_impl() const override {
    auto* copy = new TpuGenerator();
    copy->host_->set_state(*host_->get_state());
    return copy;
  }

  c10::intrusive_ptr<at::CPUGeneratorImpl> host_;
};

// PyTorch's error for a device index past the last device (CUDA raises the same type).
void check_device_index(c10::DeviceIndex device_index) {
  TORCH_CHECK(device_index <= 0, "tpu:", static_cast<int>(device_index),
              " does not exist: this process drives one device, tpu:0 "
              "(torch.tpu.device_count() is 1)");
}

struct TpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return true;  // the PJRT CPU client is always there when no accelerator is
  }
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override {
    return true;
  }
  bool isPinnedPtr(const void* data) const override {
    return PinnedAllocator::instance().holds(data);
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return &PinnedAllocator::instance();
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    check_device_index(device_index);
    return at::make_generator<TpuGenerator>();
  }
};

// tpu_module._for_the_allocator, given to register_allocator.
PyObject* allocator_callback = nullptr;

// The allocator's request to Python, under the GIL; a new reference (never null: a Python
// error is rethrown as python_error).
PyObject* ask_allocator(const char* request) {
  TORCH_CHECK(allocator_callback != nullptr, "torchtpu: the tpu allocator is not registered");
  PyGILState_STATE state = PyGILState_Ensure();
  PyObject* result = PyObject_CallFunction(allocator_callback, "s", request);
  if (result == nullptr) {
    python_error error;
    error.persist();
    PyGILState_Release(state);
    throw error;
  }
  PyGILState_Release(state);
  return result;
}

int64_t stat_of(PyObject* stats, const std::string& key) {
  PyObject* value = PyDict_GetItemString(stats, key.c_str());  // borrowed
  return value == nullptr ? 0 : PyLong_AsLongLong(value);
}

void fill(c10::CachingDeviceAllocator::StatArray& array, PyObject* stats,
          const std::string& name) {
  auto& all = array[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
  all.current = stat_of(stats, name + ".all.current");
  all.peak = stat_of(stats, name + ".all.peak");
  all.allocated = stat_of(stats, name + ".all.allocated");
  all.freed = stat_of(stats, name + ".all.freed");
}

class TpuAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t /*nbytes*/) override {
    TORCH_CHECK(false, "tpu memory is held in PJRT buffers that tpu tensors make; it cannot be "
                "allocated through c10's allocator (make a tensor on device='tpu' instead)");
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return nullptr;
  }
  void copy_data(void* /*dest*/, const void* /*src*/, std::size_t /*count*/) const override {
    TORCH_CHECK(false, "tpu memory cannot be copied through c10's allocator");
  }
  bool initialized() override {
    return true;
  }
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    Py_DECREF(ask_allocator("empty_cache"));
  }
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(
      c10::DeviceIndex /*device*/) override {
    PyObject* stats = ask_allocator("stats");
    c10::CachingDeviceAllocator::DeviceStats out;
    {
      PyGILState_STATE state = PyGILState_Ensure();
      fill(out.allocated_bytes, stats, "allocated_bytes");
      fill(out.active_bytes, stats, "active_bytes");
      fill(out.allocation, stats, "allocation");
      fill(out.active, stats, "active");
      fill(out.reserved_bytes, stats, "reserved_bytes");
      fill(out.requested_bytes, stats, "allocated_bytes");
      Py_DECREF(stats);
      PyGILState_Release(state);
    }
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex /*device*/) override {
    Py_DECREF(ask_allocator("reset_accumulated"));
  }
  void resetPeakStats(c10::DeviceIndex /*device*/) override {
    Py_DECREF(ask_allocator("reset_peak"));
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex /*device*/) override {
    PyObject* info = ask_allocator("memory_info");
    PyGILState_STATE state = PyGILState_Ensure();
    unsigned long long free_bytes = 0, total_bytes = 0;
    bool parsed = PyArg_ParseTuple(info, "KK", &free_bytes, &total_bytes);
    Py_DECREF(info);
    if (!parsed) {
      python_error error;
      error.persist();
      PyGILState_Release(state);
      throw error;
    }
    PyGILState_Release(state);
    return {static_cast<size_t>(free_bytes), static_cast<size_t>(total_bytes)};
  }
};

PyObject* register_allocator(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1 || !PyCallable_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "register_allocator(for_the_allocator)");
    return nullptr;
  }
  if (allocator_callback == nullptr) {
    Py_INCREF(args[0]);
    allocator_callback = args[0];
    static TpuAllocator allocator;
    c10::SetAllocator(kTpu, &allocator);
  }
  Py_RETURN_NONE;
}

PyObject* register_device(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "register_device(synchronize, query)");
    return nullptr;
  }
  if (at::isPrivateUse1HooksRegistered() ||
      c10::impl::hasDeviceGuardImpl(kTpu)) {
    PyErr_SetString(PyExc_RuntimeError,
                    "cannot register the 'tpu' device: PrivateUse1 already has hooks or a "
                    "device guard (another out-of-tree backend registered them first)");
    return nullptr;
  }
  Py_INCREF(args[0]);
  Py_INCREF(args[1]);
  synchronize_callback = args[0];
  query_callback = args[1];
  static TpuGuard guard;
  static TpuHooks hooks;
  c10::impl::registerDeviceGuard(kTpu, &guard);
  at::RegisterPrivateUse1HooksInterface(&hooks);
  Py_RETURN_NONE;
}

PyObject* report_memory(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "report_memory(key, delta_bytes, live_bytes)");
    return nullptr;
  }
  auto key = PyLong_AsUnsignedLongLongMask(args[0]);
  auto delta = PyLong_AsLongLong(args[1]);
  auto live = PyLong_AsLongLong(args[2]);
  if (PyErr_Occurred()) {
    return nullptr;
  }
  c10::reportMemoryUsageToProfiler(reinterpret_cast<void*>(static_cast<uintptr_t>(key)),
                                   delta, static_cast<size_t>(live),
                                   static_cast<size_t>(live), tpu0());
  Py_RETURN_NONE;
}

// A tpu tensor is a wrapper subclass: PyTorch gives it a storage with no data pointer, and
// `untyped_storage().data_ptr()` raises. Code that tells storages apart by that pointer (as
// it can on CUDA) then fails: transformers' save_pretrained (tied weights), safetensors'
// shared-tensor check, accelerate's tied-parameter search. The storage is given a stable
// identity instead: a pointer that names the tensor's torchtpu Storage (never dereferenced:
// the device's data lives in PJRT buffers) and that Storage's size in bytes, so tensors over
// one Storage report the same pointer and size, as views of one CUDA allocation do.
PyObject* set_storage_identity(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !THPVariable_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "set_storage_identity(tensor, key, nbytes)");
    return nullptr;
  }
  auto key = PyLong_AsUnsignedLongLongMask(args[1]);
  auto nbytes = PyLong_AsLongLong(args[2]);
  if (PyErr_Occurred()) {
    return nullptr;
  }
  const at::Tensor& tensor = THPVariable_Unpack(args[0]);
  c10::StorageImpl* storage = tensor.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(
      c10::DataPtr(reinterpret_cast<void*>(static_cast<uintptr_t>(key)), tensor.device()));
  storage->set_nbytes(static_cast<size_t>(nbytes));
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"register_device",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(register_device)),
     METH_FASTCALL,
     "register_device(synchronize, query): register the tpu (PrivateUse1) device guard and "
     "hooks, once per process; the guard calls synchronize() to wait for the device and "
     "query() to ask whether it is idle."},
    {"register_allocator",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(register_allocator)),
     METH_FASTCALL,
     "register_allocator(for_the_allocator): the tpu device allocator torch.accelerator's "
     "memory API asks; for_the_allocator(request) answers it (tpu_module)."},
    {"report_memory", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(report_memory)),
     METH_FASTCALL,
     "report_memory(key, delta_bytes, live_bytes): one tpu allocation (delta > 0) or free "
     "(delta < 0) for the profiler's memory timeline; a no-op unless it records memory."},
    {"set_storage_identity",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(set_storage_identity)),
     METH_FASTCALL,
     "set_storage_identity(tensor, key, nbytes): the data pointer (key, never dereferenced) "
     "and size that a tpu tensor's untyped_storage() reports."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native",
                      "torchtpu's native pieces (csrc/native.cpp)", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__native() {
  return PyModule_Create(&module);
}
