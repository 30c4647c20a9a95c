// The "tpu" c10d backend: each collective becomes a graph node over the process group's
// devices (fused mode: a node of the pending graph, so a DDP step is one executable), and
// its result is stored into the user's tensor. Data never passes through the host.
#include "distributed/backend.h"

#include <sstream>

#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Utils.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/headeronly/version.h>
#include <torch/library.h>

#include "device/kernel_overrides.h"
#include "device/tensor.h"
#include "engine/engine.h"
#include "lowering/collective.h"
#include "lowering/registry.h"

namespace torchtpu {
namespace {

// c10d names that differ across the supported torch minors (one glue is built per minor).
// PREMUL_SUM's factor: NCCLPreMulSumSupplement until 2.12, PreMulSumSupplement from 2.13.
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 13
using PreMulSumSupplement = c10d::NCCLPreMulSumSupplement;
#else
using PreMulSumSupplement = c10d::PreMulSumSupplement;
#endif
// A Work's op type (informational: profiler names, error messages); 2.11 has no
// REDUCE_SCATTER_TENSOR_COALESCED and reports coalesced reduce-scatters as COALESCED.
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 12
constexpr c10d::OpType kReduceScatterTensorCoalesced = c10d::OpType::COALESCED;
#else
constexpr c10d::OpType kReduceScatterTensorCoalesced = c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED;
#endif

std::atomic<bool> g_collective_checks{true};

// c10d keeps a functional collective's Work (DTensor's, tensor parallel's) registered until
// wait_tensor() on its output, which DTensor leaves to the AsyncCollectiveTensor it returns.
// On tpu, functionalization (tpu tensors are functional wrappers) hands back a plain tensor
// instead, so nothing waited: the registry grew by one Work per collective (a leak over a
// training run) and PyTorch warned at exit of "unwaited collective calls". A tpu Work is
// complete when issued (its result is a pending graph value), so each one leaves the
// registry at the next collective, at shutdown() and at exit.
std::mutex g_issued_mutex;
std::vector<c10::weak_intrusive_ptr<c10d::Work>> g_issued;

c10::intrusive_ptr<c10d::Work> issue(c10::intrusive_ptr<c10d::Work> work) {
  release_collective_works();
  std::lock_guard<std::mutex> lock(g_issued_mutex);
  g_issued.emplace_back(work);
  return work;
}

const LoweringRule* collective_rule(const char* name) {
  const LoweringRule* rule = find_lowering(name);
  TORCH_INTERNAL_ASSERT(rule && rule->collective, "torchtpu: missing collective lowering ", name);
  return rule;
}

// A finished request: the results are (pending) values of the user's tensors, so any later
// use of them orders after the collective. Waiting blocks the host only for a barrier.
class TpuWork final : public c10d::Work {
 public:
  TpuWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, ValuePtr wait_for = nullptr)
      : c10d::Work(rank, type), outputs_(std::move(outputs)), wait_for_(std::move(wait_for)) {}

  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override {}

  bool wait(std::chrono::milliseconds) override {
    if (wait_for_) {
      BufferPtr buffer = Engine::get().materialize(wait_for_);
      runtime().wait(*buffer);
    }
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    if (!future_) {
      std::vector<c10::Device> devices;
      for (const at::Tensor& t : outputs_)
        if (is_tpu(t) && std::find(devices.begin(), devices.end(), t.device()) == devices.end())
          devices.push_back(t.device());
      future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
      future_->markCompleted(c10::IValue(outputs_));
    }
    return future_;
  }

 private:
  std::vector<at::Tensor> outputs_;
  ValuePtr wait_for_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class TpuBackend final : public c10d::Backend {
 public:
  TpuBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::vector<int64_t> replica_devices,
             std::chrono::milliseconds timeout)
      : c10d::Backend(rank, size), store_(std::move(store)), replica_devices_(std::move(replica_devices)),
        timeout_(timeout) {}

