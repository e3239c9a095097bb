// Parser of the rule language (grammar in rules/README.md): a small tokenizer and a recursive
// descent parser that reports `file:line:col: expected X, found Y`.
#include <cctype>
#include <fstream>
#include <sstream>

#include "graph/op_registry.h"
#include "rewrite/rule.h"

namespace nnfuse {

namespace {

struct Token {
  enum class Kind { Ident, Number, String, Sym, End };
  Kind kind = Kind::End;
  std::string text;
  double number = 0;
  bool is_int = false;
  int line = 0, col = 0;
  size_t offset = 0;
};

std::string describe(const Token& t) {
  switch (t.kind) {
    case Token::Kind::End: return "end of file";
    case Token::Kind::String: return "string \"" + t.text + "\"";
    case Token::Kind::Number: return "number " + t.text;
    case Token::Kind::Ident: return "'" + t.text + "'";
    default: return "'" + t.text + "'";
  }
}

class Lexer {
 public:
  Lexer(const std::string& text, const std::string& file) : s_(text), file_(file) {}

  std::vector<Token> run() {
    std::vector<Token> out;
    for (;;) {
      skip_space();
      Token t;
      t.line = line_;
      t.col = col_;
      t.offset = i_;
      if (i_ >= s_.size()) {
        out.push_back(t);
        return out;
      }
      char c = s_[i_];
      bool neg_number = c == '-' && i_ + 1 < s_.size() && (std::isdigit(uc(s_[i_ + 1])) || s_[i_ + 1] == '.') &&
                        !out.empty() && !(out.back().kind == Token::Kind::Ident || out.back().kind == Token::Kind::Number ||
                                          out.back().text == ")" || out.back().text == "]");
      if (std::isalpha(uc(c)) || c == '_') {
        size_t j = i_;
        // Rule names may contain '-' and '.' (`rule exp-product:`); elsewhere identifiers are C-like.
        bool rule_name = !out.empty() && out.back().kind == Token::Kind::Ident && out.back().text == "rule";
        while (j < s_.size() && (std::isalnum(uc(s_[j])) || s_[j] == '_' || (rule_name && (s_[j] == '-' || s_[j] == '.')))) ++j;
        t.kind = Token::Kind::Ident;
        t.text = s_.substr(i_, j - i_);
        advance(j - i_);
      } else if (std::isdigit(uc(c)) || neg_number || (c == '.' && i_ + 1 < s_.size() && std::isdigit(uc(s_[i_ + 1])))) {
        size_t j = i_ + (c == '-' ? 1 : 0);
        bool is_int = true;
        while (j < s_.size() && (std::isdigit(uc(s_[j])) || s_[j] == '.' || s_[j] == 'e' || s_[j] == 'E' ||
                                 ((s_[j] == '-' || s_[j] == '+') && (s_[j - 1] == 'e' || s_[j - 1] == 'E')))) {
          if (!std::isdigit(uc(s_[j]))) is_int = false;
          ++j;
        }
        t.kind = Token::Kind::Number;
        t.text = s_.substr(i_, j - i_);
        t.is_int = is_int;
        try {
          size_t used = 0;
          t.number = std::stod(t.text, &used);
          if (used != t.text.size()) throw std::invalid_argument("x");
        } catch (const std::exception&) {
          fail(ErrorKind::Parse, "expected a number, found '" + t.text + "'", {file_, t.line, t.col});
        }
        advance(j - i_);
      } else if (c == '"') {
        size_t j = i_ + 1;
        while (j < s_.size() && s_[j] != '"' && s_[j] != '\n') ++j;
        if (j >= s_.size() || s_[j] != '"') fail(ErrorKind::Parse, "expected '\"' closing the string, found end of line", {file_, t.line, t.col});
        t.kind = Token::Kind::String;
        t.text = s_.substr(i_ + 1, j - i_ - 1);
        advance(j + 1 - i_);
      } else {
        static const char* two[] = {"=>", "==", "!=", "<=", ">="};
        t.kind = Token::Kind::Sym;
        for (auto* op : two)
          if (s_.compare(i_, 2, op) == 0) t.text = op;
        if (t.text.empty()) {
          if (std::string("()<>,=:[]$*!").find(c) == std::string::npos)
            fail(ErrorKind::Parse, std::string("expected a rule, term or guard, found '") + c + "'", {file_, t.line, t.col});
          t.text = std::string(1, c);
        }
        advance(t.text.size());
      }
      out.push_back(t);
    }
  }

