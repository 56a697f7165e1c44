// paramd._paramd: Python bindings of the C++ client (client/client.h). Tensors cross as Python
// buffers: pushes read the caller's memory in place, and a pull hands its byte vector to Python
// without a copy (a PulledBytes object owns it and exposes the buffer protocol, which
// torch.frombuffer and numpy view). Every call that waits on the daemon releases the GIL, so a
// push or pull thread runs beside the trainer's backward and forward.
//
// Enum values travel as the proto names without their prefix, lower case ("fp8_block",
// "columnwise", "bf16_remainder"), parsed by the generated *_Parse functions, so this file keeps
// no table of its own.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "client/client.h"
#include "client/job_state.h"
#include "client/wait_until_serving.h"
#include "common/element_type.h"
#include "common/version.h"
#include "transport/shm/gpu_copies.h"

namespace py = pybind11;

namespace paramd {
namespace {

// Raised for every non-OK status; carries the daemon's code name so Python can tell them apart.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(const absl::Status& status)
      : std::runtime_error(status.ToString()), code_(absl::StatusCodeToString(status.code())) {}
  const std::string& code() const { return code_; }

 private:
  std::string code_;
};

void Check(const absl::Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T Value(absl::StatusOr<T> result) {
  Check(result.status());
  return *std::move(result);
}

std::string Upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  return s;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// "fp8_block" -> RECIPE_FP8_BLOCK through the generated parser; a bad name is a ValueError.
template <typename Enum, typename Parse>
Enum ParseEnum(const std::string& prefix, const std::string& name, Parse parse) {
  Enum value{};
  if (name.empty() || !parse(prefix + Upper(name), &value) || static_cast<int>(value) == 0) {
    throw py::value_error("unknown " + Lower(prefix) + " value \"" + name + "\"");
  }
  return value;
}

// The reverse: RECIPE_FP8_BLOCK -> "fp8_block".
std::string EnumName(const std::string& full, const std::string& prefix) {
  return Lower(full.substr(std::min(full.size(), prefix.size())));
}

// "recipe" or "recipe:direction" (e.g. "mxfp8:columnwise").
v1::ServeFormat ParseFormat(const std::string& text) {
  v1::ServeFormat format;
  const size_t colon = text.find(':');
  format.set_recipe(ParseEnum<v1::Recipe>("RECIPE_", text.substr(0, colon), v1::Recipe_Parse));
  if (colon != std::string::npos) {
    format.set_direction(
        ParseEnum<v1::Direction>("DIRECTION_", text.substr(colon + 1), v1::Direction_Parse));
  }
  return format;
}

std::string FormatName(const v1::ServeFormat& format) {
  std::string name = EnumName(v1::Recipe_Name(format.recipe()), "RECIPE_");
  if (format.direction() == v1::DIRECTION_COLUMNWISE) name += ":columnwise";
  return name;
}

v1::ElementType ParseElementType(const std::string& name) {
  return ParseEnum<v1::ElementType>("ELEMENT_TYPE_", name, v1::ElementType_Parse);
}

std::string ElementTypeName(v1::ElementType type) {
  return EnumName(v1::ElementType_Name(type), "ELEMENT_TYPE_");
}

// A contiguous byte range to push: a Python buffer (host memory), whose view is held while the
// bytes are read, or an object with __cuda_array_interface__ (a CUDA tensor: GPU memory, which the
// caller keeps alive; only a transport that reads device memory takes it).
struct HeldBytes {
  std::optional<py::buffer_info> info;
  std::span<const std::byte> bytes;
  bool on_device = false;
};

// The bytes of a CUDA array (CUDA Array Interface, version 2 or 3): C-contiguous only.
HeldBytes HoldDevice(const py::dict& cai) {
  const auto shape = py::cast<std::vector<int64_t>>(cai["shape"]);
  const std::string typestr = py::cast<std::string>(cai["typestr"]);
  const int64_t itemsize = typestr.size() >= 3 ? std::stoll(typestr.substr(2)) : 0;
  if (itemsize <= 0)
    throw py::value_error("unreadable __cuda_array_interface__ typestr " + typestr);
  int64_t size = 1;
  for (int64_t extent : shape) size *= extent;
  if (cai.contains("strides") && !cai["strides"].is_none()) {
    const auto strides = py::cast<std::vector<int64_t>>(cai["strides"]);
    int64_t stride = itemsize;
    for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
      if (shape[i] > 1 && strides[i] != stride) {
        throw py::value_error("paramd needs contiguous GPU tensors (call .contiguous() first)");
      }
      stride *= shape[i];
    }
  }
  const auto data = py::cast<std::pair<uintptr_t, bool>>(cai["data"]);
  HeldBytes held;
  held.bytes = {reinterpret_cast<const std::byte*>(data.first),
                static_cast<size_t>(size * itemsize)};
  held.on_device = true;
  return held;
}

HeldBytes Hold(const py::object& object) {
  if (py::isinstance<py::tuple>(object)) {
    // (address, size) of GPU memory the caller keeps alive (paramd.torch's gradients: cheaper
    // to hand over than an array interface, once per parameter and step).
    const auto [address, size] = py::cast<std::pair<uintptr_t, int64_t>>(object);
    if (size < 0) throw py::value_error("a negative byte count");
    HeldBytes held;
    held.bytes = {reinterpret_cast<const std::byte*>(address), static_cast<size_t>(size)};
    held.on_device = true;
    return held;
  }
  if (py::hasattr(object, "__cuda_array_interface__")) {
    return HoldDevice(py::cast<py::dict>(object.attr("__cuda_array_interface__")));
  }
  HeldBytes held{py::cast<py::buffer>(object).request(), {}};
  const py::buffer_info& info = *held.info;
  // A C-contiguous buffer's bytes are one range of itemsize * size bytes.
  int64_t stride = info.itemsize;
  for (int i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] > 1 && info.strides[i] != stride) {
      throw py::value_error("paramd needs C-contiguous buffers (call .contiguous() first)");
    }
    stride *= info.shape[i];
  }
  held.bytes = {static_cast<const std::byte*>(info.ptr),
                static_cast<size_t>(info.itemsize * info.size)};
  return held;
}

// Whether every transport of the client (one per owner daemon of a sharded job) reads GPU memory
// (TransportTraits::reads_device_memory); false before Register.
bool ReadsGpuMemory(const Client& client) {
  const std::vector<Client::OwnerTransport> owners = client.transport_traits();
  return !owners.empty() && std::all_of(owners.begin(), owners.end(), [](const auto& owner) {
    return owner.traits.reads_device_memory;
  });
}