  const std::string getBackendName() const override { return "tpu"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                            const c10d::AllreduceOptions& opts) override {
    for (at::Tensor& t : tensors) store_into(t, all_reduce(t, opts.reduceOp));
    return work(c10d::OpType::ALLREDUCE, tensors);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceCoalescedOptions& opts) override {
    for (at::Tensor& t : tensors) store_into(t, all_reduce(t, opts.reduceOp));
    return work(c10d::OpType::ALLREDUCE_COALESCED, tensors);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                            const c10d::BroadcastOptions& opts) override {
    check_rank(opts.rootRank, "root rank");
    for (at::Tensor& t : tensors) store_into(t, broadcast_from(t, opts.rootRank));
    return work(c10d::OpType::BROADCAST, tensors);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    check_rank(opts.rootRank, "root rank");
    for (at::Tensor& t : tensors) {
      at::Tensor reduced = all_reduce(t, opts.reduceOp);
      if (getRank() == opts.rootRank) store_into(t, reduced);
    }
    return work(c10d::OpType::REDUCE, tensors);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                            std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) override {
    TORCH_CHECK(outputs.size() == inputs.size(), "torchtpu: allgather expects one output list per input tensor");
    std::vector<at::Tensor> all;
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_list(outputs[i], inputs[i], "output");
      at::Tensor gathered = all_gather_rows(inputs[i]);  // [size, numel]
      for (int r = 0; r < getSize(); ++r) store_into(outputs[i][r], gathered.select(0, r).view(inputs[i].sizes()));
      all.insert(all.end(), outputs[i].begin(), outputs[i].end());
    }
    return work(c10d::OpType::ALLGATHER, all);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                  const c10d::AllgatherOptions&) override {
    check_same_type(output, input, "output");
    TORCH_CHECK(output.numel() == input.numel() * getSize(),
                "output tensor size must be equal to world_size times input tensor size");
    store_into(output, all_gather_rows(input).view(output.sizes()));
    return work(c10d::OpType::_ALLGATHER_BASE, {output});
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                  std::vector<at::Tensor>& inputs,
                                                                  const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK(outputs.size() == inputs.size(), "torchtpu: expected as many outputs as inputs");
    for (size_t i = 0; i < inputs.size(); ++i) _allgather_base(outputs[i], inputs[i], opts);
    return work(c10d::OpType::COALESCED, outputs);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                         std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override {
    check_rank(opts.rootRank, "root rank");
    TORCH_CHECK(inputs.size() == 1, "torchtpu: gather takes one input tensor");
    at::Tensor gathered = all_gather_rows(inputs[0]);
    std::vector<at::Tensor> results;
    if (getRank() == opts.rootRank) {
      TORCH_CHECK(outputs.size() == 1, "torchtpu: gather on the root takes one output list");
      check_list(outputs[0], inputs[0], "gather output");
      for (int r = 0; r < getSize(); ++r) store_into(outputs[0][r], gathered.select(0, r).view(inputs[0].sizes()));
      results = outputs[0];
    }
    return work(c10d::OpType::GATHER, results);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                          std::vector<std::vector<at::Tensor>>& inputs,
                                          const c10d::ScatterOptions& opts) override {
    check_rank(opts.rootRank, "root rank");
    TORCH_CHECK(outputs.size() == 1, "torchtpu: scatter takes one output tensor");
    at::Tensor& out = outputs[0];
    // The root's list, stacked, is broadcast; each rank keeps its row (the others send only
    // a placeholder of the right type).
    at::Tensor stacked;
    if (getRank() == opts.rootRank) {
      TORCH_CHECK(inputs.size() == 1, "torchtpu: scatter on the root takes one input list");
      check_list(inputs[0], out, "scatter input");
      stacked = at::stack(inputs[0]);
    } else {
      std::vector<int64_t> shape{getSize()};
      shape.insert(shape.end(), out.sizes().begin(), out.sizes().end());
      stacked = wrap_for_user(make_tensor(zeros_value(TensorType{shape, to_dtype(out.scalar_type())}, device_of(out))));
    }
    store_into(out, broadcast_from(stacked, opts.rootRank).select(0, getRank()));
    return work(c10d::OpType::SCATTER, outputs);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                 const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK(outputs.size() == inputs.size(), "torchtpu: reduce_scatter expects one input list per output");
    for (size_t i = 0; i < outputs.size(); ++i) {
      check_list(inputs[i], outputs[i], "input");
      at::Tensor rows = at::stack(inputs[i]).reshape({getSize(), -1});
      store_into(outputs[i], reduce_scatter_rows(rows, opts.reduceOp).view(outputs[i].sizes()));
    }
    return work(c10d::OpType::REDUCE_SCATTER, outputs);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts) override {
    check_same_type(input, output, "input");
    TORCH_CHECK(input.numel() == output.numel() * getSize(),
                "input tensor must be the same size as output size times world size");
    at::Tensor rows = input.reshape({getSize(), -1});
    store_into(output, reduce_scatter_rows(rows, opts.reduceOp).view(output.sizes()));
    return work(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                  std::vector<at::Tensor>& inputs,
                                                                  const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK(outputs.size() == inputs.size(), "torchtpu: expected as many outputs as inputs");
    for (size_t i = 0; i < inputs.size(); ++i) _reduce_scatter_base(outputs[i], inputs[i], opts);
    return work(kReduceScatterTensorCoalesced, outputs);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                std::vector<int64_t>& output_splits,
                                                std::vector<int64_t>& input_splits,
                                                const c10d::AllToAllOptions&) override {
    check_same_type(output, input, "output");
    TORCH_CHECK(input.dim() > 0 && output.dim() > 0, "torchtpu: all_to_all_single splits dim 0; got a 0-d tensor");
    c10d::checkSplitSizes(input_splits, input, getSize());
    c10d::checkSplitSizes(output_splits, output, getSize());
    if (input_splits.empty() && output_splits.empty()) {
      TORCH_CHECK(output.numel() == input.numel(), "torchtpu: all_to_all_single needs input and output of one size");
      at::Tensor rows = input.reshape({getSize(), -1});
      store_into(output, all_to_all_rows(rows).view(output.sizes()));
    } else {
      int64_t row = c10::multiply_integers(input.sizes().slice(1));
      TORCH_CHECK(c10::multiply_integers(output.sizes().slice(1)) == row,
                  "torchtpu: all_to_all_single needs input and output rows (dim 0 slices) of one size, got ",
                  input.sizes(), " and ", output.sizes());
      at::Tensor received = all_to_all_split(input.reshape({input.size(0), row}), splits_or_even(input_splits, input),
                                             splits_or_even(output_splits, output));
      if (received.defined()) store_into(output, received.view(output.sizes()));
    }
    return work(c10d::OpType::ALLTOALL_BASE, {output});
  }

  // Tensors of any shapes: their elements, flattened, travel as an all_to_all_single with
  // one split per tensor.
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllToAllOptions&) override {
    TORCH_CHECK(static_cast<int>(inputs.size()) == getSize() && outputs.size() == inputs.size(),
                "torchtpu: all_to_all takes one input and one output tensor per rank");
    std::vector<at::Tensor> flat;
    std::vector<int64_t> sent, received;
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_same_type(inputs[i], inputs[0], "input");
      check_same_type(outputs[i], inputs[0], "output");
      flat.push_back(inputs[i].reshape({-1, 1}));
      sent.push_back(inputs[i].numel());
      received.push_back(outputs[i].numel());
    }
    at::Tensor all = all_to_all_split(at::cat(flat), sent, received);
    int64_t offset = 0;
    for (at::Tensor& out : outputs) {
      if (all.defined()) store_into(out, all.narrow(0, offset, out.numel()).view(out.sizes()));
      offset += out.numel();
    }
    return work(c10d::OpType::ALLTOALL, outputs);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int) override {
    check_rank(dst, "destination rank");
    TORCH_CHECK(dst != getRank(), "Invalid destination rank: should not be the same as rank of the current process.");
    for (at::Tensor& t : tensors) permute_pair(t, getRank(), dst);  // runs even though nothing holds it
    return work(c10d::OpType::SEND, tensors);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int) override {
    check_rank(src, "source rank");
    TORCH_CHECK(src != getRank(), "Invalid source rank: should not be the same as rank of the current process.");
    for (at::Tensor& t : tensors) store_into(t, permute_pair(t, src, getRank()));
    return work(c10d::OpType::RECV, tensors);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    // Everything this rank issued runs first: a rank must never block on the host while a
    // collective another rank waits for is still pending here.
    Engine::get().sync(false);
    int device = current_device();
    at::Tensor token = wrap_for_user(make_tensor(zeros_value(TensorType{{1}, DType::Int32}, device)));
    at::Tensor reduced = all_reduce(token, c10d::ReduceOp::SUM);
    Engine::get().sync(false);
    return issue(c10::make_intrusive<TpuWork>(getRank(), c10d::OpType::BARRIER, std::vector<at::Tensor>{},
                                              value_of(reduced, device)));
  }

