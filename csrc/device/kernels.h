// Registration of the tpu device's aten kernels and the CPU fallback.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>

namespace torchtpu {

void register_kernels();
void set_fallback_policy(const std::string& policy);  // warn | error | silent
void clear_fallback_warnings();  // each op warns once again (metrics.reset())
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torchtpu
