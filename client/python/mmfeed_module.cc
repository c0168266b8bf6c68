// _mmfeed: the Python binding of the mmfeed client (client/client.h). One thin file that
// translates types and errors, nothing else. Lifetimes are held, never documented: every
// numpy array made from a batch owns a reference to the batch's lease (a capsule as the
// array's base), so the slot stays held until the last array (or tensor made from one) is gone.
// The GIL is released around every wait.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>

#include "base/clock.h"
#include "base/tensor.h"
#include "client/client.h"

namespace py = pybind11;
using mmfeed::Batch;
using mmfeed::Client;
using mmfeed::Status;
using mmfeed::StreamCursor;

namespace {

py::object g_daemon_gone, g_attach_error, g_stopped_early;

[[noreturn]] void Raise(const Status& st, bool attaching = false) {
  if (attaching && st.code() != Status::Code::kTimeout) {
    PyErr_SetString(g_attach_error.ptr(), st.message().c_str());
    throw py::error_already_set();
  }
  switch (st.code()) {
    case Status::Code::kTimeout:
      PyErr_SetString(PyExc_TimeoutError, st.message().c_str());
      break;
    case Status::Code::kUnavailable:
      PyErr_SetString(g_daemon_gone.ptr(), st.message().c_str());
      break;
    case Status::Code::kClosed:
      PyErr_SetString(g_stopped_early.ptr(), st.message().c_str());
      break;
    default:
      PyErr_SetString(PyExc_RuntimeError, st.message().c_str());
  }
  throw py::error_already_set();
}

py::dtype DType(uint32_t d) {
  switch (static_cast<mmfeed::DType>(d)) {
    case mmfeed::DType::kUInt8:
      return py::dtype::of<uint8_t>();
    case mmfeed::DType::kInt32:
      return py::dtype::of<int32_t>();
    case mmfeed::DType::kFloat32:
      return py::dtype::of<float>();
    case mmfeed::DType::kInt64:
      return py::dtype::of<int64_t>();
    case mmfeed::DType::kBFloat16:  // its bits: numpy has no bfloat16 (Batch.torch() views them)
      return py::dtype::of<uint16_t>();
  }
  throw std::runtime_error("unknown dtype " + std::to_string(d));
}

py::dict CursorDict(const StreamCursor& c) {
  py::dict d;
  d["epoch"] = c.epoch;
  d["batch"] = c.batch;
  d["seq"] = c.seq;
  if (c.stream) d["stream"] = c.stream;  // the stream the cursor belongs to (checked at resume)
  if (c.order) {  // the job's position, from which a job at another shape resumes
    d["order"] = c.order;
    d["position"] = c.position;
    if (c.lanes) d["lanes"] = c.lanes;  // the shape that numbered the position (a mixture's,
    if (c.nodes) d["nodes"] = c.nodes;  // shard windows')
  }
  return d;
}

// The Python Batch: holds the lease until release() or its own end; arrays hold their own.
// The ring mapping a batch lives in; keeps it mapped while referenced (for registering it with
// the CUDA runtime: mmfeed.torch.to_device).
struct PyRing {
  uintptr_t address = 0;
  uint64_t size = 0;
  std::shared_ptr<const void> owner;
  mmfeed::shm::RingReader* reader = nullptr;  // alive while owner is held

  // The bytes [p, p + n) of the copy-on-write view (Batch.torch()'s tensors) in this read-only
  // mapping, as a uint8 array, if none of them was written; else None (they differ from the
  // ring's now). mmfeed.torch.to_device copies from here, the memory it registered.
  py::object SharedView(uintptr_t p, uint64_t n) const {
    const auto* at = reinterpret_cast<const uint8_t*>(p);
    // Not ok when the bytes are not in the copy-on-write view (or it was never mapped).
    auto written = reader->Written(at, n);
    if (!written.ok() || *written) return py::none();
    auto cow = reader->CopyOnWriteView();  // mapped already: Written found the bytes in it
    if (!cow.ok()) return py::none();
    auto* hold = new std::shared_ptr<const void>(owner);
    py::capsule keep(hold, [](void* o) { delete static_cast<std::shared_ptr<const void>*>(o); });
    py::array a(py::dtype::of<uint8_t>(), {static_cast<py::ssize_t>(n)}, {},
                reinterpret_cast<const void*>(address + (at - *cow)), keep);
    py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    return a;
  }
};

// A batch on its way to the caller. Next() cannot know whether the caller received what it
// returned: an exception raised between the return and the caller's assignment (a signal
// handler's, KeyboardInterrupt, PyErr_SetAsyncExc's; CPython runs them as the call returns)
// drops the returned object. So the lease lives here, shared by the Python Batch and a guard
// in its __dict__, until the caller is known to hold it: a batch whose methods were never
// called and which dies while an exception is being raised was never received, and goes back
// to the client (Handback) to be returned by the next next().
struct Delivery {
  std::shared_ptr<Batch> batch;
  bool received = false;  // a method or attribute of the Batch was used
};
struct Handback {
  std::shared_ptr<Batch> batch;  // returned by the next next(), before anything from the ring
};

class PyBatch {
 public:
  explicit PyBatch(std::shared_ptr<Delivery> d) : delivery_(std::move(d)) {}

