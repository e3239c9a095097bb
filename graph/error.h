#pragma once
// One exception type for every user-facing failure. Each error carries the place at fault
// (file, line:col, node, op, opset, shape) so that the CLI and the Python bindings can print a
// single clear line, and tests can check which place was named.
#include <stdexcept>
#include <string>

namespace nnfuse {

enum class ErrorKind {
  Parse,        // rule/pipeline/model file syntax (file:line:col)
  Model,        // malformed model: bad protobuf, dangling edge, cycle, wrong arity, ...
  Unsupported,  // op, opset or dtype we do not implement
  Shape,        // shape or dtype inference failed / inconsistent
  Invalid,      // API misuse or invalid argument (bad feed, unknown target, ...)
  Runtime,      // failure while executing (kernel, toolchain, I/O)
  Io            // file cannot be read or written
};

const char* error_kind_name(ErrorKind k);

struct ErrorContext {
  std::string file;
  int line = 0;      // 1-based; 0 = unknown
  int col = 0;       // 1-based; 0 = unknown
  std::string node;  // node name (or "#id" when unnamed)
  std::string op;    // op type
  int opset = 0;
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, ErrorContext ctx = {});
  ErrorKind kind() const { return kind_; }
  const ErrorContext& context() const { return ctx_; }
  // The message without the location prefix.
  const std::string& detail() const { return detail_; }

 private:
  ErrorKind kind_;
  ErrorContext ctx_;
  std::string detail_;
};

// Convenience builders: throw_if style keeps call sites short.
[[noreturn]] void fail(ErrorKind kind, const std::string& message, const ErrorContext& ctx = {});
// Rethrows `e` with the fields of its context that are empty (file, node, op, opset) taken from
// `outer`: an error raised below a node or a file (a tensor too large, an attribute of the wrong
// type) names them too, and what it already names is kept.
[[noreturn]] void rethrow_in(const Error& e, const ErrorContext& outer);

}  // namespace nnfuse
