// The device path (kernels/device): the device kernel form run through the OpenCL backend on
// PoCL (OpenCL on the CPU, the stand-in for a Mali GPU) against the reference interpreter, and
// the same programs in their CUDA spelling compiled for sm_70 with NVRTC (no GPU needed).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <set>
#include <unistd.h>

#include "fusion/planner.h"
#include "fusion/target.h"
#include "graph/error.h"
#include "graph/interpreter.h"
#include "graph/zoo.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/device/device_model.h"
#include "kernels/device/program_cache.h"
#include "kernels/opencl/opencl_api.h"
#include "graph/builder.h"
#include "tests/cpp/device/device_test_util.h"

using namespace nnfuse;
using namespace nnfuse::device;
using nnfuse::device_test::check_close;
using nnfuse::device_test::check_close_scaled;
using nnfuse::device_test::kTinyZoo;
using nnfuse::device_test::plan_for;
using nnfuse::device_test::ScopedEnv;

namespace {


// CI installs PoCL and NVRTC (scripts/setup.sh): there a missing one is a failure, elsewhere a warning.
bool required(const char* what) {
  if (std::getenv("CI")) FAIL(what << " is missing on a CI machine (scripts/setup.sh installs it)");
  WARN(what << " missing: skipped");
  return false;
}

bool opencl_present() {
  try {
    make_opencl_api();
    return true;
  } catch (const Error&) {
    return required("an OpenCL platform");
  }
}

}  // namespace

TEST_CASE("device: every tiny zoo model runs on mali-opencl and matches the reference interpreter", "[device][opencl]") {
  if (!opencl_present()) return;
  for (const auto& name : kTinyZoo) {
    Model m = build_zoo_model(name, ZooOptions{});
    FusionPlan plan = plan_for(m.graph, "mali-opencl");
    auto dm = DeviceModel::build(m.graph, &plan, make_opencl_api(), "mali-opencl");
    const auto info = dm->info();
    INFO(name << ": " << info.dump());
    CHECK(info["kernels"].get<int>() > 0);
    // Repeated layers share one entry point (buffers are named by argument slot).
    if (name == "bert_tiny" || name == "gpt2_tiny" || name == "vit_tiny") CHECK(info["entry_points"].get<int>() < info["kernels"].get<int>());
    TensorMap feeds = random_feeds(m.graph, 7);
    check_close(dm->run(feeds), run_reference(m.graph, feeds), name);
    // A second run reuses the arena and the uploaded weights.
    TensorMap feeds2 = random_feeds(m.graph, 8);
    check_close(dm->run(feeds2), run_reference(m.graph, feeds2), name + " (second run)");
  }
}

