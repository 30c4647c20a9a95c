// Compiled-graph capture and replay for torch.compile (see capture.h and torchtpu/compiler.py).
#include "device/capture.h"

#include <ATen/FunctionalStorageImpl.h>
#include <ATen/FunctionalTensorWrapper.h>

#include <algorithm>
#include <sstream>
#include <unordered_map>

#include "device/generator.h"
#include "device/tensor.h"
#include "engine/engine.h"

namespace torchtpu {

struct Capture {
  int device = 0;
  ExecutablePtr executable;  // null when every output is an input or a constant
  uint64_t graph_hash = 0;   // names the executable in profiler traces
  // Per FX input: its type when it is a tpu tensor (checked on every replay).
  std::vector<std::optional<TensorType>> input_types;
  // Pairs of FX inputs that held the same value when captured (a parameter reads the first).
  std::vector<std::pair<int, int>> alias_pairs;
  struct Param {
    int input = -1;      // the FX input whose buffer this parameter is, or -1:
    bool base = false;   // ... or the base of that input's functional storage (see below)
    ValuePtr constant;   // a value made inside the graph from no input (an uploaded constant)
  };
  // An FX input that is a functional view of another tensor (a saved transpose of a weight,
  // say) is read inside the graph through its storage's base: views of it are replayed on
  // the base. Per FX input: the base's type when a parameter is such a base.
  std::vector<std::optional<TensorType>> base_types;
  std::vector<Param> params;
  std::vector<double> float_scalars;
  std::vector<int64_t> int_scalars;
  BufferPtr float_pack, int_pack;  // uploaded once; the int pack again per call for random ops
  std::vector<int> random_seed_slots;
  std::vector<CheckQueue::Entry> checks;  // the executable's runtime checks
  std::vector<TensorType> result_types;
  struct Output {
    enum class Kind { None, Root, Input, Constant } kind = Kind::None;
    int index = -1;  // root or input index
    ValuePtr constant;
  };
  std::vector<Output> outputs;
  std::vector<ValuePtr> first_results;  // the capturing call's roots, until taken
  // In-place updates of inputs (a static KV cache's index_copy_): (FX input, root). The
  // executable reuses the input's buffer for the root (donation), and the input tensor then
  // holds the root, so an update costs no copy of what it updates.
  std::vector<std::pair<int, int>> donated;
  std::vector<bool> donation_vouched;  // per donated pair: the caller vouched for it (capture_end)
  // A partitioned executable: its mesh and the layout each parameter must arrive in (a replay
  // with inputs laid out otherwise misses and is captured again).
  MeshPtr mesh;
  std::vector<std::string> param_shardings;
};

namespace {

struct BeginState {
  bool active = false;
  uint64_t serial = 0;  // values with a larger serial were made inside the capture
  int64_t execute_count = 0;
  int64_t fallbacks = 0;
};
thread_local BeginState g_begin;

std::atomic<int64_t> g_captures{0}, g_uncapturable{0}, g_replays{0}, g_misses{0};

int64_t fallback_total(Engine& e) {
  int64_t n = 0;
  for (const auto& [op, count] : e.metrics().fallback_ops) n += count;
  return n;
}

int device_of(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs) {
  for (const auto* list : {&inputs, &outputs})
    for (const at::Tensor& t : *list)
      if (is_tpu(t)) return t.device().index();
  return current_device();
}

// The value of the base of a functional tensor's storage (what views of it are computed
// from), or null when t is not a functional tpu tensor.
ValuePtr storage_base_value(const at::Tensor& t, int device) {
  if (!at::functionalization::impl::isFunctionalTensor(t)) return nullptr;
  auto* storage = dynamic_cast<at::functionalization::FunctionalStorageImpl*>(
      t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl());
  if (!storage) return nullptr;
  const at::Tensor& base = storage->base();
  if (!is_tpu(base) || base.device().index() != device) return nullptr;
  return value_of(base, device);
}

// Whether an input's value may give its buffer to the graph: computed, held by the input
// tensor alone (`local` more references are the caller's), and not shared with JAX.
bool held_by_its_tensor_alone(const ValuePtr& v, long local) {
  return v && !v->pending() && v->buffer && v.use_count() - v->node_uses.load() == 1 + local &&
         v->buffer.use_count() == 1 && !v->buffer->shared_outside.load();
}

}  // namespace

void capture_begin(const std::vector<at::Tensor>& inputs) {
  EngineLock lock;
  Engine& e = Engine::get();
  // All pending work runs first (the inputs' and anything else): the pending graph then
  // holds exactly what the FX graph records.
  for (const at::Tensor& t : inputs)
    if (is_tpu(t)) value_of(t, t.device().index());  // functional views sync here
  e.sync(false, FlushReason::TorchCompile);
  g_begin.active = true;
  g_begin.serial = next_value_serial();
  g_begin.execute_count = e.metrics().execute_count.load();
  g_begin.fallbacks = fallback_total(e);
}

void capture_abort() { g_begin.active = false; }

CapturePtr capture_end(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                       const std::vector<std::pair<int, int>>& updates, const std::vector<int>& vouched) {
  EngineLock lock;
  Engine& e = Engine::get();
  // One pending graph: nothing ran (no flush) and nothing fell back to CPU since the start.
  uint64_t begin_serial = g_begin.serial;
  bool ok = g_begin.active && e.mode() == Mode::Fused && e.metrics().execute_count.load() == g_begin.execute_count &&
            fallback_total(e) == g_begin.fallbacks;
  g_begin.active = false;
  int device = device_of(inputs, outputs);
  auto capture = std::make_shared<Capture>();
  capture->device = device;
  std::unordered_map<const Value*, int> input_of;
  capture->input_types.resize(inputs.size());
  for (size_t i = 0; ok && i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (!t.defined()) continue;
    if (!is_tpu(t) || t.device().index() != device) { ok = false; break; }
    ValuePtr v = value_of(t, device);
    capture->input_types[i] = v->type;
    auto [it, inserted] = input_of.emplace(v.get(), static_cast<int>(i));
    if (!inserted) capture->alias_pairs.emplace_back(it->second, static_cast<int>(i));
  }
  std::vector<ValuePtr> roots;
  std::unordered_map<const Value*, int> root_of;
  for (size_t k = 0; ok && k < outputs.size(); ++k) {
    Capture::Output out;
    const at::Tensor& t = outputs[k];
    if (t.defined()) {
      if (!is_tpu(t) || t.device().index() != device) { ok = false; break; }
      ValuePtr v = value_of(t, device);
      if (v->pending()) {
        auto [it, inserted] = root_of.emplace(v.get(), static_cast<int>(roots.size()));
        if (inserted) roots.push_back(v);
        out.kind = Capture::Output::Kind::Root;
        out.index = it->second;
      } else if (input_of.count(v.get())) {
        out.kind = Capture::Output::Kind::Input;
        out.index = input_of.at(v.get());
      } else {
        out.kind = Capture::Output::Kind::Constant;
        out.constant = v;
      }
    }
    capture->outputs.push_back(std::move(out));
  }
  // One executable computes values of one mesh (or of one device).
  for (const ValuePtr& r : roots) {
    const MeshPtr& first = roots.front()->mesh;
    if (first ? !r->mesh || !r->mesh->same_devices(*first) : r->mesh != nullptr) ok = false;
  }
  if (!ok) {
    g_uncapturable++;
    e.sync(false, FlushReason::TorchCompile);  // interpreter semantics: the graph's work runs now
    return nullptr;
  }
  std::vector<std::pair<const Value*, int>> donations;
  for (auto [i, k] : updates) {
    if (i < 0 || k < 0 || static_cast<size_t>(i) >= inputs.size() || static_cast<size_t>(k) >= outputs.size()) continue;
    const Capture::Output& out = capture->outputs[k];
    if (out.kind != Capture::Output::Kind::Root || !capture->input_types[i]) continue;
    bool aliased = std::any_of(capture->alias_pairs.begin(), capture->alias_pairs.end(),
                               [&](auto pair) { return pair.first == i || pair.second == i; });
    ValuePtr v = value_of(inputs[i], device);
    if (aliased || !held_by_its_tensor_alone(v, 1) || !(v->type == roots[out.index]->type)) continue;
    donations.push_back({v.get(), out.index});
    capture->donated.push_back({i, out.index});
    capture->donation_vouched.push_back(false);
  }
  std::vector<bool> root_taken(roots.size(), false);
  for (auto [i, r] : capture->donated) root_taken[r] = true;
  for (int i : vouched) {
    if (i < 0 || static_cast<size_t>(i) >= inputs.size() || !capture->input_types[i]) continue;
    bool aliased = std::any_of(capture->alias_pairs.begin(), capture->alias_pairs.end(),
                               [&](auto pair) { return pair.first == i || pair.second == i; });
    ValuePtr v = value_of(inputs[i], device);
    bool returned = std::any_of(capture->outputs.begin(), capture->outputs.end(), [&](const Capture::Output& o) {
      return o.kind == Capture::Output::Kind::Input && o.index == i;
    });
    if (aliased || returned || v->pending() || !v->buffer || v->type.numel() == 0) continue;
    for (size_t r = 0; r < roots.size(); ++r) {
      if (root_taken[r] || !(roots[r]->type == v->type)) continue;
      root_taken[r] = true;
      donations.push_back({v.get(), static_cast<int>(r)});
      capture->donated.push_back({i, static_cast<int>(r)});
      capture->donation_vouched.push_back(true);
      break;
    }
  }
  Engine::CaptureRun run = e.run_for_capture(roots, device, donations);
  // A donated input's parameter must really be that input (not, say, a view's base).
  for (size_t k = 0; k < capture->donated.size();) {
    auto [i, r] = capture->donated[k];
    const Value* v = value_of(inputs[i], device).get();
    bool found = false;
    for (size_t p = 0; p < run.params.size(); ++p) found = found || (run.params[p].get() == v && run.aliasing[p] == r);
    if (found) {
      ++k;
    } else {
      capture->donated.erase(capture->donated.begin() + k);
      capture->donation_vouched.erase(capture->donation_vouched.begin() + k);
    }
  }
  capture->mesh = run.mesh;
  capture->param_shardings = run.param_shardings;
  capture->executable = run.executable;
  capture->graph_hash = run.graph_hash;
  std::unordered_map<const Value*, int> base_of;  // storage bases of the FX inputs
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!capture->input_types[i]) continue;
    ValuePtr b = storage_base_value(inputs[i], device);
    if (b) base_of.emplace(b.get(), static_cast<int>(i));
  }
  capture->base_types.resize(inputs.size());
  bool reads_outside_state = false;
  for (const ValuePtr& p : run.params) {
    Capture::Param param;
    auto it = input_of.find(p.get());
    auto base = base_of.find(p.get());
    if (it != input_of.end()) {
      param.input = it->second;
    } else if (base != base_of.end()) {
      param.input = base->second;
      param.base = true;
      capture->base_types[base->second] = p->type;
    } else if (p->serial >= begin_serial) {
      param.constant = p;  // made inside the graph: the same on every call
    } else {
      // Older state that is neither an FX input nor what one is a view of: a replay would
      // read it as it is now, forever. Such graphs keep running through the interpreter.
      reads_outside_state = true;
    }
    capture->params.push_back(std::move(param));
  }
  if (reads_outside_state) {
    g_uncapturable++;
    return nullptr;  // the outputs were computed by run_for_capture
  }
  capture->float_scalars = std::move(run.float_scalars);
  capture->int_scalars = std::move(run.int_scalars);
  capture->random_seed_slots = std::move(run.random_seed_slots);
  capture->checks = std::move(run.checks);
  if (!capture->float_scalars.empty())
    capture->float_pack = e.upload_float_scalars(capture->float_scalars, device, capture->mesh);
  if (!capture->int_scalars.empty()) capture->int_pack = e.upload_int_scalars(capture->int_scalars, device, capture->mesh);
  capture->result_types = std::move(run.result_types);  // roots first, then values only kept live
  capture->first_results = roots;
  for (auto [i, r] : capture->donated) store_value(inputs[i], roots[r]);  // its old buffer is gone
  g_captures++;
  return capture;
}

