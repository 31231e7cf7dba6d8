// model_geometry validation.
#include "core/geometry.hpp"

namespace eldr {

status model_geometry::validate() const {
  if (layers < 1) return status::invalid_argument("model geometry: layers must be >= 1, got 0");
  if (experts < 1 || experts > 256)
    return status::invalid_argument("model geometry: experts must be in 1..256, got " +
                                    std::to_string(experts));
  if (top_k < 1 || top_k > experts)
    return status::invalid_argument("model geometry: top_k must be in 1..experts (" +
                                    std::to_string(experts) + "), got " + std::to_string(top_k));
  if (layers > 4096)
    return status::invalid_argument("model geometry: layers must be <= 4096, got " +
                                    std::to_string(layers));
  return {};
}

std::string model_geometry::to_string() const {
  return "L=" + std::to_string(layers) + " E=" + std::to_string(experts) +
         " k=" + std::to_string(top_k);
}

}  // namespace eldr