  // destroy_process_group(): this rank's pending collectives run first; another rank may be
  // waiting for them (a rank that read a result flushed its graph, this one may not have).
  void shutdown() override {
    Engine::get().sync(true);
    release_collective_works();
  }

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return sequence_; }

 private:
  int device_of(const at::Tensor& t) {
    TORCH_CHECK(is_tpu(t), "torchtpu: the tpu process-group backend got a ", t.device(), " tensor; "
                "use a backend string like \"cpu:gloo,tpu:tpu\" for collectives on other devices");
    return t.device().index();
  }

  void check_rank(int64_t rank, const char* what) {
    TORCH_CHECK(rank >= 0 && rank < getSize(), "Invalid ", what, " ", rank, " for a group of size ", getSize());
  }

  static void check_same_type(const at::Tensor& a, const at::Tensor& b, const char* what) {
    TORCH_CHECK(a.scalar_type() == b.scalar_type(), what, " tensor must have the same type as the input tensor (",
                a.scalar_type(), " vs ", b.scalar_type(), ")");
  }

  void check_list(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* what) {
    TORCH_CHECK(static_cast<int>(list.size()) == getSize(), "torchtpu: the ", what, " list must hold one tensor per rank (",
                getSize(), "), got ", list.size());
    for (const at::Tensor& t : list) {
      check_same_type(t, like, what);
      TORCH_CHECK(t.sizes() == like.sizes(), "torchtpu: every ", what, " tensor must have shape ", like.sizes(),
                  ", got ", t.sizes());
    }
  }

  std::vector<int64_t> splits_or_even(const std::vector<int64_t>& splits, const at::Tensor& t) const {
    return splits.empty() ? std::vector<int64_t>(getSize(), t.size(0) / getSize()) : splits;
  }

  // Records one collective node on the tensor's value; the result as a user tensor.
  at::Tensor record(const char* name, std::vector<Arg> args, const at::Tensor& input, const TensorType& out,
                    std::vector<int64_t> replicas = {}) {
    int device = device_of(input);
    // A one-process group's replica is the tensor's own device.
    if (replicas.empty()) replicas = getSize() == 1 ? std::vector<int64_t>{runtime().device_id(device)} : replica_devices_;
    std::vector<TensorType> outputs{out};
    // The cross-rank check (lowering/collective.cpp): a second output with every rank's
    // descriptor of this collective, verified on the host.
    int64_t replica_count = static_cast<int64_t>(replicas.size());
    bool checked = g_collective_checks.load() && replica_count > 1;
    if (checked) outputs.push_back(TensorType{{replica_count, kCollectiveDescriptorLength}, DType::Int64});
    std::vector<int> ranks = group_ranks_of(replicas);
    Arg devices;
    devices.kind = Arg::Kind::IntList;
    devices.ints = std::move(replicas);
    args.insert(args.begin(), Arg::tensor(0));
    args.push_back(std::move(devices));
    ++sequence_;
    std::vector<ValuePtr> results =
        Engine::get().record(collective_rule(name)->kind, std::move(args), {value_of(input, device)}, outputs, device);
    if (checked) Engine::get().add_check(results[1], mismatch_reporter(ranks, sequence_));
    return wrap_for_user(make_tensor(results[0]));
  }

  // Group ranks of the replicas (a send/recv pair's two, or the whole group).
  std::vector<int> group_ranks_of(const std::vector<int64_t>& devices) const {
    std::vector<int> ranks;
    for (int64_t id : devices) {
      auto it = std::find(replica_devices_.begin(), replica_devices_.end(), id);
      ranks.push_back(it == replica_devices_.end() ? getRank() : static_cast<int>(it - replica_devices_.begin()));
    }
    return ranks;
  }

  // Names the ranks whose descriptor differs from this rank's.
  std::function<std::string(const std::vector<int64_t>&)> mismatch_reporter(std::vector<int> ranks, uint64_t index) {
    int me = getRank();
    return [ranks, index, me](const std::vector<int64_t>& rows) -> std::string {
      const int64_t* mine = nullptr;
      for (size_t r = 0; r < ranks.size(); ++r)
        if (ranks[r] == me) mine = rows.data() + r * kCollectiveDescriptorLength;
      std::string differ;
      for (size_t r = 0; r < ranks.size(); ++r) {
        const int64_t* theirs = rows.data() + r * kCollectiveDescriptorLength;
        if (mine && !std::equal(theirs, theirs + kCollectiveDescriptorLength, mine))
          differ += "; rank " + std::to_string(ranks[r]) + " issued " + describe_collective(theirs);
      }
      if (differ.empty()) return "";
      return "torchtpu: collective #" + std::to_string(index) + " of this process group does not match across ranks: "
             "rank " + std::to_string(me) + " issued " + describe_collective(mine) + differ +
             ". Every rank must issue the same collectives, with the same shapes and dtypes, in the same order. "
             "The collective was skipped (its result is zeros).";
    };
  }

  static int64_t reduce_code(const c10d::ReduceOp& op, const at::Tensor& t) {
    bool bitwise = op.op_ == c10d::ReduceOp::BAND || op.op_ == c10d::ReduceOp::BOR || op.op_ == c10d::ReduceOp::BXOR;
    TORCH_CHECK(!bitwise || !at::isFloatingType(t.scalar_type()),
                "Cannot use bitwise ReduceOps (BAND, BOR, BXOR) with floating point inputs");
    return static_cast<int64_t>(op.op_ == c10d::ReduceOp::PREMUL_SUM ? c10d::ReduceOp::SUM : op.op_);
  }

  // PREMUL_SUM (FSDP's gradient pre-division): each rank's tensor times the factor, in the
  // tensor's dtype as NCCL does, then summed. Other ops: the tensor itself.
  static at::Tensor premultiplied(const at::Tensor& t, const c10d::ReduceOp& op) {
    if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return t;
    TORCH_CHECK_TYPE(at::isFloatingType(t.scalar_type()), "PreMulSum Data type must be half, float, bfloat16 or double");
    auto* supplement = dynamic_cast<PreMulSumSupplement*>(op.supplement_.get());
    TORCH_CHECK(supplement, "torchtpu: ReduceOp.PREMUL_SUM needs a factor (torch.distributed._make_nccl_premul_sum)");
    at::Tensor factor = supplement->tensor_factor.defined()
                            ? supplement->tensor_factor.to(t.device(), t.scalar_type()).reshape({})
                            : at::scalar_tensor(supplement->double_factor, t.options());
    return at::mul(t, factor);
  }

  at::Tensor all_reduce(const at::Tensor& t, const c10d::ReduceOp& op) {
    return record("torchtpu::all_reduce", {Arg::integer(reduce_code(op, t))}, premultiplied(t, op), tensor_type_of(t));
  }

  at::Tensor broadcast_from(const at::Tensor& t, int64_t root) {
    return record("torchtpu::broadcast_from", {Arg::boolean(getRank() == root)}, t, tensor_type_of(t));
  }

  // [size, numel]: row r is rank r's tensor.
  at::Tensor all_gather_rows(const at::Tensor& t) {
    at::Tensor row = t.reshape({1, t.numel()});
    return record("torchtpu::all_gather", {}, row, TensorType{{getSize(), t.numel()}, to_dtype(t.scalar_type())});
  }

  // rows [size, m] -> [m]: the reduction of every rank's row `rank`.
  at::Tensor reduce_scatter_rows(const at::Tensor& rows, const c10d::ReduceOp& op) {
    TensorType out{{1, rows.size(1)}, to_dtype(rows.scalar_type())};
    return record("torchtpu::reduce_scatter", {Arg::integer(reduce_code(op, rows))}, premultiplied(rows, op), out)
        .reshape({-1});
  }

  // rows [size, m]: row j goes to rank j; row i of the result came from rank i.
  at::Tensor all_to_all_rows(const at::Tensor& rows) {
    return record("torchtpu::all_to_all", {}, rows, tensor_type_of(rows));
  }

  // rows [N, m], block j (in_splits[j] rows) to rank j; returns the blocks received from
  // every rank, in rank order ([sum(out_splits), m]), or an undefined tensor when no rank
  // sends anything. The blocks are padded to the group's largest split, so one even
  // all_to_all of one shape on every rank carries them (the splits are host ints: shapes
  // stay static), and the padding is sliced off.
  at::Tensor all_to_all_split(const at::Tensor& rows, const std::vector<int64_t>& in_splits,
                              const std::vector<int64_t>& out_splits) {
    int64_t block = largest_split_in_group(in_splits, out_splits);
    if (block == 0) return at::Tensor();
    std::vector<at::Tensor> padded;
    int64_t offset = 0;
    for (int64_t s : in_splits) {
      padded.push_back(at::constant_pad_nd(rows.narrow(0, offset, s), {0, 0, 0, block - s}));
      offset += s;
    }
    int64_t m = rows.size(1);
    at::Tensor received = all_to_all_rows(at::cat(padded).reshape({getSize(), -1})).view({getSize(), block, m});
    std::vector<at::Tensor> blocks;
    for (int r = 0; r < getSize(); ++r) blocks.push_back(received.select(0, r).narrow(0, 0, out_splits[r]));
    return at::cat(blocks);
  }

  // The largest split of any rank's all_to_all with split sizes. Each rank knows only its
  // own splits, so the k-th such call of the group exchanges them through the group's store
  // (host ints: no device round trip, a fused step stays one executable), and every rank
  // checks that what each rank expects to receive is what its peers send (else every rank
  // raises the same error, rather than one hanging or reading padding).
  int64_t largest_split_in_group(const std::vector<int64_t>& in_splits, const std::vector<int64_t>& out_splits) {
    if (getSize() == 1) {
      TORCH_CHECK(in_splits == out_splits, "torchtpu: all_to_all_single in a group of one rank sends ", in_splits[0],
                  " rows to itself but expects ", out_splits[0]);
      return in_splits[0];
    }
    uint64_t call = split_exchanges_++;
    auto key = [](uint64_t c, int r) { return "torchtpu/all_to_all_split/" + std::to_string(c) + "/" + std::to_string(r); };
    std::vector<int64_t> mine(in_splits);
    mine.insert(mine.end(), out_splits.begin(), out_splits.end());
    std::string text = c10::Join(",", mine);
    store_->set(key(call, getRank()), std::vector<uint8_t>(text.begin(), text.end()));
    std::vector<std::vector<int64_t>> splits;  // per rank: its input splits, then its output splits
    for (int r = 0; r < getSize(); ++r) {
      std::vector<uint8_t> theirs;
      try {
        theirs = store_->get(key(call, r));  // waits for rank r, up to the store's timeout
      } catch (const c10::Error& error) {
        TORCH_CHECK(false, "torchtpu: rank ", r, " did not issue this process group's all_to_all with split sizes #",
                    call + 1, " (rank ", getRank(), " waited for it): every rank must issue the same collectives "
                    "in the same order. ", error.what_without_backtrace());
      }
      splits.push_back(parse_ints(std::string(theirs.begin(), theirs.end())));
    }
    // Each rank set its key of this call after reading every key of the previous one, so
    // this rank's previous key is read by all: deleting it keeps the store small.
    if (call > 0) store_->deleteKey(key(call - 1, getRank()));
    int64_t largest = 0;
    for (int from = 0; from < getSize(); ++from)
      for (int to = 0; to < getSize(); ++to) {
        int64_t sent = splits[from][to], expected = splits[to][getSize() + from];
        TORCH_CHECK(sent == expected, "torchtpu: all_to_all split sizes do not match across ranks: rank ", from,
                    " sends ", sent, " rows to rank ", to, ", which expects ", expected, " from it");
        largest = std::max(largest, sent);
      }
    return largest;
  }

  static std::vector<int64_t> parse_ints(const std::string& text) {
    std::vector<int64_t> ints;
    std::stringstream stream(text);
    for (std::string item; std::getline(stream, item, ',');) ints.push_back(std::stoll(item));
    return ints;
  }

  // Sends src's tensor to dst over a two-replica program (replicas in rank order).
  at::Tensor permute_pair(const at::Tensor& t, int src, int dst) {
    std::vector<int64_t> pair{replica_devices_[std::min(src, dst)], replica_devices_[std::max(src, dst)]};
    Arg pairs;
    pairs.kind = Arg::Kind::IntList;
    pairs.ints = {src < dst ? 0 : 1, src < dst ? 1 : 0};
    return record("torchtpu::collective_permute", {pairs}, t, tensor_type_of(t), pair);
  }

  void store_into(at::Tensor& dst, const at::Tensor& src) {
    TORCH_CHECK(dst.sizes() == src.sizes(), "torchtpu: collective result of shape ", src.sizes(),
                " does not fit the tensor of shape ", dst.sizes());
    store_value(dst, value_of(src, device_of(dst)));
  }

  c10::intrusive_ptr<c10d::Work> work(c10d::OpType type, std::vector<at::Tensor> outputs) {
    return issue(c10::make_intrusive<TpuWork>(getRank(), type, std::move(outputs)));
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::vector<int64_t> replica_devices_;  // global device ids of the members, in group-rank order (size > 1)
  std::chrono::milliseconds timeout_;
  uint64_t sequence_ = 0;
  uint64_t split_exchanges_ = 0;  // all_to_all calls with split sizes so far (their store keys)
};

