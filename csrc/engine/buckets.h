// Shape buckets for fused graphs: a flush whose graph differs from an earlier graph of the
// same structure only in its sizes runs padded to a bucket of its sizes, so a loop over N
// distinct lengths compiles O(log N) graphs instead of N.
//
// The engine finds which sizes are dynamic (SizePlan: sizes that differ between two graphs
// of one structure, as functions of a few symbols) and hands the graph, its sizes written as
// expressions, to a BucketRunner (torchtpu/_fused_buckets.py) that rewrites it with the
// padding rules torch.compile uses (torchtpu/_buckets.py) and records the padded graph.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"

namespace torchtpu {

// A size as a function of a graph's symbols: coeff * s[a] * s[b] + offset, where a missing
// symbol (-1) counts as 1 and coeff 0 makes the size the constant `offset`.
struct SizeExpr {
  int64_t coeff = 0;
  int a = -1;
  int b = -1;
  int64_t offset = 0;

  static SizeExpr constant(int64_t value) { return SizeExpr{0, -1, -1, value}; }
  bool symbolic() const { return coeff != 0; }
  int64_t eval(const std::vector<int64_t>& symbols) const;
  bool operator==(const SizeExpr& o) const { return coeff == o.coeff && a == o.a && b == o.b && offset == o.offset; }
};

// Where a size of a graph sits: a parameter's dim, a static int argument, an output's dim.
enum class SizeSlot : uint8_t { ParamDim, Arg, OutputDim };

// Every size of a graph in one fixed order: each parameter's dims, then per node its static
// Int / IntList arguments (in argument order) and its outputs' dims. f(slot, node index (-1
// for a parameter), argument / output / parameter index, value).
template <class F>
void for_each_size(const std::vector<Node*>& nodes, const std::vector<ValuePtr>& params, F&& f) {
  for (size_t p = 0; p < params.size(); ++p)
    for (int64_t d : params[p]->type.shape) f(SizeSlot::ParamDim, -1, static_cast<int>(p), d);
  for (size_t n = 0; n < nodes.size(); ++n) {
    const Node& node = *nodes[n];
    for (size_t a = 0; a < node.args.size(); ++a) {
      const Arg& arg = node.args[a];
      if (arg.lifted) continue;
      if (arg.kind == Arg::Kind::Int) f(SizeSlot::Arg, static_cast<int>(n), static_cast<int>(a), arg.i);
      if (arg.kind == Arg::Kind::IntList)
        for (int64_t v : arg.ints) f(SizeSlot::Arg, static_cast<int>(n), static_cast<int>(a), v);
    }
    for (size_t o = 0; o < node.outputs.size(); ++o)
      for (int64_t d : node.outputs[o].shape) f(SizeSlot::OutputDim, static_cast<int>(n), static_cast<int>(o), d);
  }
}

// Which sizes of a structure are dynamic, learned from two of its graphs: sizes equal in
// both are constants; the others are symbols (from parameter and output dims, smallest
// first) or simple functions of them (k*s, k*s*t, k*s+d). Static int arguments must follow
// from the symbols (a view's shape, an arange's end); a later graph must fit exactly.
class SizePlan {
 public:
  static std::optional<SizePlan> infer(const std::vector<int64_t>& first, const std::vector<int64_t>& second,
                                       const std::vector<SizeSlot>& slots, std::string* why_not);
  // The symbols' values in a graph with these sizes; false when its sizes do not fit.
  bool read(const std::vector<int64_t>& sizes, std::vector<int64_t>* symbols) const;
  int symbol_count() const { return static_cast<int>(witness_.size()); }
  const std::vector<SizeExpr>& exprs() const { return exprs_; }
  const std::vector<int64_t>& first_values() const { return first_values_; }

