// The engine and the lowerings, built and run without torch or Python: a fake Runtime
// records the module text it is asked to compile and hands back placeholder buffers, so
// this checks the emitted StableHLO and the engine's bookkeeping (caches, lifted scalars,
// donation, modes). Run by `make cpptest` and tests/test_cpp.py.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/graph_plan.h"
#include "engine/trace.h"
#include "lowering/registry.h"
#include "lowering/stablehlo_call.h"
#include "runtime/runtime.h"

using namespace torchtpu;

namespace {

int g_failures = 0;
int g_checks = 0;

#define CHECK(cond)                                                          \
  do {                                                                       \
    ++g_checks;                                                              \
    if (!(cond)) {                                                           \
      ++g_failures;                                                          \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                        \
  } while (0)

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct FakeBuffer final : DeviceBuffer {
  std::vector<char> bytes;  // what was uploaded (empty for results)
  bool deleted = false;     // consumed by a failed execution
  using DeviceBuffer::DeviceBuffer;
};

struct FakeExecutable final : Executable {
  std::string text;
  MeshPtr mesh;  // partitioned: its results are replicated over it
};

// Compiles nothing and computes nothing: remembers what the engine asked for.
class FakeRuntime final : public Runtime {
 public:
  bool float64 = true;
  int64_t memory_limit_bytes = int64_t(1) << 40;
  std::vector<std::string> compiled;           // module texts, in order
  std::vector<size_t> launch_arg_counts;       // per execute: number of arguments
  std::vector<std::vector<char>> uploads;      // bytes of every upload_bytes
  std::vector<CompileOptions> compile_options; // per compile, in order

  const std::string& platform() const override { return platform_; }
  int device_count() const override { return 1; }
  const std::string& version() const override { return platform_; }
  bool has_float64() const override { return float64; }
  std::string reject;                 // compile fails for modules containing this text
  bool fail_next_execute = false;     // the next execute fails like PJRT out of memory,
                                      // consuming its arguments as PJRT does donated ones

  ExecutablePtr compile(const std::string& text, const CompileOptions& options) override {
    if (options.device != 0) throw std::logic_error("fake runtime: device " + std::to_string(options.device));
    if (!reject.empty() && contains(text, reject)) throw std::runtime_error("fake compiler rejects " + reject);
    compiled.push_back(text);
    compile_options.push_back(options);
    auto exe = std::make_shared<FakeExecutable>();
    exe->text = text;
    exe->mesh = options.mesh;
    return exe;
  }
  std::vector<BufferPtr> execute(Executable& exe, const std::vector<BufferPtr>& args,
                                 const std::vector<TensorType>& result_types, int device) override {
    const MeshPtr& mesh = static_cast<FakeExecutable&>(exe).mesh;
    for (const BufferPtr& a : args)
      if (a && static_cast<bool>(mesh) != static_cast<bool>(a->sharding))
        throw std::logic_error("fake runtime: a partitioned executable takes sharded buffers only, others none");
    for (const BufferPtr& a : args)
      if (!a || static_cast<FakeBuffer&>(*a).deleted)
        throw std::logic_error("fake runtime: a null or deleted argument (a donated buffer used again?)");
    if (fail_next_execute) {
      fail_next_execute = false;
      for (const BufferPtr& a : args) static_cast<FakeBuffer&>(*a).deleted = true;
      throw DeviceOutOfMemory("fake runtime: out of memory");
    }
    launch_arg_counts.push_back(args.size());
    std::vector<BufferPtr> out;
    for (const TensorType& t : result_types)
      out.push_back(std::make_shared<FakeBuffer>(
          t, device, mesh ? std::make_shared<Sharding>(Sharding::replicated(mesh, t.rank())) : nullptr));
    return out;
  }
  BufferPtr assemble_sharded(const TensorType& global, ShardingPtr sharding, const std::vector<BufferPtr>& shards) override {
    for (size_t p = 0; p < shards.size(); ++p)
      if (shards[p]->device != sharding->mesh->devices[p] ||
          shards[p]->type.shape != sharding->shard_shape(global.shape, static_cast<int>(p)))
        throw std::logic_error("fake runtime: a shard of the wrong device or shape");
    return std::make_shared<FakeBuffer>(global, sharding->mesh->devices[0], std::move(sharding));
  }
  BufferPtr upload(DLManagedTensor*, const TensorType&, int) override {
    throw std::logic_error("fake runtime: no DLPack uploads");
  }
  BufferPtr upload_bytes(const void* data, const TensorType& type, int device) override {
    auto b = std::make_shared<FakeBuffer>(type, device);
    const char* p = static_cast<const char*>(data);
    b->bytes.assign(p, p + type.nbytes());
    uploads.push_back(b->bytes);
    return b;
  }
  DLManagedTensor* download(const DeviceBuffer&) override { throw std::logic_error("fake runtime: no downloads"); }
  void wait(const DeviceBuffer&) override { ++waits; }
  bool is_ready(const DeviceBuffer&) override { return true; }
  void download_bytes(const DeviceBuffer& buffer, void* out) override {
    std::memset(out, 0, static_cast<size_t>(buffer.type.nbytes()));  // results compute nothing: zeros
  }
  int64_t memory_limit(int) override { return memory_limit_bytes; }
  int64_t memory_needed(Executable&) override { return 0; }
  bool is_deleted(const DeviceBuffer& buffer) override { return static_cast<const FakeBuffer&>(buffer).deleted; }
  std::string serialize(Executable&) override { return ""; }
  ExecutablePtr deserialize(const std::string&, const CompileOptions&) override {
    throw std::logic_error("fake runtime: no disk cache");
  }
  std::string device_kind(int) override { return "fake"; }
  std::map<std::string, int64_t> memory_stats(int) override { return {}; }
  int waits = 0;

 private:
  std::string platform_ = "fake";
};

OpKind op(const char* name) {
  const LoweringRule* rule = find_lowering(name);
  if (!rule) throw std::logic_error(std::string("no lowering ") + name);
  return rule->kind;
}

Arg int_list(std::vector<int64_t> v) {
  Arg a;
  a.kind = Arg::Kind::IntList;
  a.ints = std::move(v);
  return a;
}

ValuePtr input(FakeRuntime& rt, const TensorType& type) {
  std::vector<float> data(type.numel(), 1.0f);
  return Engine::get().from_buffer(rt.upload_bytes(data.data(), type, 0));
}

const TensorType kMatrix{{2, 3}, DType::Float32};
const TensorType kRow{{2}, DType::Float32};

// (x + y) * s, summed over dim 1: three pending nodes, one graph at the flush.
ValuePtr record_add_scale_sum(const ValuePtr& x, const ValuePtr& y, double s) {
  Engine& e = Engine::get();
  ValuePtr sum = e.record(op("aten::add.Tensor"), {Arg::tensor(0), Arg::tensor(1), Arg::integer(1)}, {x, y},
                          {kMatrix}, 0)[0];
  ValuePtr scaled = e.record(op("aten::mul.Scalar"), {Arg::tensor(0), Arg::real(s, /*lifted=*/true)}, {sum},
                             {kMatrix}, 0)[0];
  return e.record(op("aten::sum.dim_IntList"), {Arg::tensor(0), int_list({1}), Arg::boolean(false), Arg::none()},
                  {scaled}, {kRow}, 0)[0];
}

void test_fused_graph_is_lowered_once_and_cached(FakeRuntime& rt) {
  Engine& e = Engine::get();
  e.reset_metrics();
  ValuePtr x = input(rt, kMatrix), y = input(rt, kMatrix);
  ValuePtr out = record_add_scale_sum(x, y, 2.5);
  CHECK(out->pending());
  CHECK(e.pending_ops() == 3);
  CHECK(rt.compiled.empty());
  BufferPtr result = e.materialize(out);
  CHECK(result && result->type == kRow);
  CHECK(!out->pending());
  CHECK(e.pending_ops() == 0);
  CHECK(rt.compiled.size() == 1);
  const std::string& text = rt.compiled.back();
  // The envelope (stablehlo/module.cpp): attributes, parameters, the scalar pack, return.
  CHECK(contains(text, "module @torchtpu attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}"));
  CHECK(contains(text, "func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<2x3xf32>, "
                       "%scalars_f: tensor<1xf64>) -> (tensor<2xf32>)"));
  CHECK(!contains(text, "tf.aliasing_output"));  // the test still holds x and y
  // The body: one comment and the ops of each lowering, in order.
  size_t add = text.find("// aten::add.Tensor"), mul = text.find("// aten::mul.Scalar"),
         red = text.find("// aten::sum.dim_IntList");
  CHECK(add != std::string::npos && add < mul && mul < red);
  CHECK(contains(text, "\"stablehlo.add\"(%arg0, %arg1) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>"));
  CHECK(contains(text, "\"stablehlo.slice\"(%scalars_f)"));  // the lifted 2.5 is read from the pack
  CHECK(contains(text, "\"stablehlo.multiply\""));
  CHECK(contains(text, "\"stablehlo.reduce\""));
  CHECK(contains(text, "dimensions = array<i64: 1>"));
  CHECK(contains(text, "\"func.return\""));
  // Bookkeeping: one launch with both parameters and the float pack holding 2.5.
  CHECK(e.metrics().ops_traced == 3);
  CHECK(e.metrics().graphs_compiled == 1);
  CHECK(e.metrics().execute_count == 1);
  CHECK(rt.launch_arg_counts.back() == 3);
  double lifted = 0;
  std::memcpy(&lifted, rt.uploads.back().data(), sizeof(lifted));
  CHECK(rt.uploads.back().size() == sizeof(double) && lifted == 2.5);

  // The same graph with another scale: a memory-cache hit, the new scalar in the pack.
  ValuePtr again = record_add_scale_sum(x, y, 0.25);
  e.materialize(again);
  CHECK(rt.compiled.size() == 1);
  CHECK(e.metrics().cache_hits_memory == 1);
  CHECK(e.metrics().execute_count == 2);
  std::memcpy(&lifted, rt.uploads.back().data(), sizeof(lifted));
  CHECK(lifted == 0.25);
}

void test_unheld_parameter_is_donated(FakeRuntime& rt) {
  Engine& e = Engine::get();
  e.reset_metrics();
  ValuePtr x = input(rt, kMatrix);
  ValuePtr y = e.record(op("aten::mul.Scalar"), {Arg::tensor(0), Arg::real(3.0, true)}, {x}, {kMatrix}, 0)[0];
  std::weak_ptr<DeviceBuffer> x_buffer = x->buffer;
  x.reset();  // only the node holds x now: its buffer may become y's
  e.materialize(y);
  CHECK(contains(rt.compiled.back(), "%arg0: tensor<2x3xf32> {tf.aliasing_output = 0 : i32}"));
  CHECK(e.metrics().donated_buffers == 1);
  CHECK(x_buffer.expired());  // the engine let go of the donated buffer
}

void test_platform_without_f64_lifts_f32_scalars(FakeRuntime& rt) {
  Engine& e = Engine::get();
  e.clear_memory_cache();
  rt.float64 = false;
  ValuePtr x = input(rt, kMatrix), y = input(rt, kMatrix);
  e.materialize(record_add_scale_sum(x, y, 2.5));
  rt.float64 = true;
  CHECK(contains(rt.compiled.back(), "%scalars_f: tensor<1xf32>"));
  float lifted = 0;
  CHECK(rt.uploads.back().size() == sizeof(float));
  std::memcpy(&lifted, rt.uploads.back().data(), sizeof(lifted));
  CHECK(lifted == 2.5f);
  e.clear_memory_cache();
}

void test_strict_mode_runs_each_op_at_once(FakeRuntime& rt) {
  Engine& e = Engine::get();
  e.set_mode(Mode::Strict);
  e.reset_metrics();
  ValuePtr x = input(rt, kMatrix), y = input(rt, kMatrix);
  ValuePtr out = record_add_scale_sum(x, y, 2.0);
  CHECK(!out->pending() && out->buffer);
  CHECK(e.metrics().execute_count == 3);
  CHECK(e.pending_ops() == 0);
  int waits = rt.waits;
  e.set_mode(Mode::Debug);
  e.record(op("aten::add.Tensor"), {Arg::tensor(0), Arg::tensor(1), Arg::integer(1)}, {x, y}, {kMatrix}, 0);
  CHECK(rt.waits == waits + 1);  // debug mode waits for each op
  e.set_mode(Mode::Fused);
}

// A lowering whose result differs from the type PyTorch's meta kernel gave is an error
// that names the op, raised when the op is recorded (the node is lowered alone the first
// time its signature is seen): it never joins a pending graph.
void test_wrong_output_type_is_reported(FakeRuntime& rt) {
  Engine& e = Engine::get();
  ValuePtr x = input(rt, kMatrix), y = input(rt, kMatrix);
  int64_t pending = e.pending_ops();
  std::string message;
  for (int attempt = 0; attempt < 2; ++attempt) {  // every time, not only the first
    message.clear();
    try {
      e.record(op("aten::eq.Tensor"), {Arg::tensor(0), Arg::tensor(1)}, {x, y}, {kMatrix}, 0);
    } catch (const std::logic_error& err) {
      message = err.what();
    }
    CHECK(contains(message, "lowering of aten::eq.Tensor result 0 has type bool[2, 3] but PyTorch expects float32[2, 3]"));
  }
  CHECK(e.pending_ops() == pending && x->node_uses == 0);
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A rule's parameter is an enumerator of its family's enum: read as another family's, it
// throws; the properties the device layer reads are flags, and explain gets it as written.
// The typed dimension numbers print StableHLO's pretty form: empty gather/scatter lists left out.
void test_dimension_numbers_print_as_stablehlo() {
  GatherDimensionNumbers gather{.collapsed_slice_dims = {0}, .start_index_map = {0}, .index_vector_dim = 2};
  CHECK(gather.attribute() == "#stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 2>");
  GatherDimensionNumbers axis{{0, 2}, {1}, {1}, 1};
  CHECK(axis.attribute() ==
        "#stablehlo.gather<offset_dims = [0, 2], collapsed_slice_dims = [1], start_index_map = [1], index_vector_dim = 1>");
  ScatterDimensionNumbers scatter{.inserted_window_dims = {0}, .scatter_dims_to_operand_dims = {0}, .index_vector_dim = 1};
  CHECK(scatter.attribute() ==
        "#stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>");
  DotDimensionNumbers dot{{}, {}, {1}, {0}};
  CHECK(dot.attribute() == "#stablehlo.dot<lhs_batching_dimensions = [], rhs_batching_dimensions = [], "
                           "lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>");
  ConvDimensionNumbers conv2d{.input_spatial_dimensions = {2, 3}, .kernel_spatial_dimensions = {2, 3},
                              .output_spatial_dimensions = {2, 3}};
  CHECK(conv2d.attribute() == "#stablehlo.conv<[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]>");
  ConvDimensionNumbers swapped{1, 0, {2}, 0, 1, {2}, 1, 0, {2}};  // conv.cpp's weight gradient
  CHECK(swapped.attribute() == "#stablehlo.conv<[f, b, 0]x[i, o, 0]->[f, b, 0]>");
  // Channels last (NWC input and output, WIO kernel): roles anywhere, spatial dims by index.
  ConvDimensionNumbers nwc{0, 2, {1}, 1, 2, {0}, 0, 2, {1}};
  CHECK(nwc.attribute() == "#stablehlo.conv<[b, 0, f]x[0, i, o]->[b, 0, f]>");
}

void test_rule_parameters_are_typed() {
  const LoweringRule* add = find_lowering("aten::add.Tensor");
  CHECK(add && add->param.is<Hlo>() && add->param.as<Hlo>() == Hlo::Add);
  CHECK(std::strcmp(add->param_text, "Hlo::Add") == 0);
  CHECK(contains(error_of([&] { add->param.as<Cmp>(); }), "parameter of another family"));
  const LoweringRule* lt = find_lowering("aten::lt.Tensor");
  CHECK(lt && lt->param.as<Cmp>() == Cmp::LT && std::strcmp(lt->param_text, "Cmp::LT") == 0);
  const LoweringRule* pool = find_lowering("aten::max_pool3d_with_indices");
  CHECK(pool && pool->param.as<int>() == 3);
  const LoweringRule* clone = find_lowering("aten::clone");
  CHECK(clone && clone->identity && clone->param.empty() && *clone->param_text == '\0');
  const LoweringRule* cholesky = find_lowering("aten::cholesky");
  CHECK(cholesky && cholesky->float32_or_float64 && !add->float32_or_float64 && !add->identity);
  CHECK(std::strcmp(hlo_name(Hlo::Add), "stablehlo.add") == 0 && std::strcmp(hlo_name(Hlo::ChloSinh), "chlo.sinh") == 0);
}

// binary / compare / select check their operands' types at the rule, naming the op.
void test_elementwise_operands_are_checked() {
  LoweringContext ctx;
  V a = ctx.parameter("%a", TensorType{{2, 3}, DType::Float32});
  V b = ctx.parameter("%b", TensorType{{2, 3}, DType::Int32});
  V c = ctx.parameter("%c", TensorType{{3}, DType::Float32});
  V p = ctx.parameter("%p", TensorType{{2, 3}, DType::Bool});
  CHECK(contains(error_of([&] { ctx.binary(Hlo::Add, a, b); }),
                 "stablehlo.add takes operands of one type, got tensor<2x3xf32> and tensor<2x3xi32>"));
  CHECK(contains(error_of([&] { ctx.compare(Cmp::LT, a, c); }), "stablehlo.compare takes operands of one type"));
  CHECK(contains(error_of([&] { ctx.select(a, a, a); }), "stablehlo.select takes a bool predicate"));
  CHECK(contains(error_of([&] { ctx.select(p, a, b); }), "stablehlo.select takes operands of one type"));
  CHECK(ctx.body().empty());  // nothing emitted by the refused calls
  V sum = ctx.binary(Hlo::Add, a, a);
  ctx.compare(Cmp::GE, sum, a);
  CHECK(contains(ctx.body(), "= \"stablehlo.add\"(%a, %a) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>"));
  CHECK(contains(ctx.body(), "comparison_direction = #stablehlo<comparison_direction GE>"));
}

// A graph that fails to compile leaves every pending value pending; the op at fault is
// found by compiling suspects alone, its values fail with its error, the rest compute,
// and recording it again raises at once.
void test_a_failed_compile_is_a_transaction(FakeRuntime& rt) {
  Engine& e = Engine::get();
  e.clear_memory_cache();
  ValuePtr x = input(rt, kMatrix), y = input(rt, kMatrix);
  auto add = [&](const ValuePtr& a, const ValuePtr& b) {
    return e.record(op("aten::add.Tensor"), {Arg::tensor(0), Arg::tensor(1), Arg::integer(1)}, {a, b}, {kMatrix}, 0)[0];
  };
  auto exp = [&](const ValuePtr& a) { return e.record(op("aten::exp"), {Arg::tensor(0)}, {a}, {kMatrix}, 0)[0]; };
  ValuePtr good = add(x, y);
  ValuePtr bad = exp(x);
  ValuePtr tainted = add(good, bad);
  rt.reject = "stablehlo.exponential";
  std::string first = error_of([&] { e.materialize(good); });
  CHECK(contains(first, "aten::exp cannot run on tpu") && contains(first, "fake compiler rejects"));
  CHECK(good->pending() && bad->pending() && tainted->pending());  // nothing was lost
  CHECK(e.materialize(good) != nullptr);                          // computed without the bad op
  CHECK(error_of([&] { e.materialize(bad); }) == first);
  CHECK(error_of([&] { e.materialize(tainted); }) == first);
  CHECK(error_of([&] { exp(y); }) == first);     // raised at the op from now on
  CHECK(error_of([&] { add(bad, y); }) == first);  // and by ops reading a failed value
  rt.reject.clear();
}

// A graph that fails to run (out of memory) stays pending and runs once memory allows; a
// donated argument the failed execution consumed makes the values that need it fail.
void test_a_failed_run_is_a_transaction(FakeRuntime& rt) {
  Engine& e = Engine::get();
  ValuePtr x = input(rt, kMatrix), y = input(rt, kMatrix);
  ValuePtr kept = e.record(op("aten::mul.Scalar"), {Arg::tensor(0), Arg::real(3.0, true)}, {x}, {kMatrix}, 0)[0];
  rt.fail_next_execute = true;
  CHECK(contains(error_of([&] { e.materialize(kept); }), "out of memory"));
  CHECK(kept->pending());
  static_cast<FakeBuffer&>(*x->buffer).deleted = false;  // x was not donated (the test holds it)
  CHECK(e.materialize(kept) != nullptr);
  ValuePtr lost = e.record(op("aten::mul.Scalar"), {Arg::tensor(0), Arg::real(5.0, true)}, {y}, {kMatrix}, 0)[0];
  y.reset();  // only the node holds y: donated to `lost`
  rt.fail_next_execute = true;
  CHECK(contains(error_of([&] { e.materialize(lost); }), "out of memory"));
  CHECK(contains(error_of([&] { e.materialize(lost); }), "out of memory"));  // its input is gone
}

// An op whose result cannot fit in the device's memory raises at the op.
void test_a_result_larger_than_the_device_raises_at_the_op(FakeRuntime& rt) {
  Engine& e = Engine::get();
  ValuePtr x = input(rt, kMatrix);
  e.set_memory_fraction(0, 8.0 / static_cast<double>(rt.memory_limit_bytes));  // 8 bytes
  std::string message = error_of([&] {
    e.record(op("aten::mul.Scalar"), {Arg::tensor(0), Arg::real(7.0, true)}, {x}, {kMatrix}, 0);
  });
  e.set_memory_fraction(0, 1.0);
  CHECK(contains(message, "tpu out of memory. Tried to allocate 24 bytes for a result of aten::mul.Scalar"));
  CHECK(error_of([&] { e.set_memory_fraction(0, 1.5); }) != "");
}

// Records the spans the engine opens (name, attributes, nesting depth) while enabled.
class FakeTracer final : public Tracer {
 public:
  struct Span {
    std::string name;
    std::vector<TraceAttribute> attributes;
    int depth = 0;
    std::string text(const std::string& key) const {
      for (const auto& a : attributes)
        if (a.name == key) {
          if (auto* s = std::get_if<std::string>(&a.value)) return *s;
          if (auto* i = std::get_if<int64_t>(&a.value)) return std::to_string(*i);
        }
      return "<none>";
    }
  };
  bool on = false;
  int depth = 0;
  std::vector<Span> spans;
  bool enabled() const override { return on; }
  std::unique_ptr<TraceScope> begin(TraceEvent event) override {
    spans.push_back(Span{event.name, event.attributes, depth});
    return std::make_unique<Scope>(this);
  }

 private:
  struct Scope final : TraceScope {
    explicit Scope(FakeTracer* t) : tracer(t) { ++tracer->depth; }
    ~Scope() override { --tracer->depth; }
    FakeTracer* tracer;
  };
};

// A fused flush opens flush > (lower, compile#compiled, scalar upload, execute); the next
// one finds the executable in memory. A disabled tracer sees nothing.
void test_spans_of_a_flush(FakeRuntime& rt) {
  Engine& e = Engine::get();
  e.clear_memory_cache();
  FakeTracer tracer;
  install_tracer(&tracer);
  ValuePtr x = input(rt, kMatrix), y = input(rt, kMatrix);
  e.materialize(record_add_scale_sum(x, y, 1.5));  // disabled: no span, not even described
  CHECK(tracer.spans.empty());
  e.clear_memory_cache();
  tracer.on = true;
  e.materialize(record_add_scale_sum(x, y, 1.5));
  e.materialize(record_add_scale_sum(x, y, 2.5));
  e.sync(true, FlushReason::OptimizerStep);
  install_tracer(nullptr);
  std::vector<std::string> names;
  for (const auto& s : tracer.spans) names.push_back(s.name + "@" + std::to_string(s.depth));
  std::vector<std::string> expected = {
      "torchtpu::flush#observation@0", "torchtpu::lower@1", "torchtpu::compile#compiled@1",
      "torchtpu::transfer#to_device@1", "torchtpu::execute@1",
      "torchtpu::flush#observation@0", "torchtpu::compile#memory@1", "torchtpu::transfer#to_device@1",
      "torchtpu::execute@1", "torchtpu::wait@0"};
  CHECK(names == expected);
  if (names != expected)
    for (const auto& n : names) std::fprintf(stderr, "  span %s\n", n.c_str());
  if (names.size() != expected.size()) return;
  const auto& flush = tracer.spans[0];
  CHECK(flush.text("reason") == "observation" && flush.text("ops") == "3" && flush.text("outputs") == "1");
  const auto& compile = tracer.spans[2];
  CHECK(compile.text("cache") == "compiled" && compile.text("ops") == "3" && compile.text("graph").size() == 16);
  CHECK(tracer.spans[4].text("graph") == compile.text("graph"));  // execute names the same graph
  CHECK(tracer.spans[6].text("graph") == compile.text("graph"));  // so does the memory hit
  CHECK(tracer.spans[3].text("bytes") == "8" && tracer.spans[3].text("what") == "scalars");
  CHECK(tracer.spans[9].text("reason") == "optimizer_step");
}

void test_op_kinds_are_interned() {
  OpKind a = OpKind::intern("aten::add.Tensor"), b = OpKind::intern(std::string("aten::add.Tensor"));
  CHECK(a == b && a.id() == b.id() && a.id() > 0);
  CHECK(a.name() == "aten::add.Tensor");
  CHECK(find_lowering(a) == find_lowering("aten::add.Tensor"));
  CHECK(!find_lowering(OpKind::intern("test::no_such_op")));
  CHECK(OpKind().name() == "<no op>" && !OpKind());
}

// A shape bucket's structure (hash_node_structure) is blind to sizes - int arguments, int
// lists' values, output shapes - and sees everything else hash_node sees: complex scalars and
// a structured op's body included (the bucket hasher once had its own copy without them).
void test_structure_hash_is_hash_node_without_sizes() {
  auto node = [](std::vector<Arg> args, std::vector<int64_t> shape, uint64_t body_hash = 0) {
    Node n;
    n.op = OpKind::intern("aten::add.Tensor");
    n.args = std::move(args);
    n.outputs = {TensorType{std::move(shape), DType::Float32}};
    if (body_hash) {
      auto body = std::make_shared<Subgraph>();
      body->hash = body_hash;
      n.body = body;
    }
    return n;
  };
  auto ints = [](std::vector<int64_t> v) { Arg a; a.kind = Arg::Kind::IntList; a.ints = std::move(v); return a; };
  Node base = node({Arg::integer(3), ints({2, 3}), Arg::complex(1, 2)}, {2, 3});
  Node resized = node({Arg::integer(5), ints({4, 7}), Arg::complex(1, 2)}, {4, 7});
  CHECK(hash_node_structure(base) == hash_node_structure(resized));
  CHECK(hash_node(base) != hash_node(resized));
  CHECK(hash_node_structure(base) != hash_node_structure(node({Arg::integer(3), ints({2, 3}), Arg::complex(1, 3)}, {2, 3})));
  CHECK(hash_node_structure(base) != hash_node_structure(node({Arg::integer(3), ints({2, 3, 1}), Arg::complex(1, 2)}, {2, 3})));
  CHECK(hash_node_structure(base) != hash_node_structure(node({Arg::integer(3), ints({2, 3}), Arg::complex(1, 2)}, {2, 3, 1})));
  CHECK(hash_node_structure(node({}, {2}, 11)) != hash_node_structure(node({}, {2}, 12)));
}


// A buffer also held outside torchtpu (a jax.Array) is never donated: donating would delete
// the other holder's array.
void test_shared_buffer_is_not_donated(FakeRuntime& rt) {
  Engine& e = Engine::get();
  e.reset_metrics();
  ValuePtr x = input(rt, kMatrix);
  x->buffer->shared_outside = true;
  ValuePtr y = e.record(op("aten::mul.Scalar"), {Arg::tensor(0), Arg::real(3.0, true)}, {x}, {kMatrix}, 0)[0];
  std::weak_ptr<DeviceBuffer> x_buffer = x->buffer;
  x.reset();
  e.materialize(y);
  CHECK(!contains(rt.compiled.back(), "tf.aliasing_output"));
  CHECK(e.metrics().donated_buffers == 0);
}

// What jax.jit(f).lower(...).as_text() looks like: a public @main calling a private
// function, a custom call whose target is a symbol that is not a function, and strings
// holding '@', braces and quotes.
const char* kJaxModule = R"(module @jit_f attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x3xf32> {mhlo.layout_mode = "{default}"}, %arg1: tensor<i64>) -> (tensor<2x3xf32> {jax.result_info = "result[0]"}, tensor<3xi1> {jax.result_info = "result[1]"}) {
    %0 = call @helper(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %1 = stablehlo.custom_call @target_fn(%0) {backend_config = "@helper \"}{\""} : (tensor<2x3xf32>) -> tensor<3xi1>
    return %0, %1 : tensor<2x3xf32>, tensor<3xi1>
  }
  func.func private @helper(%arg0: tensor<2x3xf32>) -> tensor<2x3xf32> {
    %0 = stablehlo.add %arg0, %arg0 : tensor<2x3xf32>
    return %0 : tensor<2x3xf32>
  }
}
)";

void test_imported_module_is_renamed_and_private() {
  ImportedModule m = import_module(kJaxModule, "k1_");
  CHECK(m.entry == "k1_main");
  CHECK(m.arguments.size() == 2 && m.arguments[0] == kMatrix && m.arguments[1] == (TensorType{{}, DType::Int64}));
  CHECK(m.results.size() == 2 && m.results[1] == (TensorType{{3}, DType::Bool}));
  CHECK(contains(m.definitions, "func.func private @\"k1_main\"(%arg0: tensor<2x3xf32>"));
  CHECK(contains(m.definitions, "func.func private @\"k1_helper\"(%arg0"));
  CHECK(contains(m.definitions, "call @\"k1_helper\"(%arg0)"));
  CHECK(contains(m.definitions, "custom_call @target_fn(%0)"));             // not a function: kept
  CHECK(contains(m.definitions, "backend_config = \"@helper \\\"}{\\\"\""));  // strings untouched
  CHECK(!contains(m.definitions, "public") && !contains(m.definitions, "module"));
  // A single unparenthesized result type.
  ImportedModule single = import_module(
      "module {\n  func.func @main(%a: tensor<4xbf16>) -> tensor<4xbf16> {\n    return %a : tensor<4xbf16>\n  }\n}\n", "k2_");
  CHECK(single.results.size() == 1 && single.results[0] == (TensorType{{4}, DType::BFloat16}));
  CHECK(contains(single.definitions, "func.func private @\"k2_main\"(%a"));
}

std::string import_error(const std::string& text) {
  try {
    import_module(text, "p_");
  } catch (const std::invalid_argument& err) {
    return err.what();
  }
  return "";
}

void test_unimportable_modules_are_named() {
  CHECK(contains(import_error("module {\n  sdy.mesh @mesh = <[\"x\"=2]>\n  func.func @main() -> tensor<f32> {\n  }\n}"),
                 "top-level sdy.mesh"));
  CHECK(contains(import_error("module {\n  func.func @main(%a: tensor<?xf32>) -> tensor<f32> {\n  }\n}"),
                 "dynamic dimension"));
  CHECK(contains(import_error("module {\n  func.func @main(%a: tensor<2xui32>) -> tensor<f32> {\n  }\n}"),
                 "element type ui32"));
  CHECK(contains(import_error("module {\n  func.func @main(%a: !stablehlo.token) -> tensor<f32> {\n  }\n}"),
                 "of type !stablehlo.token"));
  CHECK(contains(import_error("module {\n  func.func @f() -> tensor<f32> {\n  }\n}"), "no @main"));
  CHECK(contains(import_error("#loc = loc(unknown)\nmodule {\n}"), "attribute aliases"));
}

// Two calls of one registered module in a graph: its functions are defined once, each node
// is a func.call of the renamed @main.
void test_stablehlo_calls_are_inlined_once(FakeRuntime& rt) {
  Engine& e = Engine::get();
  std::string key = register_stablehlo_module("my f", kJaxModule);
  CHECK(key.rfind("my_f_", 0) == 0 && key.size() == 5 + 16);
  CHECK(register_stablehlo_module("my f", kJaxModule) == key);  // same text, same key
  ValuePtr x = input(rt, kMatrix);
  ValuePtr n = input(rt, TensorType{{}, DType::Int64});
  Arg inputs;
  inputs.kind = Arg::Kind::TensorList;
  inputs.operands = {0, 1};
  Arg name;
  name.kind = Arg::Kind::String;
  name.s = key;
  const ImportedModule& m = registered_stablehlo_module(key);
  OpKind call = op(kCallStablehlo);
  std::vector<ValuePtr> first = e.record(call, {inputs, name}, {x, n}, m.results, 0);
  std::vector<ValuePtr> second = e.record(call, {inputs, name}, {first[0], n}, m.results, 0);
  e.materialize(second[1]);
  const std::string& text = rt.compiled.back();
  size_t definition = text.find("func.func private @\"" + key + "_main\"");
  CHECK(definition != std::string::npos && text.find("func.func private @\"" + key + "_main\"", definition + 1) == std::string::npos);
  CHECK(definition > text.find("\"func.return\""));  // defined after @main, inside the module
  CHECK(contains(text, "= \"func.call\"(%arg0, %arg1) {callee = @\"" + key + "_main\"} : (tensor<2x3xf32>, tensor<i64>) -> (tensor<2x3xf32>, tensor<3xi1>)"));
  CHECK(contains(text, "= \"func.call\"(%0#0, %arg1) {callee = @\"" + key + "_main\"}"));
}

MeshPtr mesh_of(std::vector<int> devices) {
  auto mesh = std::make_shared<Mesh>();
  mesh->shape = {static_cast<int64_t>(devices.size())};
  mesh->axis_names = {"data"};
  mesh->devices = std::move(devices);
  return mesh;
}

// A (4, 2) mesh, ("data", None) on a [10, 3] tensor: rows in 4 pieces, 2 copies of each.
void test_sharding_text_and_shard_bounds() {
  auto mesh = std::make_shared<Mesh>(Mesh{{0, 1, 2, 3, 4, 5, 6, 7}, {4, 2}, {"data", "model"}});
  Sharding s;
  s.mesh = mesh;
  s.tiles = {4, 1};
  s.replicas = 2;
  s.tile_assignment = {0, 1, 2, 3, 4, 5, 6, 7};
  s.validate(2);
  CHECK(s.hlo() == "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}");
  CHECK(mesh->describe() == "mesh (4, 2) ('data', 'model') over tpu:0..7");
  // ceil(10 / 4) = 3 rows per piece: partitions 6 and 7 hold the last row only.
  CHECK((s.shard_bounds({10, 3}, 0) == std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {0, 3}}));
  CHECK((s.shard_bounds({10, 3}, 3) == std::vector<std::pair<int64_t, int64_t>>{{3, 3}, {0, 3}}));
  CHECK((s.shard_shape({10, 3}, 7) == std::vector<int64_t>{1, 3}));
  CHECK(Sharding::replicated(mesh, 2).hlo() == "{replicated}");
  CHECK(!(s == Sharding::replicated(mesh, 2)));
  Sharding wrong = s;
  wrong.replicas = 1;  // 4 tiles for 8 devices
  bool raised = false;
  try {
    wrong.validate(2);
  } catch (const std::invalid_argument& e) {
    raised = contains(e.what(), "do not cover the 8 devices");
  }
  CHECK(raised);
}

