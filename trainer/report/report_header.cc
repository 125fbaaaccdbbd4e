#include "trainer/report/report_header.h"

#include <toml++/toml.h>

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/json_fields.h"
#include "absl/strings/str_join.h"
#include "trainer/config/config.h"
#include "trainer/report/report_format.h"
#include "trainer/report/svg_plot.h"

namespace freeride {
namespace {

using nlohmann::json;

std::string Printed(const toml::node& node) {
  // toml++ prints 3e-3 as 0.0030000000000000001: the shortest text that reads back the same.
  if (const auto* f = node.as_floating_point()) {
    const double v = f->get();
    for (int digits = 1; digits <= 17; ++digits) {
      const std::string text = absl::StrFormat("%.*g", digits, v);
      if (std::strtod(text.c_str(), nullptr) == v) return text;
    }
  }
  std::ostringstream out;
  node.visit([&](const auto& n) { out << n; });
  return out.str();
}

void Flatten(const toml::table& table, const std::string& prefix,
             std::map<std::string, std::string>* out) {
  for (const auto& [key, node] : table) {
    const std::string name =
        absl::StrCat(prefix, prefix.empty() ? "" : ".", std::string(key.str()));
    if (const toml::table* t = node.as_table()) {
      Flatten(*t, name, out);
    } else if (const toml::array* a = node.as_array(); a && a->is_array_of_tables()) {
      for (size_t i = 0; i < a->size(); ++i) {
        Flatten(*a->get(i)->as_table(), absl::StrFormat("%s[%d]", name, i), out);
      }
    } else {
      (*out)[name] = Printed(node);
    }
  }
}

// One command-line word as a shell would need it quoted to be pasted back.
std::string ShellWord(const std::string& word) {
  if (!word.empty() && word.find_first_of(" \t\n'\"\\$`*?[]{}()<>|&;#~") == std::string::npos) {
    return word;
  }
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string RunDate(const RunFiles& run) {
  for (const json* start : run.Records("start")) {
    if (start->contains("time") && (*start)["time"].is_string()) return (*start)["time"];
  }
  if (run.run_info && run.run_info->contains("time")) return JsonStringOr(*run.run_info, "time", "");
  return "";
}

double WallSeconds(const RunFiles& run) {
  const json* last = run.Last("train");
  if (last == nullptr || !last->contains("elapsed_s") || !(*last)["elapsed_s"].is_number()) {
    return std::nan("");
  }
  return (*last)["elapsed_s"].get<double>();
}

std::string RunHeader(const RunFiles& run) {
  std::vector<std::pair<std::string, std::string>> rows;
  const std::string date = RunDate(run);
  if (!date.empty()) rows.push_back({"date", HtmlEscape(date)});
  const json info = run.run_info.value_or(json::object());
  auto text = [&](const char* key) {
    return info.contains(key) && info[key].is_string() ? info[key].get<std::string>() : "";
  };
  if (!text("commit").empty()) {
    std::string commit = text("commit");
    if (!text("version").empty()) absl::StrAppend(&commit, " (freeride ", text("version"), ")");
    rows.push_back({"commit", HtmlEscape(commit)});
  }
  if (!text("host").empty()) rows.push_back({"host", HtmlEscape(text("host"))});
  // Every start of the run: a resumed run keeps its earlier ones in run.json's "earlier".
  std::vector<json> starts;
  if (info.contains("earlier") && info["earlier"].is_array()) {
    for (const json& e : info["earlier"]) starts.push_back(e);
  }
  starts.push_back(info);
  std::vector<std::string> commands;
  for (const json& start : starts) {
    if (!start.is_object() || !start.contains("command") || !start["command"].is_array()) continue;
    std::vector<std::string> words;
    for (const json& w : start["command"]) {
      if (w.is_string()) words.push_back(ShellWord(w.get<std::string>()));
    }
    const std::string time = JsonStringOr(start, "time", "");
    commands.push_back(absl::StrCat(
        "<code>", HtmlEscape(absl::StrJoin(words, " ")), "</code>",
        starts.size() > 1 && !time.empty() ? absl::StrCat(" (", HtmlEscape(time), ")") : ""));
  }
  if (!commands.empty()) {
    rows.push_back(
        {commands.size() == 1 ? "command line" : "command lines", absl::StrJoin(commands, "<br>")});
  }
  if (info.contains("config_file")) {
    rows.push_back({"config", HtmlEscape(text("config_file").empty() ? "the embedded default"
                                                                     : text("config_file"))});
  }
  if (info.contains("overrides") && info["overrides"].is_array()) {
    std::vector<std::string> sets;
    for (const json& o : info["overrides"]) {
      if (o.is_string())
        sets.push_back(absl::StrCat("<code>", HtmlEscape(o.get<std::string>()), "</code>"));
    }
    rows.push_back({"overrides", sets.empty() ? "none" : absl::StrJoin(sets, " ")});
  }
  const double wall = WallSeconds(run);
  if (std::isfinite(wall)) {
    rows.push_back({"wall time", absl::StrCat(HumanNumber(wall, NumberKind::kSeconds),
                                              " of training (time stopped not counted)")});
  }
  if (rows.empty()) return "";
  std::string html = "<table class=\"header\">\n";
  for (const auto& [name, value] : rows) {
    absl::StrAppend(&html, "<tr><th class=\"text\">", name, "</th><td class=\"text\">", value,
                    "</td></tr>\n");
  }
  return html + "</table>\n";
}

std::map<std::string, std::string> FlattenToml(const std::string& text) {
  std::map<std::string, std::string> out;
  try {
    const toml::table root = toml::parse(text);
    Flatten(root, "", &out);
  } catch (const toml::parse_error&) {
    out.clear();
  }
  return out;
}

std::string ConfigSection(const RunFiles& run) {
  if (run.config_toml.empty()) return "";
  const std::map<std::string, std::string> mine = FlattenToml(run.config_toml);
  const std::map<std::string, std::string> defaults = FlattenToml(ConfigToToml(Config{}));
  std::string rows;
  int changed = 0;
  for (const auto& [key, value] : mine) {
    auto it = defaults.find(key);
    if (it != defaults.end() && it->second == value) continue;
    ++changed;
    absl::StrAppend(&rows, "<tr><td class=\"text\"><code>", HtmlEscape(key),
                    "</code></td><td class=\"text\">", HtmlEscape(value),
                    "</td><td class=\"text\">", it == defaults.end() ? "—" : HtmlEscape(it->second),
                    "</td></tr>\n");
  }
  std::string html = "<h2>Config</h2>\n";
  if (mine.empty()) {
    absl::StrAppend(&html,
                    "<p class=\"note\">config.toml does not parse as TOML: shown as it "
                    "is.</p>\n");
  } else if (changed == 0) {
    absl::StrAppend(&html, "<p>Every key has its default.</p>\n");
  } else {
    absl::StrAppendFormat(&html,
                          "<p>%d keys differ from the defaults (what a config that leaves a key "
                          "out gets):</p>\n<table class=\"config-diff\"><tr><th "
                          "class=\"text\">key</th><th class=\"text\">this run</th><th "
                          "class=\"text\">default</th></tr>\n%s</table>\n",
                          changed, rows);
  }
  return absl::StrCat(html, "<details><summary>The whole config.toml</summary><pre>",
                      HtmlEscape(run.config_toml), "</pre></details>\n");
}

}  // namespace freeride