 private:
  std::vector<int> witness_;           // per symbol: a slot that is exactly that symbol
  std::vector<SizeExpr> exprs_;        // per slot
  std::vector<int64_t> first_values_;  // per symbol: its value in the first graph
};

// Per dimension, the factors of a padded value (outermost first): the factor's size at the
// bucket and the length it pads: symbol + offset (symbol -1: a factor that is not padded).
// A cache grown by a cat holds T + 1 real elements in the bucket of T's symbol.
struct FactorSpec {
  int64_t bucket = 1;
  int symbol = -1;
  int64_t offset = 0;
  int64_t real(const std::vector<int64_t>& symbols) const { return symbol < 0 ? bucket : symbols[symbol] + offset; }
};
using LayoutSpec = std::vector<std::vector<FactorSpec>>;

// A flush's graph with its sizes as expressions of the symbols (what the runner rewrites).
struct SymbolicGraph {
  struct Ref {
    int node = -1;  // -1: parameter `index`; else output `index` of op `node`
    int index = 0;
  };
  struct Op {
    const Node* node = nullptr;
    std::vector<Ref> operands;                   // node->operands, in order
    std::vector<std::vector<SizeExpr>> ints;     // per argument: its static Int / IntList values
    std::vector<int> scalar;                     // per argument: its index among the lifted scalars, or -1
    std::vector<std::vector<SizeExpr>> outputs;  // per output: its dims
  };
  std::vector<int64_t> first_values;            // each symbol's value in the first graph
  std::vector<std::vector<SizeExpr>> params;    // per parameter: its dims
  std::vector<LayoutSpec> param_layouts;        // per parameter: its padding (empty: none)
  std::vector<Op> ops;
  std::vector<Ref> roots;
};

// One flush offered to the runner.
struct BucketRequest {
  int64_t structure = 0;             // graphs with one id differ only in their sizes
  int device = 0;
  std::vector<int64_t> symbols;      // each symbol's real value in this graph
  std::vector<ValuePtr> params;      // a padded-only one is passed as its padded buffer
  std::vector<LayoutSpec> param_layouts;
  std::vector<bool> number_params;   // a Python number used as a tensor operand (x * 0.5)
  std::vector<const Arg*> scalars;   // the lifted arguments, in node order
  std::function<SymbolicGraph()> describe;
  // Per parameter: nothing but this flush holds it (plan_donation's test), so the padded graph
  // may give its buffer to a result, as recording and running it would (a replayed capture
  // donates these: device/capture.h capture_end's `vouched`).
  std::vector<bool> donatable;
};

// The runner's answer: the flush's roots recorded (pending) at the bucket's sizes, or why not.
struct BucketRun {
  std::string refused;              // empty when the padded graph was recorded
  std::vector<int64_t> bucket;      // each symbol's bucket
  std::vector<ValuePtr> outputs;    // per root of the flush
  std::vector<LayoutSpec> layouts;  // per root: its padding (empty: none)
};
using BucketRunner = std::function<BucketRun(BucketRequest&)>;

// What metrics.report() shows per structure seen at more than one size.
struct BucketSummary {
  std::string origin;
  int64_t ops = 0;
  int64_t padded_runs = 0;
  int64_t exact_graphs = 0;
  std::vector<std::vector<int64_t>> buckets;
  std::string exact_reason;  // why its latest exact-size graph did not run padded
};

// The engine's memory of structures (one per size-free structural hash).
struct BucketState {
  struct Structure {
    int64_t id = 0;
    std::string origin;
    int64_t ops = 0;
    std::vector<int64_t> first;  // the sizes of its first graph
    std::optional<SizePlan> plan;
    int64_t padded_runs = 0;
    int64_t exact_graphs = 0;
    std::set<std::vector<int64_t>> buckets;
    std::string exact_reason;
  };
  std::unordered_map<uint64_t, Structure> structures;
  std::map<std::string, int64_t> exact_graphs_by_origin;  // the storm guard's count
  std::set<std::string> warned_origins;
};
void reset_bucket_counts(BucketState& state);

// An origin (Python line) that compiles more exact-size graphs than this is warned about once.
constexpr int64_t kStormWarningGraphs = 8;

}  // namespace torchtpu
