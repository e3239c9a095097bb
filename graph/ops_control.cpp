#include "graph/ops_common.h"

namespace nnfuse {

void register_control_ops(OpRegistry& r) { (void)r; }

}  // namespace nnfuse