// The client's transports as Python reads them: one dict per owner daemon (Client::OwnerTransport)
// with daemon, name, reads_device_memory, views_in_place and memory ("host", "device" or None).
py::list TransportTraitsList(const Client& client) {
  py::list out;
  for (const Client::OwnerTransport& owner : client.transport_traits()) {
    py::dict d;
    d["daemon"] = owner.daemon;
    d["name"] = owner.name;
    d["reads_device_memory"] = owner.traits.reads_device_memory;
    d["views_in_place"] = owner.traits.views_in_place;
    if (!owner.traits.memory.has_value()) {
      d["memory"] = py::none();
    } else {
      d["memory"] = *owner.traits.memory == Memory::kDevice ? "device" : "host";
    }
    out.append(std::move(d));
  }
  return out;
}

// Pushes [(tensor name, buffer or CUDA array)] with the GIL released while the bytes move. GPU
// memory is read only by a transport whose traits say it reads device memory (cuda_ipc's copies
// read either memory; nccl sends from it); any other transport would read it as host memory, so
// it is refused before anything moves.

template <typename PushFn>
void PushBuffers(const Client& client, const std::vector<std::pair<std::string, py::object>>& items,
                 PushFn push) {
  std::vector<HeldBytes> held;
  std::vector<PushItem> push_items;
  held.reserve(items.size());
  push_items.reserve(items.size());
  for (const auto& [name, buffer] : items) {
    held.push_back(Hold(buffer));
    if (held.back().on_device && !ReadsGpuMemory(client)) {
      throw StatusError(absl::FailedPreconditionError(
          "tensor \"" + name +
          "\" is in GPU memory, which only a transport that reads device memory takes (this " +
          "client uses " +
          (client.transport_name().empty() ? std::string("no transport yet")
                                           : client.transport_name()) +
          "); register first, run the daemon with --backend=cuda:N on this node, or copy the " +
          "tensor to the CPU"));
    }
    push_items.push_back({name, held.back().bytes});
  }
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = push(std::span<const PushItem>(push_items));
  }
  Check(status);
}

// The bytes of one pull (data, then scales), owned here and lent to Python as a read-write
// uint8 buffer (writable so torch.frombuffer does not warn; the bytes are this object's own).
struct PulledBytes {
  v1::PullHeader header;
  std::vector<std::byte> bytes;
};

// A pull read in place (Client::PullInPlace): the served bytes where they lie, under a lease that
// this object holds. The lease ends with release() or when the object goes (a torch tensor made by
// torch.frombuffer keeps it alive: the lease is tied to the tensor that views it), or when its
// time passes on the daemon; a view used past that reads whatever a later step writes there.
class PyPulledView {
 public:
  PyPulledView(std::shared_ptr<Client> client, PulledView view)
      : client_(std::move(client)), view_(std::move(view)) {}
  ~PyPulledView() { Release(); }
  PyPulledView(const PyPulledView&) = delete;
  PyPulledView& operator=(const PyPulledView&) = delete;

  const v1::PullHeader& header() const { return view_.header; }
  bool on_device() const { return view_.header.place_on_device(); }
  bool released() const { return client_ == nullptr; }

  // The bytes as a read-only buffer; empty once released and for a view in GPU memory, which has
  // no host bytes (the buffer protocol cannot raise: paramd._formats checks first).
  py::buffer_info Buffer() const {
    const bool host = !released() && !on_device();
    return py::buffer_info(host ? const_cast<std::byte*>(view_.data.data()) : nullptr, 1,
                           py::format_descriptor<uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(host ? view_.data.size() : 0)}, {1},
                           /*readonly=*/true);
  }

  // A view in GPU memory as a CUDA array of bytes (the CUDA Array Interface, which
  // torch.as_tensor(view, device="cuda") reads without a copy, keeping this object, and so the
  // lease, alive); AttributeError for a host view or once released, as the protocol expects.
  py::dict CudaArrayInterface() const {
    if (released() || !on_device()) {
      throw py::attribute_error(released() ? "this in-place view was released"
                                           : "this in-place view is in host memory");
    }
    return DeviceBytes(view_.data);
  }

  // The CUDA Array Interface of published bytes in GPU memory. Not marked read-only: torch refuses
  // such arrays; the bytes are the daemon's, never written. No stream: the pull already made the
  // client's cuda_stream wait for the daemon's step (work on another stream waits for that one).
  static py::dict DeviceBytes(std::span<const std::byte> bytes) {
    py::dict cai;
    cai["shape"] = py::make_tuple(static_cast<py::ssize_t>(bytes.size()));
    cai["typestr"] = "|u1";
    cai["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(bytes.data()), false);
    cai["strides"] = py::none();
    cai["stream"] = py::none();
    cai["version"] = 3;
    return cai;
  }

  // Ends the lease now (sent without waiting); later buffer requests raise.
  void Release() {
    if (client_ == nullptr) return;
    const std::shared_ptr<Client> client = std::move(client_);
    client_ = nullptr;
    // Nothing to raise into from a destructor; the lease then ends at its deadline.
    (void)client->Release(view_);
  }

 private:
  std::shared_ptr<Client> client_;
  PulledView view_;
};

// Every field paramd.served reads, in one tuple (it runs for a whole model each step): (format,
// rows, cols, data_bytes, scale_bytes, scale_type, scale_shape, version, skipped).
py::tuple HeaderFields(const v1::PullHeader& h) {
  return py::make_tuple(FormatName(h.format()), h.rows(), h.cols(), h.data_bytes(), h.scale_bytes(),
                        EnumName(v1::ScaleType_Name(h.scale_type()), "SCALE_TYPE_"),
                        std::vector<int64_t>(h.scale_shape().begin(), h.scale_shape().end()),
                        h.version(), h.skipped());
}

// The leases of one pull_in_place_batch, ended together: at release(), or once the batch and every
// block viewing it are gone.
class BatchLeases {
 public:
  BatchLeases(std::shared_ptr<Client> client, std::vector<PulledView> views)
      : client_(std::move(client)), views_(std::move(views)) {}
  ~BatchLeases() { Release(); }
  BatchLeases(const BatchLeases&) = delete;
  BatchLeases& operator=(const BatchLeases&) = delete;

