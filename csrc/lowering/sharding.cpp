// torchtpu::shard (see sharding.h): jax's with_sharding_constraint, as StableHLO.
#include "lowering/sharding.h"

#include "lowering/common.h"

namespace torchtpu {

std::vector<Arg> shard_args(const Sharding& sharding) {
  Arg tiles, assignment;
  tiles.kind = assignment.kind = Arg::Kind::IntList;
  tiles.ints = sharding.tiles;
  assignment.ints.assign(sharding.tile_assignment.begin(), sharding.tile_assignment.end());
  return {Arg::tensor(0), tiles, Arg::integer(sharding.replicas), assignment};
}

Sharding sharding_of_shard_node(const Node& node) {
  Sharding s;
  s.mesh = node.mesh;
  s.tiles = node.args[1].ints;
  s.replicas = node.args[2].i;
  s.tile_assignment.assign(node.args[3].ints.begin(), node.args[3].ints.end());
  s.validate(node.outputs[0].rank());
  return s;
}

bool is_shard_node(const Node& node) {
  static const OpKind kind = OpKind::intern(kShardOp);
  return node.op == kind;
}

namespace {

void lower_shard(LoweringContext& ctx, const Node& node) {
  std::string attrs = "call_target_name = \"Sharding\", mhlo.sharding = \"" + sharding_of_shard_node(node).hlo() + "\"";
  ctx.set_result(ctx.emit(Hlo::CustomCall, {ctx.input(node, 0)}, ctx.out(node), attrs));
}

LOWERING(kShardOp, lower_shard, nullptr, kTakesComplex);

}  // namespace
}  // namespace torchtpu