TEST_CASE("device: each kernel form matches the reference on small graphs", "[device][opencl]") {
  if (!opencl_present()) return;
  // Tiled GEMM with a transposed, broadcast-batch operand and alpha; grouped conv as implicit GEMM
  // (8 output channels per group) and depthwise conv direct; pooling with count_include_pad;
  // softmax over a middle axis; reductions over the last and a middle axis; LayerNorm.
  GraphBuilder gb("forms", 20);  // opset 20: Gelu
  auto a = gb.input("a", DType::Float32, {2, 3, 20, 33});
  auto x = gb.input("x", DType::Float32, {1, 16, 11, 9});
  auto bw = gb.weight("bw", {33, 17}, 0.2f);
  auto mm = gb.op("MatMul", {a, bw});
  auto gm = gb.op("Gemm", {gb.op("Reshape", {mm, gb.ints("shp", {120, 17})}), gb.weight("gw", {5, 17}, 0.3f), gb.weight("gb", {5}, 0.1f)},
                  GraphBuilder::attrs({{"transB", A::i(1)}, {"alpha", A::f(0.5f)}}));
  auto gconv = gb.op("Conv", {x, gb.weight("cw", {16, 8, 3, 3}, 0.2f), gb.weight("cb", {16}, 0.1f)},
                     GraphBuilder::attrs({{"group", A::i(2)}, {"pads", A::is({1, 1, 1, 1})}, {"strides", A::is({2, 1})}}));
  auto dw = gb.op("Conv", {gb.op("Relu", {gconv}), gb.weight("dw", {16, 1, 3, 3}, 0.3f)},
                  GraphBuilder::attrs({{"group", A::i(16)}, {"pads", A::is({1, 1, 1, 1})}}));
  auto pool = gb.op("AveragePool", {dw}, GraphBuilder::attrs({{"kernel_shape", A::is({3, 3})}, {"pads", A::is({1, 1, 1, 1})}, {"count_include_pad", A::i(1)}}));
  auto sm = gb.op("Softmax", {pool}, GraphBuilder::attrs({{"axis", A::i(1)}}));
  auto rl = gb.op("ReduceMean", {sm, gb.ints("ax1", {3})}, GraphBuilder::attrs({{"keepdims", A::i(1)}}));
  auto rm = gb.op("ReduceMax", {pool, gb.ints("ax2", {1})}, GraphBuilder::attrs({{"keepdims", A::i(0)}}));
  auto ln = gb.op("LayerNormalization", {gm, gb.weight("ls", {5}, 0.5f), gb.weight("lb", {5}, 0.1f)}, GraphBuilder::attrs({{"axis", A::i(-1)}}));
  // Tiles with partial edges in both output dims, for a MatMul and for a conv with 72 output
  // channels.
  auto big = gb.op("MatMul", {gb.input("p", DType::Float32, {1, 70, 96}), gb.weight("pw", {96, 130}, 0.1f)});
  auto bigconv = gb.op("Conv", {gb.input("q", DType::Float32, {1, 8, 10, 9}), gb.weight("qw", {72, 8, 3, 3}, 0.1f)},
                       GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
  gb.output(rl);
  gb.output(rm);
  gb.output(ln);
  gb.output(gb.op("Sigmoid", {big}));
  gb.output(gb.op("Relu", {bigconv}));
  // Few tiles over a long K: split-K (partial tiles to scratch, then a sum kernel with the
  // epilogue), for a MatMul (K 1000: 7 splits of 144, the last short), a MatMul whose K leaves
  // the last of 10 splits empty (K 1281: splits of 144) and a conv (K 64 * 9 = 576).
  auto longk = gb.op("MatMul", {gb.input("s", DType::Float32, {1, 20, 1000}), gb.weight("sw", {1000, 24}, 0.05f)});
  gb.output(gb.op("Add", {longk, gb.weight("sb", {24}, 0.1f)}));
  auto longconv = gb.op("Conv", {gb.input("t", DType::Float32, {1, 64, 6, 6}), gb.weight("tw", {16, 64, 3, 3}, 0.05f), gb.weight("tb", {16}, 0.1f)},
                        GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
  gb.output(gb.op("Relu", {longconv}));
  gb.output(gb.op("MatMul", {gb.input("e", DType::Float32, {1, 2, 1281}), gb.weight("ew", {1281, 3}, 0.05f)}));
  // Dilated and 1-D convs; a batch table that is not affine (A broadcast over B's batch); Gemm
  // with transA; a reduction with an epilogue over inner != the output's last dim; Softplus (Mish);
  // Gelu's tanh form; an int64 comparison (by exact parts).
  gb.output(gb.op("Conv", {gb.input("dl", DType::Float32, {1, 3, 9, 9}), gb.weight("dlw", {4, 3, 3, 3}, 0.2f)},
                      GraphBuilder::attrs({{"dilations", A::is({2, 2})}, {"pads", A::is({2, 1, 2, 1})}})));
  gb.output(gb.op("Conv", {gb.input("c1", DType::Float32, {1, 4, 21}), gb.weight("c1w", {6, 4, 5}, 0.2f), gb.weight("c1b", {6}, 0.1f)},
                      GraphBuilder::attrs({{"strides", A::is({2})}, {"pads", A::is({2, 2})}})));
  gb.output(gb.op("MatMul", {gb.input("ba", DType::Float32, {2, 1, 5, 7}), gb.input("bm", DType::Float32, {1, 3, 7, 4})}));
  gb.output(gb.op("Gemm", {gb.input("ta", DType::Float32, {7, 5}), gb.weight("tw", {7, 6}, 0.2f)}, GraphBuilder::attrs({{"transA", A::i(1)}})));
  auto rk = gb.op("ReduceSum", {gb.input("rk", DType::Float32, {2, 3, 4}), gb.ints("rax", {2})}, GraphBuilder::attrs({{"keepdims", A::i(0)}}));
  auto rkb = gb.op("Add", {rk, gb.weight("rkb", {3}, 0.5f)});
  gb.output(rkb);
  gb.output(gb.op("Relu", {rkb}));
  auto mi = gb.input("mi", DType::Float32, {3, 5});
  gb.output(gb.op("Mul", {mi, gb.op("Tanh", {gb.op("Softplus", {mi})})}));
  gb.output(gb.op("Gelu", {mi}, GraphBuilder::attrs({{"approximate", A::s("tanh")}})));
  // A combined projection split into column windows stored from the GEMM's epilogue (one as heads apart).
  auto qkv = gb.op("Add", {gb.op("MatMul", {gb.input("qx", DType::Float32, {1, 6, 40}), gb.weight("qw", {40, 48}, 0.2f)}), gb.weight("qb", {48}, 0.1f)});
  auto qsp = gb.op_n("Split", {qkv, gb.ints("qsplit", {16, 32})}, 2, GraphBuilder::attrs({{"axis", A::i(-1)}}));
  gb.output(gb.op("Relu", {qsp[0]}));
  gb.output(gb.op("Transpose", {gb.op("Reshape", {qsp[1], gb.ints("qshape", {1, 6, 2, 16})})}, GraphBuilder::attrs({{"perm", A::is({0, 2, 1, 3})}})));
  auto ia = gb.input("ia", DType::Int64, {2, 5}), ib = gb.input("ib", DType::Int64, {5});
  gb.output(gb.op("LessOrEqual", {ia, ib}));
  gb.output(gb.op("Equal", {ia, ib}));
  Model m = gb.finish();
  FusionPlan plan = plan_for(m.graph, "mali-opencl");
  auto dm = DeviceModel::build(m.graph, &plan, make_opencl_api(), "mali-opencl");
  const auto forms = dm->info()["kernel_forms"];
  INFO(dm->info().dump());
  for (const char* f : {"tiled_gemm", "implicit_gemm_conv", "direct_conv", "pool", "row_reduction", "column_reduction",
                        "tiled_gemm_split_sum", "implicit_gemm_conv_split_sum"})
    CHECK(forms.contains(f));
  CHECK(dm->info()["host_stages"] == 0);  // every stage printed for the device, none moved to the host
  int windows = 0;
  for (auto& st : dm->module().stages)
    for (auto& s : st.stores) windows += s.windowed();
  CHECK(windows == 2);  // the Split's outputs, stored from the GEMM's epilogue
  TensorMap feeds = random_feeds(m.graph, 3);
  // Neighbours that float rounds together (2^40 +- 1, INT64_MIN + 1), negative and past 2^44:
  // the int64 comparisons must read the exact parts.
  const int64_t p40 = int64_t(1) << 40, mn = std::numeric_limits<int64_t>::min();
  feeds["ib"] = Tensor::from_vector<int64_t>({5}, {p40, -p40, mn + 1, (int64_t(1) << 50) + 3, 16000});
  feeds["ia"] = Tensor::from_vector<int64_t>({2, 5}, {p40 + 1, -p40, mn, (int64_t(1) << 50) + 2, 16000,
                                                      p40 - 1, p40, mn + 1, (int64_t(1) << 50) + 3, 16001});
  const TensorMap want = run_reference(m.graph, feeds);
  check_close(dm->run(feeds), want, "forms");
  // The same program without split-K.
  ::setenv("NNFUSE_DEVICE_SPLIT_K", "0", 1);
  auto whole = DeviceModel::build(m.graph, &plan, make_opencl_api(), "mali-opencl");
  ::unsetenv("NNFUSE_DEVICE_SPLIT_K");
  CHECK_FALSE(whole->info()["kernel_forms"].contains("tiled_gemm_split_sum"));
  check_close(whole->run(feeds), want, "forms without split-K");
  // Register blocking forced (by shape these small products take R = 1): 2 x 2 and 4 x 4 outputs
  // per item, tiles of 32 and 64 with partial edges, split or not; k tiles of 8 and 32.
  for (auto [r, kt] : {std::pair<const char*, const char*>{"2", "8"}, {"4", "32"}}) {
    std::unique_ptr<DeviceModel> blocked;
    {
      const ScopedEnv env_r("NNFUSE_DEVICE_REGISTER_BLOCK", r), env_k("NNFUSE_DEVICE_K_TILE", kt);
      blocked = DeviceModel::build(m.graph, &plan, make_opencl_api(), "mali-opencl");
    }
    INFO(blocked->info().dump());
    CHECK(blocked->info()["register_blocks"].contains(r));
    CHECK(blocked->info()["register_blocks"].size() == 1);
    CHECK(blocked->info()["k_tile"] == std::stoi(kt));
    check_close(blocked->run(feeds), want, std::string("forms with register block ") + r + ", k tile " + kt);
  }
  {
    const ScopedEnv env_r("NNFUSE_DEVICE_REGISTER_BLOCK", "3");
    CHECK_THROWS_WITH(DeviceModel::build(m.graph, &plan, make_opencl_api(), "mali-opencl"), Catch::Contains("NNFUSE_DEVICE_REGISTER_BLOCK='3'"));
  }
}

TEST_CASE("device: a Gather index out of range is an error naming the stage", "[device][opencl]") {
  if (!opencl_present()) return;
  GraphBuilder gb("gather");
  auto table = gb.weight("table", {10, 4}, 1.0f);
  auto idx = gb.input("idx", DType::Int64, {3});
  auto y = gb.op("Relu", {gb.op("Gather", {table, idx})});
  // A later kernel stage: the error must name the Gather's stage, not the last one launched.
  gb.output(gb.op("MatMul", {y, gb.weight("w", {4, 5}, 0.5f)}));
  Model m = gb.finish();
  FusionPlan plan = plan_for(m.graph, "mali-opencl");
  auto dm = DeviceModel::build(m.graph, &plan, make_opencl_api(), "mali-opencl");
  TensorMap feeds{{"idx", Tensor::from_vector<int64_t>({3}, {1, -1, 9})}};
  check_close(dm->run(feeds), run_reference(m.graph, feeds), "gather in range");
  feeds["idx"] = Tensor::from_vector<int64_t>({3}, {1, 10, 2});
  try {
    dm->run(feeds);
    FAIL("an index of 10 into 10 rows ran");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("out of range") != std::string::npos);
    CHECK(std::string(e.what()).find("Gather") != std::string::npos);
    CHECK(std::string(e.what()).find("MatMul") == std::string::npos);
  }
}

TEST_CASE("device: every tiny zoo model's CUDA C compiles for sm_70 without spills", "[device][cuda]") {
  if (!cuda_nvrtc_available("sm_70") && !required("NVRTC for sm_70 (pip install nvidia-cuda-nvrtc-cu12)")) return;
  for (const auto& name : kTinyZoo) {
    Model m = build_zoo_model(name, ZooOptions{});
    FusionPlan plan = plan_for(m.graph, "volta-cuda");
    LowerOptions lo;
    lo.layout_block = 0;
    KernelModule km = lower_module(m.graph, plan, lo);
    // By shape, with every tiled kernel at 4 x 4 outputs per item over k tiles of 32 (the most
    // registers and work-group memory), and on tensor cores (rb -1).
    for (int rb : {0, 4, -1}) {
      DeviceProgramOptions po;
      po.register_block = rb > 0 ? rb : 0;
      po.k_tile = rb != 0 ? 32 : po.k_tile;  // tensor cores: k tiles of 64
      po.tensor_cores = rb < 0;
      po.tensor_core_min_groups = 0;  // the tiny models' products are all small
      DeviceProgram p = print_device_program(km, po);
      if (rb < 0) {
        bool any = false;
        for (auto& k : p.kernels) any = any || k.tensor_cores;
        CHECK(any);  // every tiny model has a GEMM or a conv of 8+ channels per group
      }
      CudaCompileReport r = cuda_compile_check(cuda_prelude() + p.source, "sm_70");
      INFO(name << " register block " << rb << ": " << to_json(r).dump().substr(0, 2000));
      std::set<std::string> entries;
      for (auto& k : p.kernels) entries.insert(k.name);
      CHECK(r.kernels.size() == entries.size());
      for (auto& k : r.kernels) {
        INFO(k.name);
        CHECK(k.registers > 0);
        CHECK(k.registers <= 128);  // two 256-thread groups per SM's 64K registers
        CHECK(k.spill_stores == 0);
        CHECK(k.spill_loads == 0);
        CHECK(k.shared_bytes <= 48 * 1024);
      }
    }
  }
}

TEST_CASE("device: on a CUDA GPU every tiny zoo model matches the reference, replaying a captured graph", "[device][cuda]") {
  try {
    make_cuda_api();
  } catch (const Error& e) {
    WARN("no CUDA GPU here (" << e.what() << "): skipped");
    return;
  }
  for (const auto& name : kTinyZoo) {
    Model m = build_zoo_model(name, ZooOptions{});
    FusionPlan plan = plan_for(m.graph, "volta-cuda");
    auto dm = DeviceModel::build(m.graph, &plan, make_cuda_api(), "volta-cuda");
    // Three runs with new inputs each: the first captures the launches, the others replay them
    // (models with host stages launch kernel by kernel).
    for (int run = 0; run < 3; ++run) {
      TensorMap feeds = random_feeds(m.graph, 20 + run);
      check_close(dm->run(feeds), run_reference(m.graph, feeds), name + " run " + std::to_string(run), 1e-3, 1e-3);
    }
    const auto info = dm->info();
    INFO(name << ": " << info.dump());
    CHECK(info["graph_replay"].get<bool>() == (info["host_stages"].get<int>() == 0));
  }
  Model m = build_zoo_model("bert_tiny", ZooOptions{});
  FusionPlan plan = plan_for(m.graph, "volta-cuda");
  std::unique_ptr<DeviceModel> dm;
  {
    const ScopedEnv env_g("NNFUSE_DEVICE_GRAPH", "0");
    dm = DeviceModel::build(m.graph, &plan, make_cuda_api(), "volta-cuda");
  }
  TensorMap feeds = random_feeds(m.graph, 30);
  check_close(dm->run(feeds), run_reference(m.graph, feeds), "bert_tiny without graphs", 1e-3, 1e-3);
  CHECK_FALSE(dm->info()["graph_replay"].get<bool>());
}

TEST_CASE("device: on a CUDA GPU every tiny zoo model matches the reference with fp16 tensor cores", "[device][cuda]") {
  try {
    make_cuda_api();
  } catch (const Error& e) {
    WARN("no CUDA GPU here (" << e.what() << "): skipped");
    return;
  }
  const ScopedEnv all("NNFUSE_DEVICE_TENSOR_CORE_GROUPS", "0");  // the tiny models' products are all small
  for (const auto& name : kTinyZoo) {
    Model m = build_zoo_model(name, ZooOptions{});
    FusionPlan plan = plan_for(m.graph, "volta-cuda");
    auto dm = DeviceModel::build(m.graph, &plan, make_cuda_api(), "volta-cuda", "fp16");
    const auto info = dm->info();
    INFO(name << ": " << info.dump());
    CHECK(info["precision"] == "fp16");
    CHECK(info["tensor_core_kernels"].get<int>() > 0);
    for (int run = 0; run < 2; ++run) {
      TensorMap feeds = random_feeds(m.graph, 40 + run);
      check_close_scaled(dm->run(feeds), run_reference(m.graph, feeds), name + " run " + std::to_string(run), 2e-2);
    }
  }
}

TEST_CASE("device: precision fp16 on a device without tensor cores is an error naming them", "[device][opencl]") {
  Model m = build_zoo_model("resnet_tiny", ZooOptions{});
  FusionPlan plan = plan_for(m.graph, "mali-opencl");
  try {
    DeviceModel::build(m.graph, &plan, make_opencl_api(), "mali-opencl", "fp16");
    FAIL("fp16 built on OpenCL");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Unsupported);
    CHECK_THAT(e.what(), Catch::Contains("tensor cores") && Catch::Contains("opencl"));
  }
  try {
    DeviceModel::build(m.graph, &plan, make_opencl_api(), "mali-opencl", "fp8");
    FAIL("fp8 accepted");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Invalid);
    CHECK_THAT(e.what(), Catch::Contains("fp8") && Catch::Contains("fp32 or fp16"));
  }
}