  const std::vector<PulledView>& views() const { return views_; }
  bool released() const { return client_ == nullptr; }

  // Ends every lease now, in one message sent without waiting.
  void Release() {
    if (client_ == nullptr) return;
    const std::shared_ptr<Client> client = std::move(client_);
    client_ = nullptr;
    (void)client->Release(views_);  // no error to raise from a destructor; leases then expire
  }

 private:
  std::shared_ptr<Client> client_;
  std::vector<PulledView> views_;
};

// One contiguous range of a batch's bytes (the part of one of the daemon's regions that its views
// cover), lent to Python like a PulledView: a CUDA array of bytes in GPU memory, else a read-only
// buffer. It keeps the batch's leases alive.
class PyPulledBlock {
 public:
  PyPulledBlock(std::shared_ptr<BatchLeases> leases, std::span<const std::byte> bytes,
                bool on_device)
      : leases_(std::move(leases)), bytes_(bytes), on_device_(on_device) {}

  bool on_device() const { return on_device_; }
  size_t size() const { return bytes_.size(); }

  py::buffer_info Buffer() const {
    const bool host = !leases_->released() && !on_device_;
    return py::buffer_info(host ? const_cast<std::byte*>(bytes_.data()) : nullptr, 1,
                           py::format_descriptor<uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(host ? bytes_.size() : 0)}, {1},
                           /*readonly=*/true);
  }

  py::dict CudaArrayInterface() const {
    if (leases_->released() || !on_device_) {
      throw py::attribute_error(leases_->released() ? "this batch of in-place views was released"
                                                    : "this batch is in host memory");
    }
    return PyPulledView::DeviceBytes(bytes_);
  }

 private:
  const std::shared_ptr<BatchLeases> leases_;
  const std::span<const std::byte> bytes_;
  const bool on_device_;
};

// A pull of many tensors in place (Client::PullInPlaceMany) lent to Python as few objects: one
// block per region of the daemon's memory the views lie in, and per tensor (block, offset in it,
// header fields). A model's tensors then become torch tensors by slicing one or two block tensors
// instead of one array interface each. The leases end together (see BatchLeases).
class PyPulledBatch {
 public:
  PyPulledBatch(std::shared_ptr<Client> client, std::vector<PulledView> views)
      : leases_(std::make_shared<BatchLeases>(std::move(client), std::move(views))) {
    // Views of one region (segment) of one owner's memory are one allocation: the range from the
    // lowest to the end of the highest lies in it.
    struct Range {
      int owner;
      int64_t segment;
      const std::byte* begin;
      const std::byte* end;
    };
    std::vector<Range> ranges;
    std::vector<int> block_of;
    for (const PulledView& view : leases_->views()) {
      const int64_t segment = view.header.place().segment();
      auto it = std::find_if(ranges.begin(), ranges.end(), [&](const Range& r) {
        return r.owner == view.owner && r.segment == segment;
      });
      const std::byte* begin = view.data.data();
      const std::byte* end = begin + view.data.size();
      if (it == ranges.end()) {
        ranges.push_back({view.owner, segment, begin, end});
        it = ranges.end() - 1;
      } else {
        it->begin = std::min(it->begin, begin);
        it->end = std::max(it->end, end);
      }
      block_of.push_back(static_cast<int>(it - ranges.begin()));
    }
    on_device_ = !leases_->views().empty() && leases_->views().front().header.place_on_device();
    for (const Range& r : ranges) {
      blocks_.append(py::cast(std::make_unique<PyPulledBlock>(
          leases_, std::span<const std::byte>(r.begin, static_cast<size_t>(r.end - r.begin)),
          on_device_)));
    }
    for (size_t i = 0; i < block_of.size(); ++i) {
      const PulledView& view = leases_->views()[i];
      spans_.append(py::make_tuple(block_of[i], view.data.data() - ranges[block_of[i]].begin,
                                   HeaderFields(view.header)));
      row_begins_.append(view.row_begin);
    }
  }

  const py::list& blocks() const { return blocks_; }
  const py::list& spans() const { return spans_; }
  const py::list& row_begins() const { return row_begins_; }
  bool on_device() const { return on_device_; }
  bool released() const { return leases_->released(); }
  void Release() { leases_->Release(); }
  size_t size() const { return leases_->views().size(); }

 private:
  std::shared_ptr<BatchLeases> leases_;
  bool on_device_ = false;
  py::list blocks_;
  py::list spans_;
  py::list row_begins_;
};

// A pull's header fields as read-only properties of `cls`; `header(const T&)` finds the header.
template <typename T, typename Header>
void BindPullHeader(py::class_<T>& cls, Header header) {
  cls.def_property_readonly("version", [header](const T& p) { return header(p).version(); })
      .def_property_readonly("rows", [header](const T& p) { return header(p).rows(); })
      .def_property_readonly("cols", [header](const T& p) { return header(p).cols(); })
      .def_property_readonly("skipped", [header](const T& p) { return header(p).skipped(); })
      .def_property_readonly("data_bytes", [header](const T& p) { return header(p).data_bytes(); })
      .def_property_readonly("scale_bytes",
                             [header](const T& p) { return header(p).scale_bytes(); })
      .def_property_readonly("scale_type",
                             [header](const T& p) {
                               return EnumName(v1::ScaleType_Name(header(p).scale_type()),
                                               "SCALE_TYPE_");
                             })
      .def_property_readonly("scale_shape",
                             [header](const T& p) {
                               return std::vector<int64_t>(header(p).scale_shape().begin(),
                                                           header(p).scale_shape().end());
                             })
      .def_property_readonly("format",
                             [header](const T& p) { return FormatName(header(p).format()); })
      .def_property_readonly("fields", [header](const T& p) { return HeaderFields(header(p)); });
}

v1::StatePolicy ParsePolicy(const py::dict& policy) {
  v1::StatePolicy out;
  for (const auto& [key_handle, value_handle] : policy) {
    const std::string key = py::cast<std::string>(key_handle);
    const std::string value = py::cast<std::string>(value_handle);
    if (key == "master") {
      out.set_master(ParseEnum<v1::MasterType>("MASTER_TYPE_", value, v1::MasterType_Parse));
    } else if (key == "exp_avg") {
      out.set_exp_avg(ParseEnum<v1::MomentType>("MOMENT_TYPE_", value, v1::MomentType_Parse));
    } else if (key == "exp_avg_sq") {
      out.set_exp_avg_sq(ParseEnum<v1::MomentType>("MOMENT_TYPE_", value, v1::MomentType_Parse));
    } else if (key == "exp_avg_rounding") {
      out.set_exp_avg_rounding(ParseEnum<v1::Rounding>("ROUNDING_", value, v1::Rounding_Parse));
    } else if (key == "exp_avg_sq_rounding") {
      out.set_exp_avg_sq_rounding(ParseEnum<v1::Rounding>("ROUNDING_", value, v1::Rounding_Parse));
    } else {
      throw py::value_error("unknown state policy key \"" + key + "\"");
    }
  }
  return out;
}

