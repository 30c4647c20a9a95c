// Snapshots of tensors' values (see snapshot.h).
#include "device/snapshot.h"

#include <ATen/FunctionalTensorWrapper.h>

#include "device/tensor.h"
#include "engine/engine.h"

namespace torchtpu {

ValueSnapshot take_snapshot(const std::vector<at::Tensor>& tensors) {
  ValueSnapshot s;
  bool weak = Engine::get().mode() == Mode::Fused;
  for (const at::Tensor& t : tensors) {
    if (!is_tpu(t)) continue;
    if (t.is_sparse()) {
      s.sparse_tensors.push_back(t);
      s.sparse_inners.push_back(unwrap(t));
      continue;
    }
    ValuePtr v = value_of(t, t.device().index());
    s.tensors.push_back(t);
    if (weak) s.weak.push_back(v);
    else s.strong.push_back(std::move(v));
  }
  return s;
}

size_t restore_snapshot(const ValueSnapshot& s) {
  size_t lost = 0;
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    ValuePtr v = i < s.weak.size() ? s.weak[i].lock() : s.strong[i];
    const at::Tensor& t = s.tensors[i];
    // Gone, or its buffer donated to a graph that ran: nothing to put back.
    if (!v || (!v->pending() && !v->buffer && !v->error)) {
      lost++;
      continue;
    }
    if (value_of(t, t.device().index()) == v) continue;
    if (at::functionalization::impl::isFunctionalTensor(t)) {
      // As functionalization ends an in-place op: the wrapper takes a new inner tensor,
      // and views of it see the change.
      at::functionalization::impl::replace_(t, make_tensor(v));
      at::functionalization::impl::commit_update(t);
      at::functionalization::impl::sync(t);
    } else {
      store_value(t, v);
    }
  }
  for (size_t i = 0; i < s.sparse_tensors.size(); ++i) {
    const at::Tensor& t = s.sparse_tensors[i];
    if (!at::functionalization::impl::isFunctionalTensor(t) || unwrap(t).is_same(s.sparse_inners[i])) continue;
    at::functionalization::impl::replace_(t, s.sparse_inners[i]);
    at::functionalization::impl::commit_update(t);
    at::functionalization::impl::sync(t);
  }
  return lost;
}

}  // namespace torchtpu