  // Marks the batch received by the caller (every method and attribute does).
  void Touch() const { delivery_->received = true; }

  const Batch& get() const {
    Touch();
    if (!lease()) throw std::runtime_error("this batch was released");
    return *lease();
  }

  // A zero-copy array of one tensor: read-only on the ring's mapping, or writable on its
  // copy-on-write view (writes stay in this process and go with the batch's release).
  py::array Array(const mmfeed::shm::TensorView& t, bool writable = false) const {
    const void* data = t.data;
    if (writable) {
      mmfeed::Result<Batch::Mapping> cow = get().copy_on_write_mapping();
      if (!cow.ok()) Raise(cow.status());
      data = static_cast<const uint8_t*>(cow->base) +
             (t.data - static_cast<const uint8_t*>(get().mapping().base));
    }
    auto* hold = new std::shared_ptr<Batch>(lease());
    py::capsule owner(hold, [](void* p) { delete static_cast<std::shared_ptr<Batch>*>(p); });
    std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
    py::array a(DType(t.dtype), shape, {}, data, owner);
    if (!writable)
      py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    return a;
  }

  py::array Get(const std::string& name) const {
    const mmfeed::shm::TensorView* t = get().tensor(name);
    if (!t) throw py::key_error(name);
    return Array(*t);
  }

  py::dict Tensors(bool writable = false) const {
    py::dict d;
    for (const auto& t : get().tensors()) d[py::str(t.name)] = Array(t, writable);
    return d;
  }

  py::dict DTypes() const {
    py::dict d;
    for (const auto& t : get().tensors())
      d[py::str(t.name)] = mmfeed::DTypeName(static_cast<mmfeed::DType>(t.dtype));
    return d;
  }

  std::vector<std::string> Keys() const {
    std::vector<std::string> out;
    for (const auto& t : get().tensors()) out.push_back(t.name);
    return out;
  }

  py::list Ids() const {
    py::list l;
    for (auto id : get().ids()) l.append(py::str(id.data(), id.size()));
    return l;
  }

  void Release() {
    Touch();
    if (!lease()) return;
    long others = lease().use_count() - 1;
    if (others > 0)
      throw std::runtime_error(
          std::to_string(others) +
          " array(s) or tensor(s) made from this batch are still alive; the slot is "
          "released when the last of them goes");
    delivery_->batch.reset();
  }

  bool released() const {
    Touch();
    return !lease();
  }

  PyRing Ring() const {
    Batch::Mapping m = get().mapping();
    return {reinterpret_cast<uintptr_t>(m.base), m.size, m.owner, m.ring};
  }

 private:
  const std::shared_ptr<Batch>& lease() const { return delivery_->batch; }
  std::shared_ptr<Delivery> delivery_;
};

// The guard's capsule destructor: a raw PyCapsule_Destructor, called as the Batch's __dict__
// is cleared with the error indicator as the interpreter left it (pybind11's own capsule
// destructor and its instance dealloc hide it).
constexpr const char* kGuardName = "mmfeed.delivery";
struct Guard {
  std::shared_ptr<Delivery> delivery;
  std::shared_ptr<Handback> back;
};
void GuardDestructor(PyObject* capsule) {
  auto* g = static_cast<Guard*>(PyCapsule_GetPointer(capsule, kGuardName));
  if (!g) {  // not ours: never happens, but never raise from a destructor
    PyErr_Clear();
    return;
  }
  if (!g->delivery->received && g->delivery->batch && PyErr_Occurred() && !g->back->batch)
    g->back->batch = std::move(g->delivery->batch);
  delete g;
}

// No socket given and no $MMFEED_SOCKET: the service's socket, else the one mmfeedd uses when
// started by hand (its --socket default), whichever exists; the service's when neither does.
std::string DefaultSocket() {
  for (const char* path : {mmfeed::kServiceSocket, mmfeed::kDefaultSocket}) {
    struct stat st;
    if (::stat(path, &st) == 0 && S_ISSOCK(st.st_mode)) return path;
  }
  return mmfeed::kServiceSocket;
}

// resume=: a cursor dict ({"seq": S, ...}, a Batch.cursor) or a seq, checked as the daemon
// checks a cursor (CursorFromJson); anything else is a ValueError naming what was given.
StreamCursor ResumeCursor(const py::object& resume) {
  // A Python int (not a bool) as JSON; anything else, a negative one included, as null, which
  // no cursor field accepts.
  auto number = [](const py::handle& v) -> nlohmann::json {
    if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) return nullptr;
    const unsigned long long x = PyLong_AsUnsignedLongLong(v.ptr());
    if (PyErr_Occurred()) {  // negative, or past 64 bits
      PyErr_Clear();
      return nullptr;
    }
    return static_cast<uint64_t>(x);
  };
  nlohmann::json j = nlohmann::json::object();
  if (py::isinstance<py::dict>(resume)) {
    for (auto [key, value] : resume.cast<py::dict>())
      j[py::str(key).cast<std::string>()] = number(value);
  } else {
    j["seq"] = number(resume);
  }
  mmfeed::Result<StreamCursor> c = mmfeed::CursorFromJson(j);
  if (!c.ok())
    throw py::value_error("resume=" + py::repr(resume).cast<std::string>() + ": " +
                          c.status().message() + " (a Batch.cursor, or a seq)");
  return *c;
}

