// The nnfuse command-line tool: a thin layer over the library calls.
#include <iostream>

#include "graph/error.h"

int main(int argc, char** argv) {
  std::cerr << "nnfuse: no commands yet\n";
  return 2;
}
