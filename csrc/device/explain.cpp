// TORCHTPU_EXPLAIN / torchtpu.explain(): the listeners of the routing code's reports (see explain.h).
#include "device/explain.h"

#include <c10/core/DispatchKey.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <map>
#include <mutex>
#include <set>
#include <tuple>

namespace torchtpu {
namespace explain_detail {

std::atomic<bool> listening{false};

namespace {

std::mutex g_mutex;
std::vector<std::string> g_print_ops;  // "all", "aten::add" or "aten::add.Tensor"
void (*g_print)(const std::string&) = nullptr;
std::set<std::tuple<std::string, std::string, std::string>> g_printed;
bool g_collecting = false;
std::vector<ExplainedRoute> g_collected;
std::map<std::tuple<std::string, std::string, std::string>, size_t> g_collected_index;
thread_local std::string t_decline_reason;

bool listed(const std::string& op) {
  for (const std::string& wanted : g_print_ops) {
    if (wanted == "all" || wanted == op) return true;
    if (op.size() > wanted.size() && op.compare(0, wanted.size(), wanted) == 0 && op[wanted.size()] == '.') return true;
  }
  return false;
}

void update_listening() { listening = g_collecting || (g_print && !g_print_ops.empty()); }

}  // namespace

}  // namespace explain_detail

void report_route(const std::string& op, const std::string& route, const std::string& detail) {
  using namespace explain_detail;
  std::string line;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto key = std::make_tuple(op, route, detail);
    if (g_collecting) {
      auto [it, fresh] = g_collected_index.emplace(key, g_collected.size());
      if (fresh) g_collected.push_back(ExplainedRoute{op, route, detail, 0});
      ++g_collected[it->second].count;
    }
    if (!g_print || !listed(op) || !g_printed.insert(key).second) return;
    line = "torchtpu explain: " + op + ": " + route + (detail.empty() ? "" : " (" + detail + ")");
  }
  g_print(line);  // outside the lock: it may take the GIL
}

namespace explain_detail {

void note_decline(const char* reason) { t_decline_reason = reason; }

}  // namespace explain_detail

std::string take_decline_reason() {
  std::string reason;
  reason.swap(explain_detail::t_decline_reason);
  return reason;
}

namespace {

// "csrc/lowering/elementwise.cpp" from however the compiler named the file.
std::string project_path(const char* file) {
  std::string path = file;
  auto at = path.rfind("csrc/");
  return at == std::string::npos ? path : path.substr(at);
}

// For functionalization's copies of views ("aten::view_copy" for aten::view, "aten::select_copy.int"),
// the view op the user called; "" for any other op.
std::string functionalized_view(const std::string& op) {
  auto dot = op.find('.', op.find("::"));
  std::string base = op.substr(0, dot), overload = dot == std::string::npos ? "" : op.substr(dot + 1);
  const std::string suffix = "_copy";
  if (base.size() <= suffix.size() || base.compare(base.size() - suffix.size(), suffix.size(), suffix) != 0) return "";
  std::string view = base.substr(0, base.size() - suffix.size());
  auto handle = c10::Dispatcher::singleton().findSchema({view, overload});
  if (!handle) return "";
  for (const auto& ret : handle->schema().returns())
    if (ret.alias_info() && !ret.alias_info()->isWrite()) return view + (overload.empty() ? "" : "." + overload);
  return "";
}

}  // namespace

void report_lowered(const std::string& op, const LoweringRule* rule, const char* how) {
  std::string detail = std::string("rule ") + rule->function_name + ", " + project_path(rule->file);
  if (*rule->param_text) detail += std::string(", param ") + rule->param_text;
  std::string view = functionalized_view(op);
  if (!view.empty()) detail += "; functionalization's copy of the view " + view;
  std::string route = how ? std::string("lowered: ") + how : std::string("lowered");
  report_route(op, route, detail);
}

void explain_print(std::vector<std::string> ops, void (*print)(const std::string& line)) {
  std::lock_guard<std::mutex> lock(explain_detail::g_mutex);
  explain_detail::g_print_ops = std::move(ops);
  explain_detail::g_print = print;
  explain_detail::g_printed.clear();
  explain_detail::update_listening();
}

void explain_start_collecting() {
  std::lock_guard<std::mutex> lock(explain_detail::g_mutex);
  explain_detail::g_collecting = true;
  explain_detail::g_collected.clear();
  explain_detail::g_collected_index.clear();
  explain_detail::update_listening();
}

std::vector<ExplainedRoute> explain_stop_collecting() {
  std::lock_guard<std::mutex> lock(explain_detail::g_mutex);
  explain_detail::g_collecting = false;
  explain_detail::g_collected_index.clear();
  explain_detail::update_listening();
  return std::move(explain_detail::g_collected);
}

}  // namespace torchtpu