 private:
  static unsigned char uc(char c) { return static_cast<unsigned char>(c); }
  void advance(size_t n) {
    for (size_t k = 0; k < n; ++k) {
      if (s_[i_] == '\n') {
        ++line_;
        col_ = 1;
      } else {
        ++col_;
      }
      ++i_;
    }
  }
  void skip_space() {
    while (i_ < s_.size()) {
      if (s_[i_] == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') advance(1);
      } else if (std::isspace(uc(s_[i_]))) {
        advance(1);
      } else {
        break;
      }
    }
  }
  const std::string& s_;
  const std::string& file_;
  size_t i_ = 0;
  int line_ = 1, col_ = 1;
};

class Parser {
 public:
  Parser(const std::string& text, const std::string& file) : text_(text), file_(file), toks_(Lexer(text, file).run()) {}

  RuleSet parse_file() {
    RuleSet rs;
    std::set<std::string> names;
    while (peek().kind != Token::Kind::End) {
      Rule r = parse_rule();
      if (!names.insert(r.name).second)
        fail(ErrorKind::Parse, "rule '" + r.name + "' is defined twice in this file", {file_, r.line, 1});
      rs.rules.push_back(std::move(r));
    }
    return rs;
  }

 private:
  const Token& peek(size_t k = 0) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  Token next() { return toks_[std::min(pos_++, toks_.size() - 1)]; }
  bool is_sym(const std::string& s, size_t k = 0) const { return peek(k).kind == Token::Kind::Sym && peek(k).text == s; }
  [[noreturn]] void expected(const std::string& what) const {
    const Token& t = peek();
    fail(ErrorKind::Parse, "expected " + what + ", found " + describe(t), {file_, t.line, t.col});
  }
  void expect_sym(const std::string& s) {
    if (!is_sym(s)) expected("'" + s + "'");
    next();
  }
  std::string expect_ident(const std::string& what) {
    if (peek().kind != Token::Kind::Ident) expected(what);
    return next().text;
  }

  Rule parse_rule() {
    if (!(peek().kind == Token::Kind::Ident && peek().text == "rule")) expected("'rule'");
    Token start = next();
    Rule r;
    r.file = file_;
    r.line = start.line;
    r.name = expect_ident("a rule name");
    expect_sym(":");
    r.pattern = parse_term(false);
    if (r.pattern.kind != RuleTerm::Kind::Op) {
      fail(ErrorKind::Parse, "rule '" + r.name + "': expected an op term as the pattern, found " + r.pattern.str(),
           {file_, r.pattern.line, r.pattern.col});
    }
    expect_sym("=>");
    r.replacement = parse_term(true);
    if (peek().kind == Token::Kind::Ident && peek().text == "where") {
      next();
      r.guards.push_back(parse_guard());
      while (is_sym(",")) {
        next();
        r.guards.push_back(parse_guard());
      }
    }
    if (!(peek().kind == Token::Kind::End || (peek().kind == Token::Kind::Ident && peek().text == "rule")))
      expected(r.guards.empty() ? "'where', 'rule' or end of file" : "',', 'rule' or end of file");
    r.text = text_.substr(start.offset, peek().offset - start.offset);
    while (!r.text.empty() && std::isspace(static_cast<unsigned char>(r.text.back()))) r.text.pop_back();
    check_ops(r, r.pattern);
    check_ops(r, r.replacement);
    return r;
  }

  void check_ops(const Rule& r, const RuleTerm& t) {
    if (t.kind == RuleTerm::Kind::Op) {
      const OpSchema* s = OpRegistry::global().find("", t.name);
      if (!s) fail(ErrorKind::Parse, "rule '" + r.name + "': unknown op '" + t.name + "' (not in the op registry)", {file_, t.line, t.col});
      // A pattern that gives an op more or fewer inputs than any version of it takes never
      // matches; a replacement that does builds an invalid node.
      const int n = int(t.args.size());
      if (n < s->min_inputs || (s->max_inputs >= 0 && n > s->max_inputs))
        fail(ErrorKind::Parse, "rule '" + r.name + "': " + t.name + " takes " +
                                   (s->max_inputs == s->min_inputs ? std::to_string(s->min_inputs)
                                    : s->max_inputs < 0        ? std::to_string(s->min_inputs) + " or more"
                                                               : std::to_string(s->min_inputs) + " to " + std::to_string(s->max_inputs)) +
                                   " inputs, the rule gives it " + std::to_string(n),
             {file_, t.line, t.col});
    }
    for (auto& a : t.args) check_ops(r, a);
  }

