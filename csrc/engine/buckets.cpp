// Shape buckets for fused graphs (see buckets.h): size plans, structures, the padded run,
// and slicing values computed padded when something reads them at their real sizes.
#include "engine/buckets.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <unordered_set>

#include "engine/graph_plan.h"

namespace torchtpu {

// ---- size expressions and plans ---------------------------------------------------------

int64_t SizeExpr::eval(const std::vector<int64_t>& symbols) const {
  if (!symbolic()) return offset;
  int64_t v = coeff;
  if (a >= 0) v *= symbols[a];
  if (b >= 0) v *= symbols[b];
  return v + offset;
}

namespace {

using Pair = std::pair<int64_t, int64_t>;  // a size in the first and in the second graph

// The simplest expression of the symbols (their values in both graphs) that gives `size`
// in both graphs, trying k*s, k*s*t, s+d and k*s+d in that order.
std::optional<SizeExpr> explain(const Pair& size, const std::vector<Pair>& symbols) {
  auto [a, b] = size;
  const int n = static_cast<int>(symbols.size());
  for (int i = 0; i < n; ++i) {
    auto [x, y] = symbols[i];
    if (x != 0 && y != 0 && a % x == 0 && b % y == 0 && a / x == b / y && a / x != 0) return SizeExpr{a / x, i, -1, 0};
  }
  for (int i = 0; i < n; ++i) {
    for (int j = i; j < n; ++j) {
      int64_t x = symbols[i].first * symbols[j].first, y = symbols[i].second * symbols[j].second;
      if (x != 0 && y != 0 && a % x == 0 && b % y == 0 && a / x == b / y && a / x != 0) return SizeExpr{a / x, i, j, 0};
    }
  }
  for (int i = 0; i < n; ++i) {
    auto [x, y] = symbols[i];
    if (a - x == b - y) return SizeExpr{1, i, -1, a - x};
  }
  for (int i = 0; i < n; ++i) {
    auto [x, y] = symbols[i];
    if (y != x && (b - a) % (y - x) == 0 && (b - a) / (y - x) != 0) {
      int64_t k = (b - a) / (y - x);
      return SizeExpr{k, i, -1, a - k * x};
    }
  }
  return std::nullopt;
}

const char* slot_name(SizeSlot slot) {
  switch (slot) {
    case SizeSlot::ParamDim: return "an input's size";
    case SizeSlot::Arg: return "an int argument";
    case SizeSlot::OutputDim: return "an op's output size";
  }
  return "a size";
}

}  // namespace

std::optional<SizePlan> SizePlan::infer(const std::vector<int64_t>& first, const std::vector<int64_t>& second,
                                        const std::vector<SizeSlot>& slots, std::string* why_not) {
  SizePlan plan;
  std::vector<Pair> symbols;
  // Symbols come from the dims of inputs, then of outputs (an arange's length), smallest
  // first: [4, T] and [4*T] make T the symbol and 4*T its multiple.
  for (SizeSlot kind : {SizeSlot::ParamDim, SizeSlot::OutputDim}) {
    std::vector<std::pair<Pair, int>> differing;
    for (size_t i = 0; i < first.size(); ++i)
      if (slots[i] == kind && first[i] != second[i]) differing.push_back({{first[i], second[i]}, static_cast<int>(i)});
    std::sort(differing.begin(), differing.end());
    for (const auto& [size, slot] : differing) {
      if (explain(size, symbols)) continue;
      if (size.first <= 0 || size.second <= 0) continue;  // left to explain (fails below)
      symbols.push_back(size);
      plan.witness_.push_back(slot);
      plan.first_values_.push_back(size.first);
    }
  }
  plan.exprs_.resize(first.size());
  for (size_t i = 0; i < first.size(); ++i) {
    if (first[i] == second[i]) {
      plan.exprs_[i] = SizeExpr::constant(first[i]);
      continue;
    }
    std::optional<SizeExpr> e = explain({first[i], second[i]}, symbols);
    if (!e) {
      if (why_not)
        *why_not = std::string(slot_name(slots[i])) + " changed from " + std::to_string(first[i]) + " to " +
                   std::to_string(second[i]) + ", which follows from no size of the inputs";
      return std::nullopt;
    }
    plan.exprs_[i] = *e;
  }
  return plan;
}

bool SizePlan::read(const std::vector<int64_t>& sizes, std::vector<int64_t>* symbols) const {
  if (sizes.size() != exprs_.size()) return false;
  symbols->assign(witness_.size(), 0);
  for (size_t s = 0; s < witness_.size(); ++s) (*symbols)[s] = sizes[witness_[s]];
  for (size_t i = 0; i < sizes.size(); ++i)
    if (exprs_[i].eval(*symbols) != sizes[i]) return false;
  return true;
}

void reset_bucket_counts(BucketState& state) {
  for (auto& [hash, s] : state.structures) {
    s.padded_runs = 0;
    s.exact_graphs = 0;
    s.buckets.clear();
  }
  state.exact_graphs_by_origin.clear();
}

namespace {

// ---- structure: a graph's hash without its sizes ------------------------------------------

// Like hash_graph, but blind to every size and static int argument (SizePlan relates those):
// ops, argument kinds and non-int values, bodies (hash_node_structure), wiring, dtypes and
// ranks. Not which inputs arrive padded: a decode step whose cache was computed padded by the
// previous step is the same structure as the step before it, whose cache came exact (the
// runner's variants differ).
uint64_t structure_hash(const Engine::Graph& g) {
  uint64_t h = hash_mix(0x5B0C, static_cast<uint64_t>(g.device));
  for (const ValuePtr& p : g.params) h = hash_mix(hash_mix(h, static_cast<uint64_t>(p->type.dtype)), p->type.shape.size());
  return hash_wiring(h, g, hash_node_structure);
}

SymbolicGraph::Ref ref_of(const Engine::Graph& g, const ValuePtr& v) {
  if (v->pending()) return {g.node_index.at(v->node.get()), v->output_index};
  return {-1, g.param_index.at(v.get())};
}

SymbolicGraph describe_graph(const Engine::Graph& g, const SizePlan& plan, const std::vector<LayoutSpec>& layouts) {
  SymbolicGraph sg;
  sg.first_values = plan.first_values();
  sg.params.resize(g.params.size());
  sg.param_layouts = layouts;
  sg.ops.resize(g.nodes.size());
  int scalars = 0;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    SymbolicGraph::Op& op = sg.ops[n];
    const Node* node = g.nodes[n];
    op.node = node;
    for (const ValuePtr& v : node->operands) op.operands.push_back(ref_of(g, v));
    op.ints.resize(node->args.size());
    op.scalar.assign(node->args.size(), -1);
    for (size_t a = 0; a < node->args.size(); ++a)
      if (node->args[a].lifted) op.scalar[a] = scalars++;
    op.outputs.resize(node->outputs.size());
  }
  size_t slot = 0;
  const auto& exprs = plan.exprs();
  for_each_size(g.nodes, g.params, [&](SizeSlot kind, int node, int index, int64_t) {
    const SizeExpr& e = exprs[slot++];
    if (kind == SizeSlot::ParamDim) sg.params[index].push_back(e);
    else if (kind == SizeSlot::Arg) sg.ops[node].ints[index].push_back(e);
    else sg.ops[node].outputs[index].push_back(e);
  });
  for (const ValuePtr& r : g.roots) sg.roots.push_back(ref_of(g, r));
  return sg;
}

// The layout of a padded-only value in terms of the symbols: a dimension of one padded factor
// is the length its size expression in this graph names (symbol + offset: a cache of T + 1
// tokens where T is the symbol); otherwise each padded factor must equal a symbol's value.
// nullopt when a padded factor matches no length.
std::optional<LayoutSpec> layout_of(const PaddedBuffer& padded, const std::vector<int64_t>& symbols,
                                    const std::vector<SizeExpr>& dims) {
  LayoutSpec spec;
  for (size_t d = 0; d < padded.dims.size(); ++d) {
    const auto& dim = padded.dims[d];
    std::vector<FactorSpec> factors;
    for (const auto& f : dim) {
      if (f.bucket == f.real) {
        factors.push_back({f.bucket, -1, 0});
        continue;
      }
      if (dim.size() == 1 && d < dims.size() && dims[d].coeff == 1 && dims[d].b < 0 && dims[d].a >= 0 &&
          symbols[dims[d].a] + dims[d].offset == f.real) {
        factors.push_back({f.bucket, dims[d].a, dims[d].offset});
        continue;
      }
      auto it = std::find(symbols.begin(), symbols.end(), f.real);
      if (it == symbols.end()) return std::nullopt;
      factors.push_back({f.bucket, static_cast<int>(it - symbols.begin()), 0});
    }
    spec.push_back(std::move(factors));
  }
  return spec;
}

// The padded value a layout describes, or null when the layout pads nothing.
std::shared_ptr<PaddedBuffer> padded_value(BufferPtr buffer, const LayoutSpec& layout,
                                           const std::vector<int64_t>& symbols) {
  auto padded = std::make_shared<PaddedBuffer>();
  padded->buffer = std::move(buffer);
  bool pads = false;
  for (const auto& dim : layout) {
    std::vector<PaddedBuffer::Factor> factors;
    for (const FactorSpec& f : dim) {
      int64_t real = f.real(symbols);
      pads = pads || real != f.bucket;
      factors.push_back({f.bucket, real});
    }
    padded->dims.push_back(std::move(factors));
  }
  return pads ? padded : nullptr;
}

// Why an output of the padded graph does not fit the root it computes, or "".
std::string check_output(const ValuePtr& out, const LayoutSpec& layout, const TensorType& want,
                         const std::vector<int64_t>& symbols, int device) {
  if (!out || out->device != device) return "an output is not a tensor on the flush's device";
  if (!out->pending() && !out->buffer) return "an output is not computed by the padded graph";
  const TensorType& got = out->type;
  if (got.dtype != want.dtype) return "an output's dtype differs";
  if (layout.empty()) return got.shape == want.shape ? "" : "an unpadded output's shape differs";
  if (layout.size() != want.shape.size() || got.shape.size() != want.shape.size()) return "an output's rank differs";
  for (size_t d = 0; d < layout.size(); ++d) {
    int64_t bucket = 1, real = 1;
    for (const FactorSpec& f : layout[d]) {
      bucket *= f.bucket;
      real *= f.real(symbols);
    }
    if (bucket != got.shape[d] || real != want.shape[d]) return "an output's padding does not match its shape";
  }
  return "";
}

// Makes a padded-only value pending again: a torchtpu::unpad node slices its real elements
// out of the padded buffer (in the graph that reads it).
void make_unpad_node(const ValuePtr& v) {
  static const OpKind op = OpKind::intern("torchtpu::unpad");
  auto source = std::make_shared<Value>();
  source->type = v->padded->buffer->type;
  source->device = v->device;
  source->buffer = v->padded->buffer;
  Arg bucket, real;
  bucket.kind = real.kind = Arg::Kind::IntList;
  for (const auto& dim : v->padded->dims)
    for (const auto& f : dim) {
      bucket.ints.push_back(f.bucket);
      real.ints.push_back(f.real);
    }
  auto node = std::make_shared<Node>();
  node->op = op;
  node->args = {Arg::tensor(0), std::move(bucket), std::move(real)};
  node->outputs = {v->type};
  node->device = v->device;
  source->node_uses.fetch_add(1);
  node->operands = {std::move(source)};
  node->hash = hash_node(*node);
  v->node = std::move(node);
  v->output_index = 0;
  v->padded.reset();
}

}  // namespace

