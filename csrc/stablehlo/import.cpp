// Importing StableHLO modules written elsewhere (see import.h). A small scanner over MLIR's
// text form: it knows string literals and brackets, which is all that renaming symbols and
// reading @main's signature need (the ops themselves are passed through unparsed).
#include "stablehlo/import.h"

#include <cctype>
#include <set>
#include <stdexcept>

namespace torchtpu {
namespace {

[[noreturn]] void unsupported(const std::string& what) {
  throw std::invalid_argument("torchtpu: cannot import this StableHLO module: " + what);
}

// Index just past the string literal that opens at `i` (MLIR strings escape with '\').
size_t skip_string(const std::string& s, size_t i) {
  for (++i; i < s.size(); ++i) {
    if (s[i] == '\\') ++i;
    else if (s[i] == '"') return i + 1;
  }
  unsupported("an unterminated string literal");
}

bool opens(char c) { return c == '{' || c == '(' || c == '['; }
bool closes(char c) { return c == '}' || c == ')' || c == ']'; }

// Index of the bracket closing the one at `open` (any of {([ nest; strings are skipped).
size_t matching(const std::string& s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size();) {
    char c = s[i];
    if (c == '"') {
      i = skip_string(s, i);
      continue;
    }
    if (opens(c)) ++depth;
    if (closes(c) && --depth == 0) return i;
    ++i;
  }
  unsupported("unbalanced brackets");
}

size_t skip_space(const std::string& s, size_t i) {
  while (i < s.size()) {
    if (std::isspace(static_cast<unsigned char>(s[i]))) {
      ++i;
    } else if (s.compare(i, 2, "//") == 0) {
      size_t end = s.find('\n', i);
      i = end == std::string::npos ? s.size() : end + 1;
    } else {
      break;
    }
  }
  return i;
}

bool is_bare_id_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' || c == '.'; }

// A symbol reference at `i` ('@'): its name and the index past it.
std::pair<std::string, size_t> read_symbol(const std::string& s, size_t i) {
  size_t start = i + 1;
  if (start < s.size() && s[start] == '"') {
    size_t end = skip_string(s, start);
    return {s.substr(start + 1, end - start - 2), end};
  }
  size_t end = start;
  while (end < s.size() && is_bare_id_char(s[end])) ++end;
  return {s.substr(start, end - start), end};
}

// The module's top-level ops, each as its text (from its first character to the end of the
// line where its brackets close).
std::vector<std::string> top_level_ops(const std::string& text) {
  size_t i = skip_space(text, 0);
  if (i < text.size() && text[i] == '#')
    unsupported("attribute aliases (#...) before the module; lower it without debug info");
  if (text.compare(i, 6, "module") != 0) unsupported("the text does not start with a module");
  i = skip_space(text, i + 6);
  if (i < text.size() && text[i] == '@') i = skip_space(text, read_symbol(text, i).second);
  if (text.compare(i, 10, "attributes") == 0) {
    i = skip_space(text, i + 10);
    if (i >= text.size() || text[i] != '{') unsupported("malformed module attributes");
    i = skip_space(text, matching(text, i) + 1);
  }
  if (i >= text.size() || text[i] != '{') unsupported("the module has no body");
  size_t body_end = matching(text, i);
  if (text.find_first_not_of(" \t\r\n", body_end + 1) != std::string::npos)
    unsupported("text after the module (location aliases?); lower it without debug info");
  std::vector<std::string> ops;
  for (i = skip_space(text, i + 1); i < body_end; i = skip_space(text, i)) {
    size_t start = i;
    int depth = 0;
    while (i < body_end) {
      char c = text[i];
      if (c == '"') {
        i = skip_string(text, i);
        continue;
      }
      if (opens(c)) ++depth;
      if (closes(c)) --depth;
      ++i;
      if (depth == 0 && (c == '\n' || i == body_end)) break;
    }
    ops.push_back(text.substr(start, i - start));
  }
  return ops;
}

// "func.func [visibility] @name(...)": the name, or throws for any other op.
std::string function_name(const std::string& op) {
  if (op.compare(0, 9, "func.func") != 0) {
    size_t end = op.find_first_of(" \n(");
    unsupported("it has a top-level " + op.substr(0, end) + " (only func.func definitions can be imported)");
  }
  size_t at = op.find('@');
  if (at == std::string::npos) unsupported("a function without a name");
  return read_symbol(op, at).first;
}

// The op with every reference to a function of `defined` renamed to prefix + name.
std::string rename_symbols(const std::string& op, const std::set<std::string>& defined, const std::string& prefix) {
  std::string out;
  out.reserve(op.size() + 64);
  for (size_t i = 0; i < op.size();) {
    char c = op[i];
    if (c == '"') {
      size_t end = skip_string(op, i);
      out.append(op, i, end - i);
      i = end;
    } else if (c == '@') {
      auto [name, end] = read_symbol(op, i);
      if (defined.count(name)) out += "@\"" + prefix + name + "\"";
      else out.append(op, i, end - i);
      i = end;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

// "func.func public @x" and "func.func @x" become "func.func private @x".
std::string make_private(const std::string& op) {
  size_t i = skip_space(op, 9);
  for (const char* visibility : {"public", "private", "nested"}) {
    size_t n = std::char_traits<char>::length(visibility);
    if (op.compare(i, n, visibility) == 0) return "func.func private " + op.substr(skip_space(op, i + n));
  }
  return "func.func private " + op.substr(i);
}

// Entries of a comma-separated list (commas inside brackets, <> or strings do not split).
std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> items;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size();) {
    char c = s[i];
    if (c == '"') {
      i = skip_string(s, i);
      continue;
    }
    if (opens(c) || c == '<') ++depth;
    if (closes(c) || c == '>') --depth;
    if (c == ',' && depth == 0) {
      items.push_back(s.substr(start, i - start));
      start = i + 1;
    }
    ++i;
  }
  if (s.find_first_not_of(" \t\r\n") != std::string::npos) items.push_back(s.substr(start));
  return items;
}

// The type at the start of `entry` ("%arg0: tensor<2xf32> {attrs}" or "tensor<2xf32> {..}").
TensorType entry_type(std::string entry) {
  size_t i = skip_space(entry, 0);
  if (i < entry.size() && entry[i] == '%') {
    size_t colon = entry.find(':', i);
    if (colon == std::string::npos) unsupported("a malformed argument '" + entry + "'");
    i = skip_space(entry, colon + 1);
  }
  if (entry.compare(i, 7, "tensor<") != 0) {
    size_t end = entry.find_first_of(" \t\n{", i);
    unsupported("a function argument or result of type " + entry.substr(i, end - i) + " (only tensors)");
  }
  int depth = 0;
  size_t end = i;
  for (; end < entry.size(); ++end) {
    if (entry[end] == '<') ++depth;
    if (entry[end] == '>' && --depth == 0) break;
  }
  return parse_tensor_type(entry.substr(i, end - i + 1));
}

// @main's argument and result types.
void read_signature(const std::string& main, ImportedModule* module) {
  size_t at = main.find('@');
  size_t open = main.find('(', read_symbol(main, at).second);
  size_t close = matching(main, open);
  for (const std::string& arg : split_list(main.substr(open + 1, close - open - 1)))
    module->arguments.push_back(entry_type(arg));
  size_t arrow = skip_space(main, close + 1);
  if (main.compare(arrow, 2, "->") != 0) unsupported("@main returns nothing");
  size_t r = skip_space(main, arrow + 2);
  if (main[r] == '(') {
    size_t r_close = matching(main, r);
    for (const std::string& result : split_list(main.substr(r + 1, r_close - r - 1)))
      module->results.push_back(entry_type(result));
  } else {
    module->results.push_back(entry_type(main.substr(r)));
  }
  if (module->results.empty()) unsupported("@main returns nothing");
}

DType element_type(const std::string& name) {
  static const std::pair<const char*, DType> table[] = {
      {"f32", DType::Float32}, {"f64", DType::Float64}, {"f16", DType::Float16}, {"bf16", DType::BFloat16},
      {"i1", DType::Bool},     {"i8", DType::Int8},     {"i16", DType::Int16},   {"i32", DType::Int32},
      {"i64", DType::Int64},   {"ui8", DType::UInt8},
  };
  for (const auto& [mlir, dtype] : table)
    if (name == mlir) return dtype;
  unsupported("element type " + name + " has no torch dtype that tpu tensors support");
}

}  // namespace

TensorType parse_tensor_type(const std::string& text) {
  if (text.compare(0, 7, "tensor<") != 0 || text.back() != '>') unsupported("'" + text + "' is not a tensor type");
  std::string inner = text.substr(7, text.size() - 8);
  if (inner.find(',') != std::string::npos) unsupported("tensor type '" + text + "' has an encoding");
  TensorType type;
  size_t i = 0;
  while (true) {
    size_t x = inner.find('x', i);
    if (x == std::string::npos) break;
    std::string dim = inner.substr(i, x - i);
    if (dim == "?") unsupported("tensor type '" + text + "' has a dynamic dimension");
    if (dim.empty() || dim.find_first_not_of("0123456789") != std::string::npos) break;
    type.shape.push_back(std::stoll(dim));
    i = x + 1;
  }
  type.dtype = element_type(inner.substr(i));
  return type;
}

ImportedModule import_module(const std::string& text, const std::string& prefix) {
  std::vector<std::string> ops = top_level_ops(text);
  std::set<std::string> defined;
  for (const std::string& op : ops) defined.insert(function_name(op));
  if (!defined.count("main")) unsupported("it has no @main function");
  ImportedModule module;
  module.entry = prefix + "main";
  for (const std::string& op : ops) {
    if (function_name(op) == "main") read_signature(op, &module);
    module.definitions += "  " + make_private(rename_symbols(op, defined, prefix));
    if (module.definitions.back() != '\n') module.definitions += '\n';
  }
  return module;
}

}  // namespace torchtpu