  // term := [IDENT ':'] OP ['<' attrs '>'] '(' [term {',' term}] ')' | IDENT | NUMBER | func '(' exprs ')'
  RuleTerm parse_term(bool replacement) {
    RuleTerm t;
    const Token& tok = peek();
    t.line = tok.line;
    t.col = tok.col;
    if (tok.kind == Token::Kind::Number) {
      t.kind = RuleTerm::Kind::Const;
      t.value = next().number;
      return t;
    }
    if (tok.kind != Token::Kind::Ident) expected("a term (op, variable or number)");
    std::string name = next().text;
    if (is_sym(":")) {
      next();
      RuleTerm inner = parse_term(replacement);
      if (inner.kind != RuleTerm::Kind::Op) expected("an op term after '" + name + ":'");
      inner.binding = name;
      return inner;
    }
    bool upper = std::isupper(static_cast<unsigned char>(name[0]));
    if (upper && (is_sym("(") || is_sym("<"))) {
      t.kind = RuleTerm::Kind::Op;
      t.name = name;
      if (is_sym("<")) {
        next();
        for (;;) {
          RuleAttr a;
          if (is_sym("*")) {
            next();
            a.copy_all = true;
            a.name = expect_ident("the name of a bound op term after '*'");
          } else {
            a.name = expect_ident("an attribute name");
            expect_sym("=");
            a.value = parse_expr();
          }
          t.attrs.push_back(std::move(a));
          if (is_sym(",")) {
            next();
            continue;
          }
          if (is_sym(">")) break;
          expected("',' or '>'");
        }
        next();
      }
      expect_sym("(");
      if (!is_sym(")")) {
        for (;;) {
          t.args.push_back(parse_term(replacement));
          if (is_sym(",")) {
            next();
            continue;
          }
          break;
        }
      }
      expect_sym(")");
      return t;
    }
    if (!upper && is_sym("(")) {
      if (!replacement) expected("a variable, number or op term (functions are allowed in replacements only)");
      t.kind = RuleTerm::Kind::Call;
      t.name = name;
      next();
      if (!is_sym(")")) {
        for (;;) {
          t.call_args.push_back(parse_expr());
          if (!is_sym(",")) break;
          next();
        }
      }
      expect_sym(")");
      return t;
    }
    if (upper) expected("'(' after op '" + name + "'");
    t.kind = RuleTerm::Kind::Var;
    t.name = name;
    return t;
  }

  RuleExpr parse_guard() {
    if (peek().kind == Token::Kind::Ident && peek().text == "not") {
      RuleExpr e;
      e.kind = RuleExpr::Kind::Not;
      e.line = peek().line;
      e.col = peek().col;
      next();
      e.args.push_back(parse_guard());
      return e;
    }
    RuleExpr lhs = parse_expr();
    static const std::set<std::string> cmps = {"==", "!=", "<", ">", "<=", ">="};
    if (peek().kind == Token::Kind::Sym && cmps.count(peek().text)) {
      RuleExpr e;
      e.kind = RuleExpr::Kind::Compare;
      e.line = peek().line;
      e.col = peek().col;
      e.text = next().text;
      e.args.push_back(std::move(lhs));
      e.args.push_back(parse_expr());
      return e;
    }
    return lhs;
  }