class PyClient {
 public:
  PyClient(py::object socket, py::object rank, py::object resume, double reconnect_s,
           py::object timeout_s) {
    std::string path;
    if (!socket.is_none())
      path = py::str(socket);
    else if (const char* s = std::getenv("MMFEED_SOCKET"))
      path = s;
    else
      path = DefaultSocket();
    // No rank: the launcher's local rank (torchrun's or Slurm's variables, which the attach
    // also declares as the job's shape), else 0.
    int r = -1;
    if (!rank.is_none()) {
      r = rank.cast<int>();
    } else {
      mmfeed::Result<std::optional<mmfeed::JobShape>> job = mmfeed::JobShapeFromEnvironment();
      if (!job.ok()) Raise(job.status(), /*attaching=*/true);
      if (!*job && !std::getenv("LOCAL_RANK")) r = 0;  // else Client::Attach reads it
    }
    mmfeed::AttachOptions opt;
    opt.reconnect_s = reconnect_s;
    if (!resume.is_none()) opt.resume = ResumeCursor(resume);
    timeout_ms_ = timeout_s.is_none() ? -1 : static_cast<int>(timeout_s.cast<double>() * 1000);
    mmfeed::Result<std::unique_ptr<Client>> c = [&] {
      py::gil_scoped_release nogil;
      return Client::Attach(path, r, opt);
    }();
    if (!c.ok()) Raise(c.status(), /*attaching=*/true);
    client_ = std::move(c.value());
  }

  // The next batch, or None at the end of the data. Waits in steps of at most 100 ms, checking
  // for signals between them (Ctrl-C raises KeyboardInterrupt). A batch dropped by an
  // exception on its way to the caller is returned again first (Delivery).
  py::object Next(py::object timeout_s) {
    if (back_->batch) return Deliver(std::move(back_->batch));
    int ms = timeout_s.is_none() ? timeout_ms_ : static_cast<int>(timeout_s.cast<double>() * 1000);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    mmfeed::Result<std::shared_ptr<Batch>> b = mmfeed::Status::Timeout("");
    while (true) {
      int step = 100;
      if (ms >= 0) step = std::min(100, mmfeed::RemainingMs(deadline));
      b = [&] {
        py::gil_scoped_release nogil;
        return client_->Next(step, /*explain_timeout=*/false);
      }();
      if (b.ok() || b.status().code() != mmfeed::Status::Code::kTimeout) break;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (ms >= 0 && std::chrono::steady_clock::now() >= deadline) {
        const std::string why = [&] {
          py::gil_scoped_release nogil;
          return client_->WhyNoBatch(ms);
        }();
        b = mmfeed::Status::Timeout(why);
        break;
      }
    }
    if (!b.ok()) Raise(b.status());
    if (!*b) return py::none();
    return Deliver(std::move(*b));
  }

  py::object IterNext() {
    py::object b = Next(py::none());
    if (b.is_none()) throw py::stop_iteration();
    return b;
  }

  int rank() const { return client_->rank(); }
  std::string info() const { return client_->info().dump(); }

 private:
  // The Python Batch of `b`, with its guard; an error on the way (memory) hands `b` back.
  py::object Deliver(std::shared_ptr<Batch> b) {
    auto delivery = std::make_shared<Delivery>();
    delivery->batch = std::move(b);
    try {
      py::object obj = py::cast(PyBatch(delivery));
      py::capsule guard(new Guard{delivery, back_}, kGuardName, GuardDestructor);
      obj.attr("__dict__")["_delivery"] = guard;
      return obj;
    } catch (...) {
      if (delivery->batch && !back_->batch) back_->batch = std::move(delivery->batch);
      throw;
    }
  }