ValuePtr sharded_input(FakeRuntime& rt, const MeshPtr& mesh, const TensorType& type) {
  auto sharding = std::make_shared<Sharding>();
  sharding->mesh = mesh;
  sharding->tiles.assign(type.shape.size(), 1);
  sharding->tiles[0] = static_cast<int64_t>(mesh->devices.size());
  for (size_t p = 0; p < mesh->devices.size(); ++p) sharding->tile_assignment.push_back(static_cast<int>(p));
  std::vector<BufferPtr> shards;
  for (size_t p = 0; p < mesh->devices.size(); ++p) {
    TensorType piece{sharding->shard_shape(type.shape, static_cast<int>(p)), type.dtype};
    std::vector<float> data(piece.numel(), 1.0f);
    shards.push_back(rt.upload_bytes(data.data(), piece, mesh->devices[p]));
  }
  return Engine::get().from_buffer(rt.assemble_sharded(type, sharding, shards));
}

// Values on a mesh compile to one partitioned module: arguments carry their layout, a value
// of one device and the scalar packs arrive replicated, a donated parameter's result keeps
// its layout; values of the device alone compile apart, without partitions.
void test_mesh_values_compile_to_one_partitioned_module(FakeRuntime& rt) {
  Engine& e = Engine::get();
  e.set_mode(Mode::Fused);
  MeshPtr mesh = mesh_of({0, 1});
  TensorType matrix{{4, 3}, DType::Float32};
  ValuePtr x = sharded_input(rt, mesh, matrix);
  ValuePtr y = input(rt, matrix);  // tpu:0 alone
  CHECK(x->mesh == mesh && !y->mesh);
  ValuePtr sum = e.record(op("aten::add.Tensor"), {Arg::tensor(0), Arg::tensor(1), Arg::integer(1)}, {x, y},
                          {matrix}, 0)[0];
  ValuePtr scaled = e.record(op("aten::mul.Scalar"), {Arg::tensor(0), Arg::real(0.25, /*lifted=*/true)}, {sum},
                             {matrix}, 0)[0];
  ValuePtr alone = e.record(op("aten::mul.Scalar"), {Arg::tensor(0), Arg::real(0.5, /*lifted=*/true)}, {y},
                            {matrix}, 0)[0];
  CHECK(scaled->mesh == mesh && !alone->mesh);
  x.reset();  // nothing else holds it: donated
  sum.reset();  // an intermediate
  size_t before = rt.compiled.size();
  e.sync(false);
  CHECK(rt.compiled.size() == before + 2);
  const std::string& partitioned = rt.compiled[before];  // meshes first
  CHECK(rt.compile_options[before].mesh == mesh);
  CHECK(rt.compile_options[before].fixed_result_layouts == std::vector<bool>{true});  // the donated one
  CHECK(contains(partitioned, "mhlo.num_partitions = 2 : i32"));
  CHECK(contains(partitioned, "%arg0: tensor<4x3xf32> {tf.aliasing_output = 0 : i32, mhlo.sharding = \"{devices=[2,1]0,1}\"}"));
  CHECK(contains(partitioned, "%arg1: tensor<4x3xf32> {mhlo.sharding = \"{replicated}\"}"));
  CHECK(contains(partitioned, "%scalars_f: tensor<1xf64> {mhlo.sharding = \"{replicated}\"}"));
  CHECK(contains(partitioned, "-> (tensor<4x3xf32> {mhlo.sharding = \"{devices=[2,1]0,1}\"})"));
  const std::string& single = rt.compiled[before + 1];
  CHECK(!rt.compile_options[before + 1].mesh);
  CHECK(contains(single, "mhlo.num_partitions = 1 : i32") && !contains(single, "mhlo.sharding"));
  CHECK(scaled->buffer && scaled->buffer->sharding && alone->buffer && !alone->buffer->sharding);
}