TEST_CASE("device: the program cache keys by content and stores atomically", "[device]") {
  CHECK(program_key({"ab", "c"}) != program_key({"a", "bc"}));
  CHECK(program_key({"x"}) == program_key({"x"}));
  CHECK(program_key({"x"}).size() == 32);
  const std::string dir = "/tmp/nnfuse_device_cache_test_" + std::to_string(::getpid());
  ::setenv("NNFUSE_CACHE_DIR", dir.c_str(), 1);
  std::string got;
  CHECK_FALSE(load_cached_program("p.bin", got));
  store_cached_program("p.bin", std::string("\0binary\0", 8));
  REQUIRE(load_cached_program("p.bin", got));
  CHECK(got == std::string("\0binary\0", 8));
  ::unsetenv("NNFUSE_CACHE_DIR");
  std::filesystem::remove_all(dir);
}

TEST_CASE("device: a second OpenCL build of a program loads the cached binary", "[device][opencl]") {
  if (!opencl_present()) return;
  const std::string dir = "/tmp/nnfuse_ocl_cache_test_" + std::to_string(::getpid());
  ::setenv("NNFUSE_CACHE_DIR", dir.c_str(), 1);
  Model m = build_zoo_model("resnet_tiny", ZooOptions{});
  FusionPlan plan = plan_for(m.graph, "mali-opencl");
  auto first = DeviceModel::build(m.graph, &plan, make_opencl_api(), "mali-opencl");
  auto second = DeviceModel::build(m.graph, &plan, make_opencl_api(), "mali-opencl");
  ::unsetenv("NNFUSE_CACHE_DIR");
  std::filesystem::remove_all(dir);
  CHECK_FALSE(first->info()["build"]["cache_hit"].get<bool>());
  CHECK(second->info()["build"]["cache_hit"].get<bool>());
  TensorMap feeds = random_feeds(m.graph, 4);
  check_close(second->run(feeds), run_reference(m.graph, feeds), "resnet_tiny from the cached binary");
}

