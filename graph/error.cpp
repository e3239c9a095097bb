#include "graph/error.h"

namespace nnfuse {

const char* error_kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::Parse: return "ParseError";
    case ErrorKind::Model: return "ModelError";
    case ErrorKind::Unsupported: return "UnsupportedError";
    case ErrorKind::Shape: return "ShapeError";
    case ErrorKind::Invalid: return "InvalidArgument";
    case ErrorKind::Runtime: return "RuntimeError";
    case ErrorKind::Io: return "IoError";
  }
  return "Error";
}

static std::string format(ErrorKind kind, const std::string& message, const ErrorContext& c) {
  std::string where;
  if (!c.file.empty()) {
    where = c.file;
    if (c.line > 0) {
      where += ":" + std::to_string(c.line);
      if (c.col > 0) where += ":" + std::to_string(c.col);
    }
  }
  std::string node;
  if (!c.node.empty() || !c.op.empty()) {
    node = "node '" + c.node + "'";
    if (!c.op.empty()) node += " (op " + c.op + (c.opset ? ", opset " + std::to_string(c.opset) : "") + ")";
  }
  std::string prefix = where;
  if (!node.empty()) prefix += (prefix.empty() ? "" : ": ") + node;
  return prefix.empty() ? message : prefix + ": " + message;
}

Error::Error(ErrorKind kind, std::string message, ErrorContext ctx)
    : std::runtime_error(format(kind, message, ctx)), kind_(kind), ctx_(std::move(ctx)), detail_(std::move(message)) {}

void fail(ErrorKind kind, const std::string& message, const ErrorContext& ctx) { throw Error(kind, message, ctx); }

void rethrow_in(const Error& e, const ErrorContext& outer) {
  ErrorContext c = e.context();
  if (c.file.empty()) c.file = outer.file;
  if (c.node.empty() && c.op.empty()) c.node = outer.node, c.op = outer.op, c.opset = outer.opset;
  throw Error(e.kind(), e.detail(), c);
}

}  // namespace nnfuse