// ---- functionalization of c10d's in-place ops (see backend.h) --------------------------

bool any_tpu_tensor(const torch::jit::Stack& stack, size_t first) {
  for (size_t i = first; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor() && is_tpu(v.toTensor())) return true;
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList())
        if (is_tpu(t)) return true;
  }
  return false;
}

void c10d_functionalize(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  size_t n = op.schema().arguments().size();
  size_t first = stack->size() - n;
  if (any_tpu_tensor(*stack, first)) {
    // The tpu backend takes the user's tensors and writes the results into them.
    op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Functionalize),
                       stack);
    return;
  }
  // Other devices: what PyTorch's functionalization fallback does for ops without aliasing.
  bool any_functional = false;
  for (size_t i = first; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor() && at::functionalization::impl::isFunctionalTensor(v.toTensor())) {
      any_functional = true;
      at::functionalization::impl::sync(v.toTensor());
      v = at::functionalization::impl::from_functional_tensor(v.toTensor());
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      if (at::functionalization::impl::isFunctionalTensor(list)) {
        any_functional = true;
        at::functionalization::impl::sync(list);
        v = at::functionalization::impl::from_functional_tensor(list);
      }
    }
  }
  {
    at::AutoDispatchSkipFunctionalize guard;
    op.callBoxed(stack);
  }
  if (!any_functional) return;
  size_t returns = op.schema().returns().size();
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor()) v = at::functionalization::impl::to_functional_tensor(v.toTensor());
    else if (v.isTensorList()) v = at::functionalization::impl::to_functional_tensor(v.toTensorList());
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_tpu_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                   std::vector<int64_t> global_ranks,
                                                   std::chrono::milliseconds timeout) {
  TORCH_CHECK(static_cast<int>(global_ranks.size()) == size, "torchtpu: a group of size ", size, " listed ",
              global_ranks.size(), " ranks");
  std::vector<int64_t> devices;
  if (size > 1) {
    std::vector<int64_t> all = runtime().process_device_ids();
    for (int64_t r : global_ranks) {
      TORCH_CHECK(r >= 0 && r < static_cast<int64_t>(all.size()), "torchtpu: rank ", r, " is not in this job of ",
                  all.size(), " processes");
      devices.push_back(all[r]);
    }
  }
  return c10::make_intrusive<TpuBackend>(store, rank, size, std::move(devices), timeout);
}

