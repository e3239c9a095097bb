// nnfuse from a C++ application: load an ONNX model, optimize it (rewrite, classify, plan fusion),
// compile it for a target and run it on a deterministic input.
//
//   nnfuse zoo export resnet_tiny -o resnet_tiny.onnx
//   nnfuse_example resnet_tiny.onnx [reference|host|...]
#include <nnfuse/nnfuse.h>

#include <cmath>
#include <cstdio>
#include <iostream>

namespace nf = nnfuse::api;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: nnfuse_example MODEL.onnx [TARGET]\n";
    return 2;
  }
  const std::string target = argc > 2 ? argv[2] : "reference";
  try {
    nf::Model model = nf::Model::load(argv[1]);
    std::cout << "nnfuse " << nf::version() << ": " << model.name() << ", " << model.num_operators() << " operators\n";

    std::string report = model.optimize({.target = target});  // the optimize report, a JSON object
    std::cout << "optimize report: " << report.substr(0, 160) << "...\n";

    nf::CompiledModel compiled = nf::compile(model, {.target = target});

    // One input per model input: a ramp in [-1, 1] for floats, zeros otherwise; dynamic dims = 1.
    nf::TensorMap feeds;
    for (const nf::ValueInfo& in : compiled.inputs()) {
      std::vector<int64_t> shape;
      for (int64_t d : in.dims) shape.push_back(d < 0 ? 1 : d);
      nf::Tensor t(in.dtype, shape);
      if (in.dtype == nf::DType::Float32) {
        float* p = t.data<float>();
        for (int64_t i = 0; i < t.numel(); ++i) p[i] = float(i % 200) / 100.0f - 1.0f;
      }
      feeds[in.name] = t;
    }

    nf::TensorMap outputs = compiled.run(feeds);
    for (const auto& [name, t] : outputs) {
      std::cout << "output " << name << ": " << nf::dtype_name(t.dtype()) << "[";
      for (size_t i = 0; i < t.shape().size(); ++i) std::cout << (i ? "," : "") << t.shape()[i];
      std::cout << "]";
      if (t.dtype() == nf::DType::Float32 && t.numel() > 0) {
        const float* p = t.data<float>();
        double sum = 0;
        bool finite = true;
        for (int64_t i = 0; i < t.numel(); ++i) sum += p[i], finite &= std::isfinite(p[i]);
        std::printf(" sum %.6g%s", sum, finite ? "" : " (NOT FINITE)");
        std::fflush(stdout);
        if (!finite) return 1;
      }
      std::cout << "\n";
    }
    return 0;
  } catch (const nf::Error& e) {
    // Errors name the file, node and op at fault; kind() says what went wrong.
    std::cerr << "error (" << nf::error_kind_name(e.kind()) << "): " << e.what() << "\n";
    return 1;
  }
}