// ---- the engine's steps ------------------------------------------------------------------

// Called by run_graph for a fused flush before compiling it: true when the graph ran padded.
bool Engine::run_bucketed(Graph& g) {
  bool carries_padded = std::any_of(g.params.begin(), g.params.end(), [](const ValuePtr& p) { return p->padded_only(); });
  if (!carries_padded && memory_cache_.count(g.hash)) return false;  // this exact graph ran before
  if (!hooks_.run_bucketed || bucket_depth_ > 0) return false;
  std::vector<int64_t> sizes;
  std::vector<SizeSlot> slots;
  for_each_size(g.nodes, g.params, [&](SizeSlot slot, int, int, int64_t v) {
    sizes.push_back(v);
    slots.push_back(slot);
  });
  auto [it, fresh] = buckets_->structures.try_emplace(structure_hash(g));
  BucketState::Structure& structure = it->second;
  std::string refused;
  if (fresh) {
    static std::atomic<int64_t> next_id{1};  // never reused: the runner caches by id
    structure.id = next_id++;
    structure.origin = g.origin;
    structure.ops = static_cast<int64_t>(g.nodes.size());
    structure.first = sizes;
    refused = "the first graph of its kind runs at its sizes";
  } else {
    refused = run_padded(g, structure, sizes, slots);
  }
  if (refused.empty()) {
    structure.padded_runs++;
    return true;
  }
  note_exact_graph(g, structure, refused, /*sizes_differ=*/!fresh);
  return false;
}