std::vector<at::Tensor> assemble_outputs(const Capture& c, const std::vector<at::Tensor>& root_tensors,
                                         const std::vector<at::Tensor>& inputs);

std::optional<std::vector<at::Tensor>> run_captured(Capture& c, const std::vector<at::Tensor>& inputs) {
  EngineLock lock;
  Engine& e = Engine::get();
  if (inputs.size() != c.input_types.size()) { g_misses++; return std::nullopt; }
  std::vector<ValuePtr> values(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (!c.input_types[i]) {
      if (t.defined()) { g_misses++; return std::nullopt; }
      continue;
    }
    if (!is_tpu(t) || t.device().index() != c.device) { g_misses++; return std::nullopt; }
    values[i] = value_of(t, c.device);
    if (!(values[i]->type == *c.input_types[i])) { g_misses++; return std::nullopt; }
  }
  for (auto [a, b] : c.alias_pairs)
    if (values[a] != values[b]) { g_misses++; return std::nullopt; }
  std::vector<ValuePtr> bases(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!c.base_types[i]) continue;
    bases[i] = storage_base_value(inputs[i], c.device);
    if (!bases[i] || !(bases[i]->type == *c.base_types[i])) { g_misses++; return std::nullopt; }
  }

  for (size_t k = 0; k < c.donated.size(); ++k) {
    int i = c.donated[k].first;
    e.materialize(values[i]);
    // values[] and the input tensor hold it; anything else (a clone) would lose its contents.
    if (!c.donation_vouched[k] && !held_by_its_tensor_alone(values[i], 1)) { g_misses++; return std::nullopt; }
  }
  std::vector<BufferPtr> results;
  if (c.executable) {
    std::vector<BufferPtr> args;
    args.reserve(c.params.size() + 2);
    for (size_t k = 0; k < c.params.size(); ++k) {
      const Capture::Param& p = c.params[k];
      BufferPtr buffer = e.materialize(p.input < 0 ? p.constant : p.base ? bases[p.input] : values[p.input]);
      if (c.mesh) {
        if (buffer->sharding && !buffer->sharding->mesh->same_devices(*c.mesh)) { g_misses++; return std::nullopt; }
        std::string layout = buffer->sharding ? buffer->sharding->hlo() : "{replicated}";
        if (layout != c.param_shardings[k]) { g_misses++; return std::nullopt; }
        buffer = e.argument_for_mesh(buffer, c.mesh);
      } else if (buffer->sharding) {
        g_misses++;
        return std::nullopt;
      }
      args.push_back(std::move(buffer));
    }
    if (c.float_pack) args.push_back(c.float_pack);
    if (c.int_pack) {
      if (c.random_seed_slots.empty()) {
        args.push_back(c.int_pack);
      } else {
        // Each random op draws a fresh (seed, offset) from the device's generator, as in eager.
        auto* gen = dynamic_cast<TpuGeneratorImpl*>(default_generator(c.device).unsafeGetGeneratorImpl());
        std::vector<int64_t> ints = c.int_scalars;
        for (int slot : c.random_seed_slots) {
          ints[slot] = gen->next_key();
          ints[slot + 1] = 0;
        }
        args.push_back(e.upload_int_scalars(ints, c.device, c.mesh));
      }
    }
    results = e.launch(*c.executable, args, c.result_types, c.device, c.graph_hash, c.checks);
  }
  g_replays++;
  std::vector<at::Tensor> root_tensors;
  root_tensors.reserve(results.size());
  for (BufferPtr& b : results) root_tensors.push_back(make_tensor(e.from_buffer(std::move(b))));
  for (auto [i, r] : c.donated) {
    values[i]->buffer.reset();  // the executable consumed it
    e.metrics().donated_buffers++;
    store_value(inputs[i], value_of(root_tensors[r], c.device));
  }
  return assemble_outputs(c, root_tensors, inputs);
}