py::dict PolicyDict(const v1::StatePolicy& policy) {
  py::dict out;
  out["master"] = EnumName(v1::MasterType_Name(policy.master()), "MASTER_TYPE_");
  out["exp_avg"] = EnumName(v1::MomentType_Name(policy.exp_avg()), "MOMENT_TYPE_");
  out["exp_avg_sq"] = EnumName(v1::MomentType_Name(policy.exp_avg_sq()), "MOMENT_TYPE_");
  out["exp_avg_rounding"] = EnumName(v1::Rounding_Name(policy.exp_avg_rounding()), "ROUNDING_");
  out["exp_avg_sq_rounding"] =
      EnumName(v1::Rounding_Name(policy.exp_avg_sq_rounding()), "ROUNDING_");
  return out;
}

py::dict HyperparamsDict(const v1::AdamwHyperparams& h) {
  py::dict out;
  out["lr"] = h.lr();
  out["betas"] = py::make_tuple(h.beta1(), h.beta2());
  out["eps"] = h.eps();
  out["weight_decay"] = h.weight_decay();
  return out;
}

v1::AdamwHyperparams ParseHyperparams(const py::dict& h) {
  v1::AdamwHyperparams out;
  out.set_lr(py::cast<double>(h["lr"]));
  const auto betas = py::cast<std::pair<double, double>>(h["betas"]);
  out.set_beta1(betas.first);
  out.set_beta2(betas.second);
  out.set_eps(py::cast<double>(h["eps"]));
  out.set_weight_decay(py::cast<double>(h["weight_decay"]));
  return out;
}

// Exported state as a dict of plain values; every field's bytes become a PulledBytes-like owner
// (moved, not copied) so torch views them in place.
py::dict StateDict(JobState state) {
  py::dict out;
  out["job"] = state.job;
  out["next_step"] = state.next_step;
  out["applied_steps"] = state.applied_steps;
  out["skipped_steps"] = state.skipped_steps;
  out["seed"] = state.seed;
  out["hyperparams"] = HyperparamsDict(state.hyperparams);
  out["state_policy"] = PolicyDict(state.state_policy);
  py::list fields;
  for (StateField& field : state.fields) {
    py::dict f;
    f["tensor"] = field.tensor;
    f["field"] = field.field;
    f["type"] = ElementTypeName(field.type);
    f["shape"] = field.shape;
    auto owner = std::make_unique<PulledBytes>();
    owner->bytes = std::move(field.bytes);
    f["bytes"] = py::cast(std::move(owner));
    fields.append(std::move(f));
  }
  out["fields"] = std::move(fields);
  return out;
}

JobState StateFromDict(const py::dict& dict) {
  JobState state;
  state.job = py::cast<std::string>(dict["job"]);
  state.next_step = py::cast<int64_t>(dict["next_step"]);
  state.applied_steps = py::cast<int64_t>(dict["applied_steps"]);
  state.skipped_steps = py::cast<int64_t>(dict["skipped_steps"]);
  state.seed = py::cast<uint64_t>(dict["seed"]);
  state.hyperparams = ParseHyperparams(py::cast<py::dict>(dict["hyperparams"]));
  state.state_policy = ParsePolicy(py::cast<py::dict>(dict["state_policy"]));
  for (const py::handle item : py::cast<py::list>(dict["fields"])) {
    const py::dict f = py::cast<py::dict>(item);
    StateField field;
    field.tensor = py::cast<std::string>(f["tensor"]);
    field.field = py::cast<std::string>(f["field"]);
    field.type = ParseElementType(py::cast<std::string>(f["type"]));
    field.shape = py::cast<std::vector<int64_t>>(f["shape"]);
    const HeldBytes held = Hold(py::cast<py::buffer>(f["bytes"]));
    field.bytes.assign(held.bytes.begin(), held.bytes.end());
    state.fields.push_back(std::move(field));
  }
  return state;
}

class PyClient;

// Every open client, so an atexit hook can close them while the interpreter still runs: a gRPC
// channel left to the C++ static destructors at exit races gRPC's own threads and can abort the
// process ("terminate called without an active exception").
std::mutex& OpenClientsMutex() {
  static std::mutex mutex;
  return mutex;
}
std::set<PyClient*>& OpenClients() {
  static auto* clients = new std::set<PyClient*>;
  return *clients;
}

// Client with Python-shaped arguments. One Client registers one rank of one job.
class PyClient {
 public:
  PyClient(const std::string& address, const std::string& transport, double rpc_timeout_s,
           double connect_timeout_s, int max_attempts, uintptr_t cuda_stream,
           double reconnect_timeout_s, bool lend_gradients, double daemons_wait_s,
           int daemons_count, const std::optional<std::string>& token_file,
           const std::string& token, int cuda_device) {
    ClientOptions options;
    if (token_file.has_value()) options.token_file = *token_file;  // else $PARAMD_TOKEN_FILE
    options.token = token;
    options.daemons_wait = Millis(daemons_wait_s);
    options.daemons_count = daemons_count;
    options.cuda_stream = cuda_stream;
    options.cuda_device = cuda_device;
    options.lend_gradients = lend_gradients;
    options.address = address;
    options.transport = transport;
    options.rpc_timeout = Millis(rpc_timeout_s);
    options.connect_timeout = Millis(connect_timeout_s);
    options.max_attempts = max_attempts;
    options.reconnect_timeout = Millis(reconnect_timeout_s);
    absl::StatusOr<std::unique_ptr<Client>> client;
    {
      py::gil_scoped_release release;
      client = Client::Connect(options);
    }
    client_ = std::shared_ptr<Client>(Value(std::move(client)));
    std::lock_guard<std::mutex> lock(OpenClientsMutex());
    OpenClients().insert(this);
  }

  ~PyClient() {
    Close();
    std::lock_guard<std::mutex> lock(OpenClientsMutex());
    OpenClients().erase(this);
  }