std::string Engine::run_padded(Graph& g, BucketState::Structure& structure, const std::vector<int64_t>& sizes,
                               const std::vector<SizeSlot>& slots) {
  if (!structure.plan) {
    if (sizes == structure.first) return "same sizes as the first graph of its kind (buffer donation differs)";
    std::string why;
    structure.plan = SizePlan::infer(structure.first, sizes, slots, &why);
    if (!structure.plan) return why;
  }
  BucketRequest request;
  request.structure = structure.id;
  request.device = g.device;
  if (!structure.plan->read(sizes, &request.symbols))
    return "its sizes do not follow from the first two graphs of its kind";
  request.donatable.assign(g.params.size(), false);
  for (size_t p = 0; p < g.params.size(); ++p) {
    const ValuePtr& v = g.params[p];  // held by g.params and the nodes reading it, or more
    const BufferPtr& buffer = v->padded_only() ? v->padded->buffer : v->buffer;
    request.donatable[p] = g.donate && buffer && v.use_count() - 1 == v->node_uses.load() &&
                           (!v->padded_only() || v->padded.use_count() == 1) && buffer.use_count() == 1 &&
                           !buffer->shared_outside.load() && v->type.numel() > 0;
  }
  request.params = g.params;
  std::vector<std::pair<const Value*, std::weak_ptr<Value>>> carried;
  for (ValuePtr& p : request.params) {
    if (!p->padded_only()) continue;
    // A value computed padded goes to the runner as its padded buffer (layout below).
    auto padded = std::make_shared<Value>();
    padded->type = p->padded->buffer->type;
    padded->device = p->device;
    padded->buffer = p->padded->buffer;
    carried.push_back({padded.get(), p});
    p = std::move(padded);
  }
  request.param_layouts.resize(g.params.size());
  request.number_params.assign(g.params.size(), false);
  std::vector<std::vector<SizeExpr>> param_dims(g.params.size());  // each parameter's dims, as expressions
  size_t slot = 0;
  for_each_size(g.nodes, g.params, [&](SizeSlot kind, int, int index, int64_t) {
    if (kind == SizeSlot::ParamDim) param_dims[index].push_back(structure.plan->exprs()[slot]);
    ++slot;
  });
  for (size_t p = 0; p < g.params.size(); ++p) {
    if (!g.params[p]->padded_only()) continue;
    auto layout = layout_of(*g.params[p]->padded, request.symbols, param_dims[p]);
    if (!layout) return "an input computed padded has a padded size that is no symbol of this graph";
    request.param_layouts[p] = std::move(*layout);
  }
  for (const Node* node : g.nodes) {
    for (const Arg& a : node->args) {
      if (a.kind == Arg::Kind::Tensor && a.i && !node->operands[a.operands[0]]->pending())
        request.number_params[g.param_index.at(node->operands[a.operands[0]].get())] = true;
      if (a.lifted) request.scalars.push_back(&a);
    }
  }
  const SizePlan& plan = *structure.plan;
  request.describe = [&] { return describe_graph(g, plan, request.param_layouts); };

  // The runner records the padded graph apart from any pending work, all of it (no flush).
  BucketRun run;
  {
    std::vector<std::weak_ptr<Value>> saved_pending;
    saved_pending.swap(pending_);
    int64_t saved_ops = pending_ops_, saved_max = max_pending_ops_;
    std::string saved_origin = pending_origin_;
    pending_ops_ = 0;
    max_pending_ops_ = std::numeric_limits<int64_t>::max();
    bucket_depth_++;
    std::exception_ptr interrupt;  // Ctrl-C: raised again once the engine's state is back
    try {
      run = hooks_.run_bucketed(request);
    } catch (const std::exception& e) {
      if (is_interrupt(std::current_exception())) interrupt = std::current_exception();
      run = BucketRun{};
      std::string what = e.what();
      run.refused = "the padded graph could not be recorded: " + what.substr(0, what.find('\n'));
    }
    bucket_depth_--;
    pending_.swap(saved_pending);
    pending_ops_ = saved_ops;
    max_pending_ops_ = saved_max;
    pending_origin_ = saved_origin;
    if (interrupt) std::rethrow_exception(interrupt);
  }
  request.params.clear();  // held references would keep the flush's inputs from being donated
  if (!run.refused.empty()) return run.refused;
  if (run.outputs.size() != g.roots.size() || run.layouts.size() != g.roots.size())
    return "the padded graph has a different number of outputs";
  for (size_t r = 0; r < g.roots.size(); ++r) {
    std::string bad = check_output(run.outputs[r], run.layouts[r], g.roots[r]->type, request.symbols, g.device);
    if (!bad.empty()) return "the padded graph does not fit: " + bad;
  }

  std::vector<ValuePtr> padded_roots;
  std::unordered_set<const Value*> seen;
  for (const ValuePtr& out : run.outputs)
    if (out->pending() && seen.insert(out.get()).second) padded_roots.push_back(out);
  g.params.clear();  // as above: the padded graph donates what the flush would have
  g.param_index.clear();
  Graph padded;
  if (!padded_roots.empty()) {
    padded = graph_of(std::move(padded_roots), g.device, nullptr, g.origin);
    carried_owners_ = std::move(carried);
    try {
      run_graph(padded);
    } catch (...) {
      carried_owners_.clear();
      throw;
    }
    carried_owners_.clear();
  }
  for (size_t r = 0; r < g.roots.size(); ++r) {
    const ValuePtr& root = g.roots[r];
    BufferPtr buffer = run.outputs[r]->buffer;
    if (auto value = padded_value(buffer, run.layouts[r], request.symbols)) root->padded = std::move(value);
    else root->buffer = std::move(buffer);
    root->node.reset();
  }
  structure.buckets.insert(run.bucket);
  return "";
}