TEST_CASE("device: NNFUSE_OPENCL_DEVICE naming no device lists the devices", "[device][opencl]") {
  if (!opencl_present()) return;
  ::setenv("NNFUSE_OPENCL_DEVICE", "no-such-device-name", 1);
  try {
    make_opencl_api();
    FAIL("a device was chosen for a name that matches none");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("no-such-device-name") != std::string::npos);
    CHECK(std::string(e.what()).find("0: ") != std::string::npos);
  }
  ::setenv("NNFUSE_OPENCL_DEVICE", "0", 1);
  CHECK_NOTHROW(make_opencl_api());
  ::unsetenv("NNFUSE_OPENCL_DEVICE");
}

TEST_CASE("device: fp16 tensor cores take the products whose 64 x 64 tile grid fills the device", "[device]") {
  // 1024 x 1024 outputs: 256 tiles of 64 x 64 (K split in 2 for 512 groups), tensor cores.
  // 32 x 32 outputs over K 64: one such tile and no split-K, so fp32 tiles by shape (4 of
  // 16 x 16); with a threshold of 0, tensor cores too (one group).
  GraphBuilder gb("tc");
  auto big = gb.op("MatMul", {gb.input("a", DType::Float32, {1, 1024, 256}), gb.weight("aw", {256, 1024}, 0.1f)});
  auto small = gb.op("MatMul", {gb.input("b", DType::Float32, {1, 32, 64}), gb.weight("bw", {64, 32}, 0.1f)});
  gb.output(gb.op("Relu", {big}));
  gb.output(small);
  Model m = gb.finish();
  FusionPlan plan = plan_for(m.graph, "volta-cuda");
  LowerOptions lo;
  lo.layout_block = 0;
  const KernelModule km = lower_module(m.graph, plan, lo);
  auto tiled = [&](const DeviceProgramOptions& po) {
    std::map<int64_t, bool> tc;  // work-groups -> on tensor cores
    for (auto& k : print_device_program(km, po).kernels) {
      UNSCOPED_INFO(k.name << " " << k.form << " groups " << k.groups << " tensor cores " << k.tensor_cores);
      if (k.form == "tiled_gemm") tc[k.groups] = k.tensor_cores;
    }
    return tc;
  };
  DeviceProgramOptions po;
  CHECK(tiled(po) == std::map<int64_t, bool>{{4, false}, {512, false}});  // fp32: R = 1 and R = 4
  po.tensor_cores = true;
  CHECK(tiled(po) == std::map<int64_t, bool>{{4, false}, {512, true}});
  po.tensor_core_min_groups = 0;
  CHECK(tiled(po) == std::map<int64_t, bool>{{1, true}, {512, true}});
}