  // Closes the channel (idempotent); later calls raise.
  void Close() {
    std::shared_ptr<Client> client = std::move(client_);
    if (client != nullptr) {
      py::gil_scoped_release release;
      client.reset();
    }
  }

  static void CloseAll() {
    std::set<PyClient*> clients;
    {
      std::lock_guard<std::mutex> lock(OpenClientsMutex());
      clients = OpenClients();
    }
    for (PyClient* client : clients) client->Close();
  }

  py::dict Register(
      const std::string& job, int rank, int world_size,
      const std::vector<std::tuple<std::string, int64_t, int64_t, std::string>>& tensors,
      const py::dict& hyperparams, const py::dict& state_policy,
      const std::vector<std::string>& serve, uint64_t seed, double max_grad_norm,
      const std::vector<std::string>& daemons, const std::string& push_mode, bool early_step) {
    v1::RegisterRequest request;
    request.set_job(job);
    request.set_rank(rank);
    request.set_world_size(world_size);
    for (const auto& [name, rows, cols, grad_type] : tensors) {
      v1::TensorSpec* spec = request.add_tensors();
      spec->set_name(name);
      spec->set_rows(rows);
      spec->set_cols(cols);
      spec->set_grad_type(ParseElementType(grad_type));
    }
    *request.mutable_hyperparams() = ParseHyperparams(hyperparams);
    *request.mutable_state_policy() = ParsePolicy(state_policy);
    for (const std::string& format : serve) *request.add_serve() = ParseFormat(format);
    request.set_seed(seed);
    request.set_max_grad_norm(max_grad_norm);
    request.set_early_step(early_step);
    request.mutable_daemons()->Assign(daemons.begin(), daemons.end());
    if (push_mode == "pre_reduced") {
      request.set_push_mode(v1::PUSH_MODE_PRE_REDUCED);
    } else if (push_mode != "full") {
      throw py::value_error("push_mode is \"full\" or \"pre_reduced\", not \"" + push_mode + "\"");
    }
    absl::StatusOr<v1::RegisterResponse> response;
    const std::shared_ptr<Client> client = Open();
    {
      py::gil_scoped_release release;
      response = client->Register(request);
    }
    const v1::RegisterResponse r = Value(std::move(response));
    py::dict out;
    out["next_step"] = r.next_step();
    out["version"] = r.version();
    out["max_chunk_bytes"] = r.max_chunk_bytes();
    out["transport"] = client->transport_name();
    out["transport_reason"] = client->transport_reason();
    out["transport_traits"] = TransportTraitsList(*client);
    return out;
  }

  void UploadInitialWeights(const std::string& job,
                            const std::vector<std::pair<std::string, py::object>>& items) {
    const std::shared_ptr<Client> client = Open();
    PushBuffers(*client, items, [&](std::span<const PushItem> push_items) {
      return client->UploadInitialWeights(job, push_items);
    });
  }

  void PushGradients(const std::string& job, int rank, int64_t step,
                     const std::vector<std::pair<std::string, py::object>>& items,
                     uintptr_t ready_event) {
    const std::shared_ptr<Client> client = Open();
    PushBuffers(*client, items, [&](std::span<const PushItem> push_items) {
      return client->PushGradients(job, rank, step, push_items, ready_event);
    });
  }

  py::dict Commit(const std::string& job, int rank, int64_t step, std::optional<double> lr,
                  std::optional<double> grad_scale) {
    absl::StatusOr<v1::CommitResponse> response;
    const std::shared_ptr<Client> client = Open();
    {
      py::gil_scoped_release release;
      response = client->Commit(job, rank, step, lr, grad_scale);
    }
    const v1::CommitResponse r = Value(std::move(response));
    py::dict out;
    out["committed_ranks"] = r.committed_ranks();
    out["step_started"] = r.step_started();
    return out;
  }

  std::unique_ptr<PulledBytes> Pull(const std::string& job, const std::string& tensor,
                                    const std::string& format, int64_t min_version,
                                    double timeout_s) {
    PullTarget target{job, tensor, ParseFormat(format), min_version};
    Pulled pulled;
    absl::Status status;
    const std::shared_ptr<Client> client = Open();
    {
      py::gil_scoped_release release;
      status = client->Pull(target, Millis(timeout_s), &pulled);
    }
    Check(status);
    auto out = std::make_unique<PulledBytes>();
    out->header = std::move(pulled.header);
    out->bytes = std::move(pulled.data);
    return out;
  }

  // Waits like Pull and leases the served bytes where they lie (shm): no copy. `lease_s` 0 takes
  // the daemon's default lease. FAILED_PRECONDITION on a transport that cannot read in place.
  std::unique_ptr<PyPulledView> PullInPlace(const std::string& job, const std::string& tensor,
                                            const std::string& format, int64_t min_version,
                                            double timeout_s, double lease_s) {
    PullTarget target{job, tensor, ParseFormat(format), min_version};
    absl::StatusOr<PulledView> view;
    const std::shared_ptr<Client> client = Open();
    {
      py::gil_scoped_release release;
      view = client->PullInPlace(target, Millis(timeout_s), Millis(lease_s));
    }
    return std::make_unique<PyPulledView>(client, Value(std::move(view)));
  }

  // Several tensors in place in one call (Client::PullInPlaceMany), in the order named: one view,
  // with its own lease, per tensor.
  std::vector<std::unique_ptr<PyPulledView>> PullInPlaceMany(
      const std::string& job, const std::vector<std::string>& tensors, const std::string& format,
      int64_t min_version, double timeout_s, double lease_s) {
    PullManyTarget target{job, tensors, ParseFormat(format), min_version};
    absl::StatusOr<std::vector<PulledView>> views;
    const std::shared_ptr<Client> client = Open();
    {
      py::gil_scoped_release release;
      views = client->PullInPlaceMany(target, Millis(timeout_s), Millis(lease_s));
    }
    std::vector<std::unique_ptr<PyPulledView>> out;
    for (PulledView& view : Value(std::move(views))) {
      out.push_back(std::make_unique<PyPulledView>(client, std::move(view)));
    }
    return out;
  }