void test_values_of_two_meshes_raise(FakeRuntime& rt) {
  Engine& e = Engine::get();
  TensorType matrix{{4, 3}, DType::Float32};
  ValuePtr a = sharded_input(rt, mesh_of({0, 1}), matrix);
  ValuePtr b = sharded_input(rt, mesh_of({0, 2}), matrix);
  std::string message;
  try {
    e.record(op("aten::add.Tensor"), {Arg::tensor(0), Arg::tensor(1), Arg::integer(1)}, {a, b}, {matrix}, 0);
  } catch (const std::invalid_argument& err) {
    message = err.what();
  }
  CHECK(contains(message, "two meshes, mesh (2,) ('data',) over tpu:0..1 and mesh (2,) ('data',) over tpu:0,2"));
}

// A graph's positions index: inline up to 8 entries, a table beyond, the same answers both ways
// (a fused graph of hundreds of nodes and a strict graph of one use it).
void test_pointer_index_inline_and_table() {
  std::vector<int> items(100);
  PointerIndex<int> index;
  for (int i = 0; i < 100; ++i) {
    CHECK(index.emplace(&items[i], i));
    CHECK(!index.emplace(&items[i], -1));  // present: kept as it was
    if (i == 7 || i == 8 || i == 99) {     // the last inline entry, the first in the table, many
      for (int k = 0; k <= i; ++k) CHECK(index.count(&items[k]) == 1 && index.at(&items[k]) == k);
      CHECK(index.size() == static_cast<size_t>(i + 1));
    }
  }
  int absent = 0;
  CHECK(index.find(&absent) == index.end() && index.count(&absent) == 0);
  bool threw = false;
  try {
    index.at(&absent);
  } catch (const std::out_of_range&) {
    threw = true;
  }
  CHECK(threw);
  index[&absent] = 7;
  CHECK(index.find(&absent)->second == 7);
  index.clear();
  CHECK(index.size() == 0 && index.count(&items[0]) == 0);
  index[&items[3]] = 3;
  CHECK(index.at(&items[3]) == 3 && index.size() == 1);
}

}  // namespace