// An exact-size graph will be compiled for this flush: counted per origin, warned about once
// when one line keeps compiling graphs for new sizes.
void Engine::note_exact_graph(const Graph& g, BucketState::Structure& structure, const std::string& reason,
                              bool sizes_differ) {
  structure.exact_graphs++;
  structure.exact_reason = reason;
  // A graph of a new structure is not a storm; one compiled again for other sizes is.
  if (!sizes_differ) return;
  int64_t count = ++buckets_->exact_graphs_by_origin[g.origin];
  if (count > kStormWarningGraphs && !g.origin.empty() && buckets_->warned_origins.insert(g.origin).second &&
      hooks_.warn)
    hooks_.warn("torchtpu: " + g.origin + " has compiled " + std::to_string(count) +
                " graphs at exact sizes (a recompilation storm); the latest could not run padded to a bucket: " +
                reason + ". torchtpu.metrics.report() lists the graphs.");
}

// Values a bucketed graph left padded, read by this (exact) graph: each becomes a slice of
// its padded buffer inside the graph, and a root when something else holds it.
bool Engine::unpad_params(Graph& g) {
  std::vector<ValuePtr> padded;
  for (const ValuePtr& p : g.params)
    if (p->padded_only()) padded.push_back(p);
  if (padded.empty()) return false;
  for (const ValuePtr& v : padded) {
    bool held = v.use_count() - 2 > v->node_uses.load();  // beyond g.params and `padded`
    make_unpad_node(v);
    if (held) g.roots.push_back(v);
  }
  g.nodes.clear();
  g.node_index.clear();
  g.params.clear();
  g.param_index.clear();
  collect_nodes(&g, g.roots);
  return true;
}

// A padded-only value read at its real size outside a graph (materialize): sliced now.
void Engine::compute_unpadded(const ValuePtr& value) {
  make_unpad_node(value);
  Graph g = graph_of({value}, value->device, nullptr, hooks_.python_origin ? hooks_.python_origin() : "");
  run_graph(g);
}

std::vector<BucketSummary> Engine::bucket_summaries() {
  EngineLock lock;
  std::vector<BucketSummary> out;
  for (const auto& [hash, s] : buckets_->structures) {
    if (s.padded_runs == 0 && s.exact_graphs <= 1) continue;  // seen once: nothing to report
    BucketSummary b;
    b.origin = s.origin;
    b.ops = s.ops;
    b.padded_runs = s.padded_runs;
    b.exact_graphs = s.exact_graphs;
    b.buckets.assign(s.buckets.begin(), s.buckets.end());
    b.exact_reason = s.exact_reason;
    out.push_back(std::move(b));
  }
  std::sort(out.begin(), out.end(), [](const BucketSummary& x, const BucketSummary& y) { return x.origin < y.origin; });
  return out;
}

}  // namespace torchtpu
