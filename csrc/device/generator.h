// Random generator of a tpu device: a seed and a counter. Each random op takes the pair and
// advances the counter; the op's lowering turns the pair into a counter-based RNG state.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <mutex>
#include <utility>

namespace torchtpu {

class TpuGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit TpuGeneratorImpl(int device);
  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override;
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  void set_state(const c10::TensorImpl& state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  // The (seed, offset) pair for the next random op.
  std::pair<uint64_t, uint64_t> next();
  // The RNG key of the next random op: (seed, offset) hashed, so consecutive ops draw
  // from independent streams (the counter of each starts at zero).
  int64_t next_key();

 private:
  TpuGeneratorImpl* clone_impl() const override;
  std::mutex mutex_;
  uint64_t seed_ = 67280421310721ull;
  uint64_t offset_ = 0;
};

const at::Generator& default_generator(int device);
void register_hooks();

}  // namespace torchtpu