  // expr := NUMBER | STRING | '[' exprs ']' | '$' IDENT | IDENT ['(' exprs ')']
  RuleExpr parse_expr() {
    RuleExpr e;
    const Token& t = peek();
    e.line = t.line;
    e.col = t.col;
    if (t.kind == Token::Kind::Number) {
      e.kind = RuleExpr::Kind::Number;
      e.number = t.number;
      e.is_int = t.is_int;
      next();
    } else if (t.kind == Token::Kind::String) {
      e.kind = RuleExpr::Kind::String;
      e.text = next().text;
    } else if (is_sym("[")) {
      next();
      e.kind = RuleExpr::Kind::List;
      if (!is_sym("]")) {
        for (;;) {
          e.args.push_back(parse_expr());
          if (!is_sym(",")) break;
          next();
        }
      }
      expect_sym("]");
    } else if (is_sym("$")) {
      next();
      e.kind = RuleExpr::Kind::AttrRef;
      e.text = expect_ident("an attribute binding name after '$'");
    } else if (t.kind == Token::Kind::Ident) {
      e.text = next().text;
      if (is_sym("(")) {
        next();
        e.kind = RuleExpr::Kind::Call;
        if (!is_sym(")")) {
          for (;;) {
            e.args.push_back(parse_expr());
            if (!is_sym(",")) break;
            next();
          }
        }
        expect_sym(")");
      } else {
        e.kind = RuleExpr::Kind::Ident;
      }
    } else {
      expected("a value (number, string, [list], $binding, variable or function call)");
    }
    return e;
  }

  const std::string& text_;
  std::string file_;
  std::vector<Token> toks_;
  size_t pos_ = 0;
};

std::string expr_str(const RuleExpr& e) {
  switch (e.kind) {
    case RuleExpr::Kind::Number: {
      std::ostringstream o;
      o << e.number;
      return o.str();
    }
    case RuleExpr::Kind::String: return "\"" + e.text + "\"";
    case RuleExpr::Kind::Ident: return e.text;
    case RuleExpr::Kind::AttrRef: return "$" + e.text;
    case RuleExpr::Kind::Not: return "not " + expr_str(e.args[0]);
    case RuleExpr::Kind::Compare: return expr_str(e.args[0]) + " " + e.text + " " + expr_str(e.args[1]);
    case RuleExpr::Kind::List:
    case RuleExpr::Kind::Call: {
      std::string s = e.kind == RuleExpr::Kind::List ? "[" : e.text + "(";
      for (size_t i = 0; i < e.args.size(); ++i) s += (i ? ", " : "") + expr_str(e.args[i]);
      return s + (e.kind == RuleExpr::Kind::List ? "]" : ")");
    }
  }
  return "?";
}

}  // namespace

std::string RuleTerm::str() const {
  switch (kind) {
    case Kind::Var: return name;
    case Kind::Const: {
      std::ostringstream o;
      o << value;
      return o.str();
    }
    case Kind::Call: {
      std::string s = name + "(";
      for (size_t i = 0; i < call_args.size(); ++i) s += (i ? ", " : "") + expr_str(call_args[i]);
      return s + ")";
    }
    case Kind::Op: {
      std::string s = binding.empty() ? "" : binding + ":";
      s += name;
      if (!attrs.empty()) {
        s += "<";
        for (size_t i = 0; i < attrs.size(); ++i)
          s += (i ? ", " : "") + (attrs[i].copy_all ? "*" + attrs[i].name : attrs[i].name + "=" + expr_str(attrs[i].value));
        s += ">";
      }
      s += "(";
      for (size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + args[i].str();
      return s + ")";
    }
  }
  return "?";
}

static int term_depth(const RuleTerm& t) {
  int d = 0;
  for (auto& a : t.args) d = std::max(d, term_depth(a));
  return t.kind == RuleTerm::Kind::Op ? d + 1 : 0;
}
int Rule::pattern_depth() const { return term_depth(pattern); }

RuleSet parse_rules(const std::string& text, const std::string& file) { return Parser(text, file).parse_file(); }

RuleSet load_rule_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(ErrorKind::Io, "cannot read rule file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_rules(ss.str(), path);
}

void merge_rules(RuleSet& base, const RuleSet& extra, std::vector<std::string>* warnings) {
  for (auto& r : extra.rules) {
    bool replaced = false;
    for (auto& b : base.rules)
      if (b.name == r.name) {
        if (warnings)
          warnings->push_back("rule '" + r.name + "' from " + r.file + ":" + std::to_string(r.line) + " replaces the rule of that name from " +
                              b.file + ":" + std::to_string(b.line));
        b = r;
        replaced = true;
        break;
      }
    if (!replaced) base.rules.push_back(r);
  }
}

}  // namespace nnfuse