  // The same as one PulledBatch: its tensors view few blocks, and their leases end together.
  std::unique_ptr<PyPulledBatch> PullInPlaceBatch(const std::string& job,
                                                  const std::vector<std::string>& tensors,
                                                  const std::string& format, int64_t min_version,
                                                  double timeout_s, double lease_s) {
    PullManyTarget target{job, tensors, ParseFormat(format), min_version};
    absl::StatusOr<std::vector<PulledView>> views;
    const std::shared_ptr<Client> client = Open();
    {
      py::gil_scoped_release release;
      views = client->PullInPlaceMany(target, Millis(timeout_s), Millis(lease_s));
    }
    return std::make_unique<PyPulledBatch>(client, Value(std::move(views)));
  }

  // Several tensors in one call (Client::PullMany), in the order named.
  std::vector<std::unique_ptr<PulledBytes>> PullMany(const std::string& job,
                                                     const std::vector<std::string>& tensors,
                                                     const std::string& format, int64_t min_version,
                                                     double timeout_s) {
    PullManyTarget target{job, tensors, ParseFormat(format), min_version};
    std::vector<Pulled> pulled;
    absl::Status status;
    const std::shared_ptr<Client> client = Open();
    {
      py::gil_scoped_release release;
      status = client->PullMany(target, Millis(timeout_s), &pulled);
    }
    Check(status);
    std::vector<std::unique_ptr<PulledBytes>> out;
    for (Pulled& p : pulled) {
      auto bytes = std::make_unique<PulledBytes>();
      bytes->header = std::move(p.header);
      bytes->bytes = std::move(p.data);
      out.push_back(std::move(bytes));
    }
    return out;
  }

  // Where each tensor of the job lives (Client::GetLayout): one dict per piece, the job's tensors
  // in registration order, each tensor's pieces in row order.
  py::list Layout(const std::string& job) {
    absl::StatusOr<v1::GetLayoutResponse> response;
    const std::shared_ptr<Client> client = Open();
    {
      py::gil_scoped_release release;
      response = client->GetLayout(job);
    }
    const v1::GetLayoutResponse layout = Value(std::move(response));
    py::list out;
    for (const v1::GetLayoutResponse::Placement& p : layout.placements()) {
      py::dict d;
      d["tensor"] = p.tensor();
      d["daemon"] = p.daemon();
      d["device"] = p.device();
      d["row_begin"] = p.row_begin();
      d["row_end"] = p.row_end();
      out.append(std::move(d));
    }
    return out;
  }

  py::dict Status(const std::string& job, bool daemon_only) {
    absl::StatusOr<v1::StatusResponse> response;
    const std::shared_ptr<Client> client = Open();
    {
      py::gil_scoped_release release;
      response = client->Status(job, daemon_only);
    }
    const v1::StatusResponse r = Value(std::move(response));
    py::dict out;
    out["backend"] = r.backend();
    out["advertise_address"] = r.advertise_address();
    out["backend_addresses"] =
        std::vector<std::string>(r.backend_addresses().begin(), r.backend_addresses().end());
    py::list jobs;
    for (const v1::JobStatus& j : r.jobs()) {
      py::dict d;
      d["name"] = j.name();
      d["world_size"] = j.world_size();
      d["next_step"] = j.next_step();
      d["applied_steps"] = j.applied_steps();
      d["skipped_steps"] = j.skipped_steps();
      d["last_step_seconds"] = j.last_step_seconds();
      d["last_clip"] = j.last_clip();
      d["early_steps_adopted"] = j.early_steps_adopted();
      d["early_steps_discarded"] = j.early_steps_discarded();
      d["early_steps_late"] = j.early_steps_late();
      d["state_bytes"] = j.state_bytes();
      d["served_bytes"] = j.served_bytes();
      d["slot_bytes"] = j.slot_bytes();
      d["reserved_host_bytes"] = j.reserved_host_bytes();
      d["reserved_device_bytes"] = j.reserved_device_bytes();
      d["leases"] = j.leases();
      d["hyperparams"] = HyperparamsDict(j.hyperparams());
      d["state_policy"] = PolicyDict(j.state_policy());
      d["daemons"] = std::vector<std::string>(j.daemons().begin(), j.daemons().end());
      jobs.append(std::move(d));
    }
    out["jobs"] = std::move(jobs);
    return out;
  }

  py::dict SetHyperparams(const std::string& job, std::optional<double> lr,
                          std::optional<double> weight_decay) {
    v1::SetHyperparamsRequest request;
    request.set_job(job);
    if (lr) request.set_lr(*lr);
    if (weight_decay) request.set_weight_decay(*weight_decay);
    absl::StatusOr<v1::SetHyperparamsResponse> response;
    const std::shared_ptr<Client> client = Open();
    {
      py::gil_scoped_release release;
      response = client->SetHyperparams(request);
    }
    return HyperparamsDict(Value(std::move(response)).hyperparams());
  }

  py::dict ExportState(const std::string& job) {
    absl::StatusOr<JobState> state;
    const std::shared_ptr<Client> client = Open();
    {
      py::gil_scoped_release release;
      state = client->ExportState(job);
    }
    return StateDict(Value(std::move(state)));
  }

  void ImportState(const py::dict& state) {
    const JobState parsed = StateFromDict(state);
    absl::Status status;
    const std::shared_ptr<Client> client = Open();
    {
      py::gil_scoped_release release;
      status = client->ImportState(parsed);
    }
    Check(status);
  }

  // Control.Checkpoint: {path, version, bytes, seconds, removed}.
  py::dict Checkpoint(const std::string& job) {
    absl::StatusOr<v1::CheckpointResponse> response;
    const std::shared_ptr<Client> client = Open();
    {
      py::gil_scoped_release release;
      response = client->Checkpoint(job);
    }
    const v1::CheckpointResponse r = Value(std::move(response));
    py::dict out;
    out["path"] = r.path();
    out["version"] = r.version();
    out["bytes"] = r.bytes();
    out["seconds"] = r.seconds();
    out["removed"] = r.removed();
    return out;
  }

  // Control.Restore: {path, version, bytes, seconds, registered}.
  py::dict Restore(const std::string& job, const std::string& path) {
    absl::StatusOr<v1::RestoreResponse> response;
    const std::shared_ptr<Client> client = Open();
    {
      py::gil_scoped_release release;
      response = client->Restore(job, path);
    }
    const v1::RestoreResponse r = Value(std::move(response));
    py::dict out;
    out["path"] = r.path();
    out["version"] = r.version();
    out["bytes"] = r.bytes();
    out["seconds"] = r.seconds();
    out["registered"] = r.registered();
    return out;
  }