void set_collective_checks(bool enabled) { g_collective_checks = enabled; }

void release_collective_works() {
  std::vector<c10::weak_intrusive_ptr<c10d::Work>> issued;
  {
    std::lock_guard<std::mutex> lock(g_issued_mutex);
    issued.swap(g_issued);
  }
  for (auto& weak : issued)
    if (c10::intrusive_ptr<c10d::Work> work = weak.lock()) c10d::unregister_work(work);
}

void register_c10d_functionalization() {
  static bool done = false;
  if (done) return;
  done = true;
  KernelOverride library("functionalize c10d", "c10d", c10::DispatchKey::Functionalize, OverrideKind::Adds,
                         "every c10d:: op that takes tensors and has no Functionalize kernel");
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("c10d::", 0) != 0) continue;
    auto handle = c10::Dispatcher::singleton().findOp(name);
    if (!handle || handle->hasKernelForDispatchKey(c10::DispatchKey::Functionalize)) continue;
    bool takes_tensors = false;
    for (const auto& arg : handle->schema().arguments()) {
      const c10::TypePtr& type = arg.type();
      takes_tensors |= type->kind() == c10::TypeKind::TensorType ||
                       (type->kind() == c10::TypeKind::ListType &&
                        type->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::TensorType);
    }
    if (!takes_tensors) continue;
    library.impl(name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name),
                 torch::CppFunction::makeFromBoxedFunction<&c10d_functionalize>());
  }
}

}  // namespace torchtpu
