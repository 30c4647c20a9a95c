// Collectives across the processes of a job (torch.distributed's tpu backend): StableHLO
// all_reduce, all_gather, reduce_scatter, all_to_all and collective_permute.
//
// Every collective node's last argument lists the global device ids of its replicas in
// replica order (a process group's devices in group-rank order); the engine compiles a graph
// holding collectives for those replicas. Collectives are emitted in cross-replica mode
// (no channel_handle): jaxlib 0.10 reads all_to_all and collective_permute with a channel
// handle as cross-partition ops, and one module mixing both forms crashed the process.
#include "lowering/collective.h"

#include "lowering/common.h"

namespace torchtpu {
namespace {

// c10d::ReduceOp::RedOpType codes.
enum ReduceOp : int64_t { kSum = 0, kAvg = 1, kProduct = 2, kMin = 3, kMax = 4, kBand = 5, kBor = 6, kBxor = 7 };

int64_t replica_count(const Node& node) { return static_cast<int64_t>(node.args.back().ints.size()); }

// replica_groups = [[0, 1, ..., n-1]]: the whole replica set is one group.
std::string replica_groups(int64_t n) {
  std::vector<int64_t> all(n);
  for (int64_t i = 0; i < n; ++i) all[i] = i;
  return "replica_groups = dense<[" + format_list(all) + "]> : tensor<1x" + std::to_string(n) + "xi64>";
}

Hlo combiner(int64_t op, DType dtype) {
  switch (op) {
    case kSum: case kAvg: return dtype == DType::Bool ? Hlo::Or : Hlo::Add;
    case kProduct: return dtype == DType::Bool ? Hlo::And : Hlo::Multiply;
    case kMin: return Hlo::Minimum;
    case kMax: return Hlo::Maximum;
    case kBand: return Hlo::And;
    case kBor: return Hlo::Or;
    case kBxor: return Hlo::Xor;
  }
  throw std::invalid_argument("torchtpu: reduce op " + std::to_string(op) + " is not supported on tpu");
}

std::string combine_region(LoweringContext& ctx, int64_t op, DType dtype) {
  TensorType scalar{{}, dtype};
  return ctx.region({scalar, scalar}, [&](const std::vector<V>& args) {
    return std::vector<V>{ctx.binary(combiner(op, dtype), args[0], args[1])};
  });
}

// Each process compiles its own program and the programs may differ (a rank that prints
// its loss flushes earlier than the others), while XLA assumes one program for all replicas.
// Two consequences are handled here, for every collective's operand:
// - Order. XLA may schedule independent collectives in any order, and two ranks' programs
//   could then issue them in different orders (collectives pair up by order: a hang). The
//   operand is made to depend on the module's previous collective through a value that is
//   always +0.0 but that XLA cannot prove so: select(is_finite(t), |t * 0|, 0) with t an
//   element of the previous result (XLA keeps float multiplications by zero, which are NaN
//   for infinities). x - (+0.0) == x for every value, signed zeros and NaNs included.
// - Replication. XLA folds a collective whose operand it proves equal on all replicas
//   (all_reduce of a constant c becomes c * n), wrong when the ranks' constants differ.
//   An optimization barrier hides the operand's origin.
V hidden_zero(LoweringContext& ctx, const V& previous) {
  V first = ctx.reshape(ctx.slice(ctx.reshape(previous, {previous.type.numel()}), {0}, {1}, {1}), {});
  V t = ctx.convert(first, DType::Float32);
  V zero = ctx.constant(0.0, DType::Float32);
  V product = ctx.unary(Hlo::Abs, ctx.binary(Hlo::Multiply, t, zero));
  V finite = ctx.emit(Hlo::IsFinite, {t}, TensorType{{}, DType::Bool});
  return ctx.select(finite, product, zero);
}

V ordered_operand(LoweringContext& ctx, const V& x) {
  V operand = x;
  const V& previous = ctx.last_collective();
  if (!previous.name.empty() && x.type.numel() > 0) {
    DType arithmetic = x.type.dtype == DType::Bool ? DType::UInt8 : x.type.dtype;
    V zero = ctx.broadcast_to(ctx.convert(hidden_zero(ctx, previous), arithmetic), x.type.shape);
    operand = ctx.convert(ctx.binary(Hlo::Subtract, ctx.convert(x, arithmetic), zero), x.type.dtype);
  }
  return ctx.emit(Hlo::OptimizationBarrier, {operand}, operand.type);
}

// Emits a collective and records it as the module's latest (one with elements).
V emit_collective(LoweringContext& ctx, Hlo op, const V& operand, const TensorType& result,
                  const std::string& attrs, const std::string& regions = "") {
  V out = ctx.emit(op, {ordered_operand(ctx, operand)}, result, attrs, regions);
  if (result.numel() > 0) ctx.set_last_collective(out);
  return out;
}

// AVG is a sum divided by the replica count (integers truncate, as NCCL's average does).
V finish_average(LoweringContext& ctx, int64_t op, const V& sum, int64_t n) {
  if (op != kAvg) return sum;
  return ctx.binary(Hlo::Divide, sum, ctx.constant_int(n, sum.type.dtype, sum.type.shape));
}

// ---- the cross-rank check -----------------------------------------------------------------
// Ranks that issue different collectives (other shapes, dtypes or ops) would corrupt memory
// or hang inside the transport. With checks on (the node has a second output), every rank
// first all-gathers the collective's descriptor and runs the collective only when all
// descriptors agree (else its result is zeros); the gathered descriptors are the node's
// second output, which the tpu backend verifies on the host (Engine::add_check).

V descriptor_constant(LoweringContext& ctx, const std::vector<int64_t>& d) {
  TensorType type{{1, kCollectiveDescriptorLength}, DType::Int64};
  return ctx.emit(Hlo::Constant, {}, type, "value = dense<[" + format_list(d) + "]> : " + type.mlir());
}

// Emits main() guarded by the check when the node asks for it; sets the node's results.
template <typename Main>
void lower_checked(LoweringContext& ctx, const Node& node, const std::vector<int64_t>& descriptor, Main main) {
  if (node.outputs.size() < 2) {
    ctx.set_result(main());
    return;
  }
  int64_t n = replica_count(node);
  V mine = descriptor_constant(ctx, descriptor);
  V gathered = emit_collective(ctx, Hlo::AllGather, mine, TensorType{{n, kCollectiveDescriptorLength}, DType::Int64},
                               "all_gather_dim = 0 : i64, " + replica_groups(n));
  V same = ctx.compare(Cmp::EQ, gathered, ctx.broadcast_to(mine, gathered.type.shape));
  V all_same = ctx.reduce(same, {0, 1}, ctx.constant(1, DType::Bool), Hlo::And);
  const TensorType& out = ctx.out(node);
  std::string run = ctx.region({}, [&](const std::vector<V>&) { return std::vector<V>{main()}; });
  std::string skip = ctx.region({}, [&](const std::vector<V>&) {
    return std::vector<V>{is_floating(out.dtype) ? ctx.constant(0.0, out.dtype, out.shape)
                                                 : ctx.constant_int(0, out.dtype, out.shape)};
  });
  V result = ctx.emit(Hlo::If, {all_same}, out, "", run + ", " + skip);
  if (out.numel() > 0) ctx.set_last_collective(result);  // the collective inside is not visible out here
  ctx.set_results({result, gathered});
}

// torchtpu::all_reduce(Tensor x, int op, int[] replica_devices)
void lower_all_reduce(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  int64_t op = node.args[1].i, n = replica_count(node);
  lower_checked(ctx, node, collective_descriptor(CollectiveKind::AllReduce, op, x.type), [&] {
    V sum = emit_collective(ctx, Hlo::AllReduce, x, x.type, replica_groups(n),
                            combine_region(ctx, op, x.type.dtype));
    return finish_average(ctx, op, sum, n);
  });
}

// torchtpu::all_gather(Tensor x, int[] replica_devices): the replicas' x concatenated on dim 0.
void lower_all_gather(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  lower_checked(ctx, node, collective_descriptor(CollectiveKind::AllGather, 0, x.type), [&] {
    return emit_collective(ctx, Hlo::AllGather, x, ctx.out(node),
                           "all_gather_dim = 0 : i64, " + replica_groups(replica_count(node)));
  });
}

// torchtpu::reduce_scatter(Tensor x, int op, int[] replica_devices): replica r gets block r
// (of dim 0) of the reduction.
void lower_reduce_scatter(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  int64_t op = node.args[1].i, n = replica_count(node);
  lower_checked(ctx, node, collective_descriptor(CollectiveKind::ReduceScatter, op, x.type), [&] {
    V sum = emit_collective(ctx, Hlo::ReduceScatter, x, ctx.out(node),
                            "scatter_dimension = 0 : i64, " + replica_groups(n), combine_region(ctx, op, x.type.dtype));
    return finish_average(ctx, op, sum, n);
  });
}

// torchtpu::all_to_all(Tensor x, int[] replica_devices): block j of dim 0 goes to replica j;
// the result holds the blocks received, in replica order.
void lower_all_to_all(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  int64_t n = replica_count(node);
  lower_checked(ctx, node, collective_descriptor(CollectiveKind::AllToAll, 0, x.type), [&] {
    return emit_collective(ctx, Hlo::AllToAll, x, x.type,
                           "split_dimension = 0 : i64, concat_dimension = 0 : i64, split_count = " +
                               std::to_string(n) + " : i64, " + replica_groups(n));
  });
}

// torchtpu::collective_permute(Tensor x, int[] pairs, int[] replica_devices): pairs is the
// flattened (source, target) replica list; a replica that is no target gets zeros.
void lower_collective_permute(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  const std::vector<int64_t>& pairs = node.args[1].ints;
  std::string list;
  for (size_t i = 0; i + 1 < pairs.size(); i += 2)
    list += std::string(i ? ", " : "") + "[" + std::to_string(pairs[i]) + ", " + std::to_string(pairs[i + 1]) + "]";
  lower_checked(ctx, node, collective_descriptor(CollectiveKind::Permute, 0, x.type), [&] {
    return emit_collective(ctx, Hlo::CollectivePermute, x, x.type,
                           "source_target_pairs = dense<[" + list + "]> : tensor<" +
                               std::to_string(pairs.size() / 2) + "x2xi64>");
  });
}

// torchtpu::broadcast(Tensor x, bool is_source, int[] replica_devices): the source's x on
// every replica. The others add -0.0 (0 for integers): x + -0.0 == x for every float,
// signed zeros and NaNs included, so the sum is the source's value bit for bit.
void lower_broadcast(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  bool is_source = node.args[1].i != 0;
  DType dtype = x.type.dtype;
  lower_checked(ctx, node, collective_descriptor(CollectiveKind::Broadcast, 0, x.type), [&] {
    V contribution = x;
    if (!is_source) contribution = is_floating(dtype) ? ctx.constant(-0.0, dtype, x.type.shape)
                                                      : ctx.constant_int(0, dtype, x.type.shape);
    return emit_collective(ctx, Hlo::AllReduce, contribution, x.type, replica_groups(replica_count(node)),
                           combine_region(ctx, kSum, dtype));
  });
}

LOWERING("torchtpu::all_reduce", lower_all_reduce, nullptr, RuleFlags{.collective = true});
LOWERING("torchtpu::all_gather", lower_all_gather, nullptr, RuleFlags{.collective = true});
LOWERING("torchtpu::reduce_scatter", lower_reduce_scatter, nullptr, RuleFlags{.collective = true});
LOWERING("torchtpu::all_to_all", lower_all_to_all, nullptr, RuleFlags{.collective = true});
LOWERING("torchtpu::collective_permute", lower_collective_permute, nullptr, RuleFlags{.collective = true});
LOWERING("torchtpu::broadcast_from", lower_broadcast, nullptr, RuleFlags{.collective = true});

}  // namespace

std::vector<int64_t> collective_descriptor(CollectiveKind kind, int64_t reduce_op, const TensorType& operand) {
  std::vector<int64_t> d(kCollectiveDescriptorLength, 0);
  d[0] = static_cast<int64_t>(kind);
  d[1] = reduce_op;
  d[2] = static_cast<int64_t>(operand.dtype);
  d[3] = operand.rank();
  d[4] = operand.numel();
  for (int64_t i = 0; i < std::min<int64_t>(operand.rank(), 3); ++i) d[5 + i] = operand.shape[i];
  return d;
}

std::string describe_collective(const int64_t* d) {
  static const char* kinds[] = {"?", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send/recv", "broadcast"};
  static const char* reduce_ops[] = {"sum", "avg", "product", "min", "max", "band", "bor", "bxor"};
  std::string s = d[0] >= 1 && d[0] <= 6 ? kinds[d[0]] : "?";
  s += " of a ";
  s += is_supported_dtype(static_cast<int>(d[2])) ? dtype_name(static_cast<DType>(d[2])) : "?";
  s += " tensor of shape [";
  for (int64_t i = 0; i < d[3]; ++i) s += (i ? ", " : "") + (i < 3 ? std::to_string(d[5 + i]) : std::string("..."));
  s += "] (" + std::to_string(d[4]) + " elements)";
  if (d[0] == static_cast<int64_t>(CollectiveKind::AllReduce) || d[0] == static_cast<int64_t>(CollectiveKind::ReduceScatter))
    s += std::string(", op ") + (d[1] >= 0 && d[1] < 8 ? reduce_ops[d[1]] : "?");
  return s;
}

}  // namespace torchtpu
