#include "graph/ops_common.h"

namespace nnfuse {

void register_nn_ops(OpRegistry& r) { (void)r; }

}  // namespace nnfuse
