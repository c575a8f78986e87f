#include "batching/batched.h"

namespace pipit::batching {

Batched<1> batched(std::shared_ptr<Module> module, const std::string& name, bool pure) {
  PIPIT_CHECK(module != nullptr, "batching: batched() of a null module");
  Op op;
  op.name = name.empty() ? module->config().value("type", std::string("module")) : name;
  op.run = [module](const std::vector<Tensor>& in) {
    PIPIT_CHECK(in.size() == 1, "a module takes one input, got ", in.size());
    return std::vector<Tensor>{module->forward(in[0])};
  };
  op.pure = pure;
  return Batched<1>(make_op(std::move(op)));
}

Handle batched_value(const Tensor& value) {
  Graph* g = Graph::current();
  PIPIT_CHECK(g != nullptr,
              "batching: batched_value outside a batching scope (hold a Graph's scope())");
  return g->value(value);
}

Handle batched_index(int64_t index) {
  Graph* g = Graph::current();
  PIPIT_CHECK(g != nullptr,
              "batching: batched_index outside a batching scope (hold a Graph's scope())");
  return g->index(index);
}

}  // namespace pipit::batching
