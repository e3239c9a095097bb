#include "graph/ops_common.h"

namespace nnfuse {

void register_tensor_ops(OpRegistry& r) { (void)r; }

}  // namespace nnfuse