int main() {
  auto* rt = new FakeRuntime();  // installed for the process, never destroyed
  install_runtime(rt);
  try {
    test_op_kinds_are_interned();
    test_pointer_index_inline_and_table();
    test_structure_hash_is_hash_node_without_sizes();
    test_fused_graph_is_lowered_once_and_cached(*rt);
    test_unheld_parameter_is_donated(*rt);
    test_platform_without_f64_lifts_f32_scalars(*rt);
    test_strict_mode_runs_each_op_at_once(*rt);
    test_wrong_output_type_is_reported(*rt);
    test_rule_parameters_are_typed();
    test_dimension_numbers_print_as_stablehlo();
    test_elementwise_operands_are_checked();
    test_shared_buffer_is_not_donated(*rt);
    test_imported_module_is_renamed_and_private();
    test_unimportable_modules_are_named();
    test_stablehlo_calls_are_inlined_once(*rt);
    test_spans_of_a_flush(*rt);
    test_a_failed_compile_is_a_transaction(*rt);
    test_a_failed_run_is_a_transaction(*rt);
    test_a_result_larger_than_the_device_raises_at_the_op(*rt);
    test_sharding_text_and_shard_bounds();
    test_mesh_values_compile_to_one_partitioned_module(*rt);
    test_values_of_two_meshes_raise(*rt);
  } catch (const std::exception& err) {
    std::fprintf(stderr, "unexpected exception: %s\n", err.what());
    return 1;
  }
  std::printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