  std::unique_ptr<Client> client_;
  int timeout_ms_ = -1;
  std::shared_ptr<Handback> back_ = std::make_shared<Handback>();
};

}  // namespace

PYBIND11_MODULE(_mmfeed, m) {
  m.doc() = "mmfeed client: zero-copy batches from an mmfeedd daemon (see the mmfeed package)";
  g_daemon_gone = py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "mmfeed.DaemonGone", "The daemon went away before the end of the data.",
      PyExc_ConnectionError, nullptr));
  g_attach_error = py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "mmfeed.AttachError", "Attach refused: rank taken or out of range, permission, no daemon.",
      PyExc_RuntimeError, nullptr));
  g_stopped_early = py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "mmfeed.StoppedEarly", "The daemon stopped before the end of the data.", PyExc_RuntimeError,
      nullptr));
  m.attr("DaemonGone") = g_daemon_gone;
  m.attr("AttachError") = g_attach_error;
  m.attr("StoppedEarly") = g_stopped_early;

  py::class_<PyBatch>(
      m, "Batch", py::dynamic_attr(),
      "One batch: a lease on a ring slot, held while it or any array made from it lives.")
      .def_property_readonly(
          "seq", [](const PyBatch& b) { return b.get().seq(); },
          "Batch number in the rank's stream.")
      .def_property_readonly("epoch", [](const PyBatch& b) { return b.get().epoch(); })
      .def_property_readonly("ids", &PyBatch::Ids, "Sample ids, one per row.")
      .def_property_readonly(
          "cursor", [](const PyBatch& b) { return CursorDict(b.get().cursor()); },
          "The rank's cursor after this batch: resume=cursor continues after it.")
      .def_property_readonly(
          "tensors", [](const PyBatch& b) { return b.Tensors(); },
          "Tensor name -> read-only zero-copy numpy array (a bfloat16 tensor's bits as uint16).")
      .def(
          "_writable_tensors", [](const PyBatch& b) { return b.Tensors(/*writable=*/true); },
          "Tensor name -> writable zero-copy numpy array on the ring's copy-on-write view: a "
          "write stays in this process and is dropped when the batch is released.")
      .def_property_readonly("dtypes", &PyBatch::DTypes,
                             "Tensor name -> the daemon's dtype name (uint8, int32, float32, "
                             "int64, bfloat16).")
      .def("keys", &PyBatch::Keys)
      .def("__getitem__", &PyBatch::Get, "A read-only zero-copy numpy view of one tensor.")
      .def("__contains__",
           [](const PyBatch& b, const std::string& n) { return b.get().tensor(n) != nullptr; })
      .def(
          "release", &PyBatch::Release,
          "Releases the slot now. Raises if arrays or tensors made from the batch are still alive.")
      .def_property_readonly("released", &PyBatch::released)
      .def_property_readonly("ring", &PyBatch::Ring,
                             "The ring mapping the batch lives in (one per attach).")
      .def(
          "__enter__",
          [](PyBatch& b) -> PyBatch& {
            b.Touch();
            return b;
          },
          py::return_value_policy::reference)
      .def("__exit__", [](PyBatch& b, py::args) { b.Release(); });

  py::class_<PyRing>(m, "Ring",
                     "A ring mapping: `address` and `size` of the read-only memory every batch "
                     "of one attach lives in. Keeps it mapped while referenced.")
      .def_readonly("address", &PyRing::address)
      .def_readonly("size", &PyRing::size)
      .def("_shared_view", &PyRing::SharedView, py::arg("address"), py::arg("nbytes"),
           "The bytes at `address` in a batch's writable tensors, as a read-only uint8 array on "
           "this mapping, or None if any of them was written.")
      .def("__repr__", [](const PyRing& r) {
        return "<mmfeed.Ring 0x" + (std::ostringstream() << std::hex << r.address).str() + ", " +
               std::to_string(r.size) + " bytes>";
      });

  py::class_<PyClient>(m, "_Client")
      .def(py::init<py::object, py::object, py::object, double, py::object>(),
           py::arg("socket") = py::none(), py::arg("rank") = py::none(),
           py::arg("resume") = py::none(), py::arg("reconnect_s") = 0.0,
           py::arg("timeout_s") = py::none())
      .def("next", &PyClient::Next, py::arg("timeout_s") = py::none())
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &PyClient::IterNext)
      .def_property_readonly("rank", &PyClient::rank)
      .def_property_readonly("_info", &PyClient::info);
}
