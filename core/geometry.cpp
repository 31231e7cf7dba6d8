// model_geometry validation.
#include "core/geometry.hpp"

namespace eldr {

status model_geometry::validate() const {
  if (layers < 1) return status::invalid_argument("model geometry: layers must be >= 1, got 0");
  if (experts < 1 || experts > max_experts)
    return status::invalid_argument("model geometry: experts must be in 1.." +
                                    std::to_string(max_experts) + ", got " +
                                    std::to_string(experts));
  if (top_k < 1 || top_k > experts)
    return status::invalid_argument("model geometry: top_k must be in 1..experts (" +
                                    std::to_string(experts) + "), got " + std::to_string(top_k));
  if (layers > max_layers)
    return status::invalid_argument("model geometry: layers must be <= " +
                                    std::to_string(max_layers) + ", got " + std::to_string(layers));
  if (uint64_t{layers} * experts > max_width)
    return status::invalid_argument(
        "model geometry: layers * experts must be <= " + std::to_string(max_width) + ", got " +
        std::to_string(layers) + " * " + std::to_string(experts) + " = " +
        std::to_string(uint64_t{layers} * experts));
  return {};
}

std::string model_geometry::to_string() const {
  return "L=" + std::to_string(layers) + " E=" + std::to_string(experts) +
         " k=" + std::to_string(top_k);
}

}  // namespace eldr
