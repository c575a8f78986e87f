// OpTimer (the CPU's), cuda::OpTimer and set_backend_override. Without a CUDA device (or
// without CUDA in the build) the CUDA test reports "skipped" through a Catch2 warning and
// passes.
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "pipit.h"
#include "tensor/op_timer.h"
#ifdef PIPIT_WITH_CUDA
#include "tensor/cuda/cuda_device.h"
#include "tensor/cuda/op_timer.h"
#endif

using namespace pipit;

TEST_CASE("the CPU's OpTimer totals each outermost op's wall time under its name", "[tensor]") {
  Generator generator(3);
  const Tensor a = randn({256, 256}, &generator), b = randn({256, 256}, &generator);
  Backend& own = backend(Device::cpu());
  OpTimer timer(own);
  REQUIRE(set_backend_override(Device::cpu(), &timer) == nullptr);
  const Tensor before = a * 2.0;  // not enabled yet: not counted
  timer.set_enabled(true);
  const Tensor c = matmul(a, b);
  const Tensor d = matmul(c, b) + c;
  const Tensor e = log_softmax(d, 1);
  timer.set_enabled(false);
  REQUIRE(set_backend_override(Device::cpu(), nullptr) == &timer);
  std::map<std::string, OpTimer::Op> ops;
  for (const auto& op : timer.report()) ops[op.name] = op;
  CHECK(ops.at("matmul").calls == 2);
  CHECK(ops.at("binary.add").calls == 1);
  CHECK(ops.at("log_softmax").calls == 1);
  CHECK(ops.count("binary.mul") == 0);
  CHECK(ops.at("matmul").ms > 0);
  // Most time first.
  const std::vector<OpTimer::Op> report = timer.report();
  for (size_t i = 1; i < report.size(); ++i) CHECK(report[i - 1].ms >= report[i].ms);
  timer.reset();
  CHECK(timer.report().empty());
}

TEST_CASE("OpTimer times each outermost backend op once, under its name", "[cuda]") {
#ifndef PIPIT_WITH_CUDA
  WARN("skipped: pipit was built without CUDA");
#else
  if (!cuda::is_available()) {
    WARN("skipped: no CUDA device");
    return;
  }
  const Device device = Device::cuda(0);
  const Tensor a = randn({64, 32}, nullptr, {DType::f32, device});
  const Tensor b = randn({32, 16}, nullptr, {DType::f32, device});
  const Tensor no_k = empty({4, 0}, {DType::f32, device}),
               k_none = empty({0, 3}, {DType::f32, device});
  const Tensor zeros_out = empty({4, 3}, {DType::f32, device});
  Backend& own = backend(device);

  cuda::OpTimer timer(own);
  REQUIRE(set_backend_override(device, &timer) == nullptr);
  REQUIRE(&backend(device) == &timer);
  const Tensor before = a * 2.0;  // not enabled yet: not counted
  timer.set_enabled(true);
  const Tensor c = matmul(a, b);
  const Tensor d = c + c;
  // With K = 0 the CUDA matmul fills its output through backend(): a nested call.
  backend(device).matmul(no_k, k_none, zeros_out, false);
  timer.set_enabled(false);
  REQUIRE(set_backend_override(device, nullptr) == &timer);
  REQUIRE(&backend(device) == &own);

  std::map<std::string, cuda::OpTime> ops;
  for (const auto& op : timer.report()) ops[op.name] = op;
  CHECK(ops.at("matmul").calls == 2);
  CHECK(ops.at("binary.add").calls == 1);
  CHECK(ops.count("binary.mul") == 0);
  CHECK(ops.count("fill") == 0);
  CHECK(ops.at("matmul").gpu_ms > 0);
  CHECK(ops.at("matmul").host_ms > 0);

  timer.reset();
  CHECK(timer.report().empty());
#endif
}