std::vector<at::Tensor> take_first_outputs(Capture& c, const std::vector<at::Tensor>& inputs) {
  EngineLock lock;
  std::vector<at::Tensor> root_tensors;
  for (const ValuePtr& v : c.first_results) root_tensors.push_back(make_tensor(v));
  c.first_results.clear();
  return assemble_outputs(c, root_tensors, inputs);
}

std::vector<at::Tensor> assemble_outputs(const Capture& c, const std::vector<at::Tensor>& root_tensors,
                                         const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> out;
  out.reserve(c.outputs.size());
  for (const Capture::Output& o : c.outputs) {
    switch (o.kind) {
      case Capture::Output::Kind::None: out.emplace_back(); break;
      case Capture::Output::Kind::Root: out.push_back(wrap_for_user(root_tensors[o.index])); break;
      case Capture::Output::Kind::Input: out.push_back(inputs[o.index]); break;
      case Capture::Output::Kind::Constant: out.push_back(wrap_for_user(make_tensor(o.constant))); break;
    }
  }
  return out;
}

CaptureStats capture_stats() {
  return CaptureStats{g_captures.load(), g_uncapturable.load(), g_replays.load(), g_misses.load()};
}

std::string describe_capture(const Capture& c) {
  std::ostringstream s;
  s << "capture on tpu:" << c.device << ", " << c.params.size() << " parameters (";
  for (size_t p = 0; p < c.params.size(); ++p)
    s << (p ? " " : "")
      << (c.params[p].input < 0 ? std::string("const")
                                : (c.params[p].base ? "base" : "in") + std::to_string(c.params[p].input));
  s << "), " << c.float_scalars.size() << " float and " << c.int_scalars.size() << " int scalars, "
    << c.random_seed_slots.size() << " random ops, outputs (";
  for (size_t k = 0; k < c.outputs.size(); ++k) {
    const auto& o = c.outputs[k];
    s << (k ? " " : "");
    switch (o.kind) {
      case Capture::Output::Kind::None: s << "-"; break;
      case Capture::Output::Kind::Root: s << "r" << o.index; break;
      case Capture::Output::Kind::Input: s << "in" << o.index; break;
      case Capture::Output::Kind::Constant: s << "const"; break;
    }
  }
  s << ")";
  return s.str();
}

}  // namespace torchtpu