  // Whether the daemon restarted since the last register() (Client::DaemonRestarted).
  bool DaemonRestarted() {
    absl::StatusOr<bool> restarted;
    const std::shared_ptr<Client> client = Open();
    {
      py::gil_scoped_release release;
      restarted = client->DaemonRestarted();
    }
    return Value(std::move(restarted));
  }

  std::string transport() const { return client_ ? client_->transport_name() : ""; }
  py::list transport_traits() const { return client_ ? TransportTraitsList(*client_) : py::list(); }

  // The client, or a Python error once closed. Called with the GIL held; the reference keeps
  // the client alive through a call that a Close on another thread overlaps.
  std::shared_ptr<Client> Open() const {
    if (client_ == nullptr) throw py::value_error("this paramd client is closed");
    return client_;
  }

 private:
  static std::chrono::milliseconds Millis(double seconds) {
    return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
  }

  std::shared_ptr<Client> client_;
};

}  // namespace
}  // namespace paramd

PYBIND11_MODULE(_paramd, m) {
  using paramd::PulledBytes;
  using paramd::PyClient;
  using paramd::PyPulledView;
  m.doc() = "Bindings of the paramd C++ client (client/client.h)";
  // The project's one version (common/version.h): paramd.__version__ and the wheel's own.
  m.attr("__version__") = std::string(paramd::Version());

  static py::exception<paramd::StatusError> status_error(m, "StatusError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const paramd::StatusError& e) {
      // The code name ("NOT_FOUND", ...) rides along as an attribute for callers to branch on.
      py::object error = py::reinterpret_borrow<py::object>(status_error.ptr())(e.what());
      error.attr("code") = e.code();
      PyErr_SetObject(status_error.ptr(), error.ptr());
    }
  });

  m.def(
      "page_locked_bytes", [] { return paramd::GpuCopies::PageLockedBytes(); },
      "Bytes of this process's memory page-locked for the GPU by shm transports now (their "
      "clients' cuda_device): the daemon's segments they map; 0 once the clients are gone.");

  // paramd.daemon waits for the daemon it started by the rule `paramctl wait` uses.
  m.def(
      "wait_until_serving",
      [](const std::string& address_file, int pid, double timeout_s) {
        absl::StatusOr<std::string> address;
        {
          py::gil_scoped_release unlocked;
          address = paramd::WaitUntilServing(address_file, pid, timeout_s);
        }
        paramd::Check(address.status());
        return *std::move(address);
      },
      py::arg("address_file"), py::arg("pid") = 0, py::arg("timeout_s") = 60.0,
      "Waits until the daemon started with --address_file=ADDRESS_FILE serves and returns its "
      "address (client/wait_until_serving.h): StatusError FAILED_PRECONDITION where process "
      "`pid` (> 0) ends first, DEADLINE_EXCEEDED after timeout_s");

  py::class_<PulledBytes> pulled_bytes(m, "PulledBytes", py::buffer_protocol(),
                                       "Bytes of one pull (data, then scales) or one state field");
  pulled_bytes
      .def_buffer([](PulledBytes& p) {
        return py::buffer_info(p.bytes.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(p.bytes.size())}, {1});
      })
      .def("__len__", [](const PulledBytes& p) { return p.bytes.size(); });
  paramd::BindPullHeader(
      pulled_bytes, [](const PulledBytes& p) -> const auto& { return p.header; });

  py::class_<PyPulledView> pulled_view(
      m, "PulledView", py::buffer_protocol(),
      "The served bytes of one pull where they lie (data, then scales), under a lease this object "
      "holds until release() or until it goes");
  pulled_view.def_buffer(&PyPulledView::Buffer)
      .def("release", &PyPulledView::Release, "Ends the lease; the bytes may change after it")
      .def_property_readonly("released", &PyPulledView::released)
      .def_property_readonly("on_device", &PyPulledView::on_device)
      .def_property_readonly("__cuda_array_interface__", &PyPulledView::CudaArrayInterface)
      .def("__len__", [](const PyPulledView& p) {
        return p.header().data_bytes() + p.header().scale_bytes();
      });
  paramd::BindPullHeader(
      pulled_view, [](const PyPulledView& p) -> const auto& { return p.header(); });

  py::class_<paramd::PyPulledBlock>(
      m, "PulledBlock", py::buffer_protocol(),
      "A contiguous range of a PulledBatch's bytes (one region of the daemon's memory)")
      .def_buffer(&paramd::PyPulledBlock::Buffer)
      .def_property_readonly("on_device", &paramd::PyPulledBlock::on_device)
      .def_property_readonly("__cuda_array_interface__", &paramd::PyPulledBlock::CudaArrayInterface)
      .def("__len__", &paramd::PyPulledBlock::size);
  py::class_<paramd::PyPulledBatch>(
      m, "PulledBatch",
      "Many tensors pulled in place: blocks (one per region of the daemon's memory) and per "
      "tensor (block, offset, fields); the leases end together, at release() or once the batch "
      "and every block are gone")
      .def_property_readonly("blocks", &paramd::PyPulledBatch::blocks)
      .def_property_readonly("spans", &paramd::PyPulledBatch::spans)
      .def_property_readonly("row_begins", &paramd::PyPulledBatch::row_begins,
                             "Per span, its first row in the whole tensor: a tensor of a job "
                             "sharded over several daemons may be split, its pieces consecutive "
                             "spans in row order (row_begin > 0 after the first)")
      .def_property_readonly("on_device", &paramd::PyPulledBatch::on_device)
      .def_property_readonly("released", &paramd::PyPulledBatch::released)
      .def("release", &paramd::PyPulledBatch::Release,
           "Ends every lease; the bytes may change after it")
      .def("__len__", &paramd::PyPulledBatch::size);

  py::class_<PyClient>(m, "Client", "One trainer rank's connection to a paramd daemon")
      .def(
          py::init<const std::string&, const std::string&, double, double, int, uintptr_t, double,
                   bool, double, int, const std::optional<std::string>&, const std::string&, int>(),
          py::arg("address"), py::arg("transport") = "auto", py::arg("rpc_timeout_s") = 30.0,
          py::arg("connect_timeout_s") = 10.0, py::arg("max_attempts") = 5,
          py::arg("cuda_stream") = 0, py::arg("reconnect_timeout_s") = 0.0,
          py::arg("lend_gradients") = false, py::arg("daemons_wait_s") = 120.0,
          py::arg("daemons_count") = 0, py::arg("token_file") = py::none(), py::arg("token") = "",
          py::arg("cuda_device") = -1,
          "cuda_stream: the cudaStream_t (an int, torch.cuda.Stream.cuda_stream) that gradients "
          "in GPU memory are written on; cuda_ipc's copies of a push wait for it (0: the legacy "
          "default stream, PyTorch's default). lend_gradients: cuda_ipc lends gradients on the "
          "daemon's GPU instead of copying them (ClientOptions::lend_gradients: keep them "
          "unchanged until the step's version is pulled). daemons_wait_s: how long a register "
          "with a list of daemons waits for each to answer (ClientOptions::daemons_wait). "
          "daemons_count: how many daemons a list with a 'dns:NAME:PORT' entry must resolve to "
          "(ClientOptions::daemons_count; 0: the first answer). token_file: the file holding "
          "the bearer token every call carries, for a daemon with a token file (None: "
          "$PARAMD_TOKEN_FILE; \"\": none); token: the token itself, where no file holds it. "
          "cuda_device: the trainer's GPU, for shm: the daemon's segments are page-locked for it "
          "and gradients in its memory pushed by DMA (ClientOptions::cuda_device; -1: none)")
      .def("register", &PyClient::Register, py::arg("job"), py::arg("rank"), py::arg("world_size"),
           py::arg("tensors"), py::arg("hyperparams"), py::arg("state_policy") = py::dict(),
           py::arg("serve") = std::vector<std::string>(), py::arg("seed") = 0,
           py::arg("max_grad_norm") = 0.0, py::arg("daemons") = std::vector<std::string>(),
           py::arg("push_mode") = "full", py::arg("early_step") = false,
           "tensors: [(name, rows, cols, grad_type 'fp32'|'bf16')]. daemons: the job's daemons as "
           "they advertise themselves, in any order (sent sorted); [] = a one-daemon job. This "
           "client still talks to its own daemon alone. push_mode: 'full' (every rank pushes its "
           "gradients) or 'pre_reduced' (the ranks reduce among themselves and one rank pushes "
           "each daemon's part, PUSH_MODE_PRE_REDUCED). early_step: step each tensor as its "
           "gradients land (RegisterRequest.early_step; needs max_grad_norm 0)")
      .def("upload_initial_weights", &PyClient::UploadInitialWeights, py::arg("job"),
           py::arg("items"))
      .def("push_gradients", &PyClient::PushGradients, py::arg("job"), py::arg("rank"),
           py::arg("step"), py::arg("items"), py::arg("ready_event") = 0,
           "ready_event: for CUDA gradients, a cudaEvent_t (torch.cuda.Event.cuda_event) "
           "recorded after backward wrote them; their copies wait for it alone")
      .def("commit", &PyClient::Commit, py::arg("job"), py::arg("rank"), py::arg("step"),
           py::arg("lr") = std::nullopt, py::arg("grad_scale") = std::nullopt)
      .def("pull", &PyClient::Pull, py::arg("job"), py::arg("tensor"), py::arg("format") = "fp32",
           py::arg("min_version") = 0, py::arg("timeout_s") = 60.0)
      .def("pull_in_place", &PyClient::PullInPlace, py::arg("job"), py::arg("tensor"),
           py::arg("format") = "fp32", py::arg("min_version") = 0, py::arg("timeout_s") = 60.0,
           py::arg("lease_s") = 0.0,
           "Leases the served bytes where they lie (shm, cuda_ipc): a PulledView, no copy")
      .def("pull_in_place_many", &PyClient::PullInPlaceMany, py::arg("job"), py::arg("tensors"),
           py::arg("format") = "fp32", py::arg("min_version") = 0, py::arg("timeout_s") = 60.0,
           py::arg("lease_s") = 0.0,
           "pull_in_place of several tensors in one call, in the order named: [PulledView]")
      .def("pull_in_place_batch", &PyClient::PullInPlaceBatch, py::arg("job"), py::arg("tensors"),
           py::arg("format") = "fp32", py::arg("min_version") = 0, py::arg("timeout_s") = 60.0,
           py::arg("lease_s") = 0.0,
           "pull_in_place_many as one PulledBatch (few objects for a whole model)")
      .def("pull_many", &PyClient::PullMany, py::arg("job"), py::arg("tensors"),
           py::arg("format") = "fp32", py::arg("min_version") = 0, py::arg("timeout_s") = 60.0,
           "Several tensors in one call, in the order named (one request over shm and cuda_ipc)")
      .def("status", &PyClient::Status, py::arg("job") = "", py::arg("daemon_only") = false,
           "The daemon's status, and its jobs' (one where `job` is set; every job's takes an "
           "admin token where the daemon has tokens). daemon_only: the daemon's own figures "
           "alone, which any token reads")
      .def("layout", &PyClient::Layout, py::arg("job"),
           "Where each tensor of the job lives: a dict per piece (tensor, daemon, device, "
           "row_begin, row_end), in registration and row order (GetLayout).")
      .def("set_hyperparams", &PyClient::SetHyperparams, py::arg("job"),
           py::arg("lr") = std::nullopt, py::arg("weight_decay") = std::nullopt)
      .def("export_state", &PyClient::ExportState, py::arg("job"))
      .def("import_state", &PyClient::ImportState, py::arg("state"))
      .def("daemon_restarted", &PyClient::DaemonRestarted,
           "Whether the daemon restarted since the last register(): pushes, commits and pulls "
           "are then ABORTED until register() is called again")
      .def("checkpoint", &PyClient::Checkpoint, py::arg("job"),
           "Writes a checkpoint of the job under the daemon's checkpoint_dir")
      .def("restore", &PyClient::Restore, py::arg("job"), py::arg("path") = "",
           "Restores the job from checkpoint `path` (default: its newest)")
      .def_property_readonly("transport", &PyClient::transport,
                             "The transport chosen at register(), for display (\"addr=name,...\" "
                             "for a sharded job); decide from transport_traits()")
      .def("transport_traits", &PyClient::transport_traits,
           "One dict per owner daemon (one for a job on one daemon; [] before register()): "
           "daemon, name, reads_device_memory, views_in_place, memory (\"host\", \"device\" or "
           "None)")
      .def("close", &PyClient::Close, "Closes the channel; later calls raise ValueError");

  // Closes every client before the interpreter (and then the C++ runtime) shuts down.
  py::module_::import("atexit").attr("register")(py::cpp_function(&PyClient::CloseAll));
}
