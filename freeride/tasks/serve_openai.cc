#include "freeride/tasks/serve_openai.h"

#include <algorithm>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/json_fields.h"
#include "absl/strings/str_join.h"

namespace freeride::serve {
namespace {

using nlohmann::json;

ApiError Bad(const std::string& param, const std::string& message) {
  return ApiError{400, message, "invalid_request_error", param, ""};
}

// A field an OpenAI client may send that serve does not implement: accepted at its default
// value (what the clients send), refused by name otherwise.
std::optional<ApiError> Unsupported(const std::string& key, const json& v, bool is_default) {
  if (is_default) return std::nullopt;
  return ApiError{400,
                  absl::StrCat("'", key, "' = ", Dump(v),
                               " is not supported by this server (only its default value is; see "
                               "docs/serve.md)"),
                  "invalid_request_error", key, "unsupported_parameter"};
}

std::optional<ApiError> Int(const std::string& key, const json& v, int64_t lo, int64_t hi,
                            int64_t* out) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    return Bad(key, absl::StrCat("'", key, "' must be an integer in [", lo, ", ", hi, "], found ",
                                 Dump(v)));
  }
  *out = v.get<int64_t>();
  return std::nullopt;
}

bool IsZero(const json& v) { return v.is_null() || (v.is_number() && v.get<double>() == 0); }
bool IsFalse(const json& v) { return v.is_null() || v == false; }
bool IsEmpty(const json& v) { return v.is_null() || (v.is_object() && v.empty()); }

std::optional<ApiError> Stop(const json& v, std::vector<std::string>* out) {
  if (v.is_null()) return std::nullopt;
  const json list = v.is_string() ? json::array({v}) : v;
  if (!list.is_array() || list.size() > 4) {
    return Bad("stop", "'stop' must be a string or a list of at most 4 strings, found " + Dump(v));
  }
  for (const json& s : list) {
    if (!s.is_string() || s.get<std::string>().empty()) {
      return Bad("stop", "'stop' sequences must be non-empty strings, found " + Dump(s));
    }
    out->push_back(s.get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> Prompt(const json& v, std::vector<std::string>* out) {
  if (v.is_string()) {
    out->push_back(v.get<std::string>());
    return std::nullopt;
  }
  if (v.is_array() && !v.empty() &&
      std::all_of(v.begin(), v.end(), [](const json& p) { return p.is_string(); })) {
    for (const json& p : v) out->push_back(p.get<std::string>());
    return std::nullopt;
  }
  return Bad("prompt",
             "'prompt' must be a string or a non-empty list of strings (token arrays are not "
             "supported), found " +
                 Dump(v).substr(0, 200));
}

std::optional<ApiError> Messages(const json& v) {
  if (!v.is_array() || v.empty()) {
    return Bad("messages", "'messages' must be a non-empty list of {role, content} objects");
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const json& m = v[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return Bad(at, at + " must be an object with a 'role'");
    }
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "developer" && role != "user" && role != "assistant") {
      return Bad(at + ".role", absl::StrCat(at, ".role = \"", role,
                                            "\" is not supported (system, developer, user, "
                                            "assistant: tools are not)"));
    }
    for (const auto& [key, unused] : m.items()) {
      if (key != "role" && key != "content" && key != "name") {
        return Bad(at + "." + key, absl::StrCat(at, ".", key, " is not supported"));
      }
    }
    const json content = m.value("content", json());
    bool ok = content.is_string();
    if (content.is_array()) {
      ok = std::all_of(content.begin(), content.end(), [](const json& part) {
        return part.is_object() && JsonStringOr(part, "type", "") == "text" && part.contains("text") &&
               part["text"].is_string();
      });
    }
    if (!ok) {
      return Bad(
          at + ".content",
          at + ".content must be a string or a list of {\"type\": \"text\", \"text\"} parts");
    }
  }
  return std::nullopt;
}

std::string ContentText(const json& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string text;
  for (const json& part : content) text += part["text"].get<std::string>();
  return text;
}

bool Utf8Continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Bytes at the end of `text` that begin a UTF-8 character not yet whole.
size_t IncompleteUtf8(std::string_view text) {
  for (size_t back = 1; back <= std::min<size_t>(3, text.size()); ++back) {
    const auto c = static_cast<unsigned char>(text[text.size() - back]);
    if (Utf8Continuation(c)) continue;
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

// The longest end of `text` that is the beginning of a stop sequence.
size_t StopPrefix(std::string_view text, const std::vector<std::string>& stops) {
  size_t longest = 0;
  for (const std::string& s : stops) {
    for (size_t n = std::min(text.size(), s.size() - 1); n > longest; --n) {
      if (text.substr(text.size() - n) == std::string_view(s).substr(0, n)) {
        longest = n;
        break;
      }
    }
  }
  return longest;
}

}  // namespace

std::string ErrorBody(const ApiError& e) {
  auto or_null = [](const std::string& s) { return s.empty() ? json() : json(s); };
  return Dump(json{{"error",
                    {{"message", e.message},
                     {"type", e.type},
                     {"param", or_null(e.param)},
                     {"code", or_null(e.code)}}}}) +
         "\n";
}

std::optional<ApiError> ParseRequest(Endpoint endpoint, const std::string& body,
                                     const ParseLimits& limits, ParsedRequest* out) {
  const json request = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object()) {
    return Bad("", "the body is not a JSON object");
  }
  const bool chat = endpoint == Endpoint::kChat;
  const char* required = chat ? "messages" : "prompt";
  if (!request.contains(required)) {
    return Bad(required, absl::StrCat("'", required, "' is required"));
  }
  if (chat) out->max_tokens = -1;
  int64_t seed = static_cast<int64_t>(out->seed), best_of = 1;
  using Check = std::function<std::optional<ApiError>(const std::string&, const json&)>;
  const auto ignored = [](const std::string&, const json&) { return std::nullopt; };
  const auto max_tokens = [&](const std::string& k, const json& v) {
    return Int(k, v, 1, limits.max_tokens_limit, &out->max_tokens);
  };
  std::map<std::string, Check> fields = {
      {"model",
       [&](const std::string& k, const json& v) -> std::optional<ApiError> {
         if (v.is_string() && (limits.model_name.empty() || v == limits.model_name)) {
           return std::nullopt;
         }
         return ApiError{
             404,
             absl::StrCat("The model ", Dump(v), " does not exist; this server serves \"",
                          limits.model_name, "\" (GET /v1/models)"),
             "invalid_request_error", k, "model_not_found"};
       }},
      {"max_tokens", max_tokens},
      {"temperature",
       [&](const std::string& k, const json& v) -> std::optional<ApiError> {
         if (v.is_null()) return std::nullopt;
         if (!v.is_number() || v.get<double>() < 0 || v.get<double>() > 100) {
           return Bad(k, "'temperature' must be a number in [0, 100], found " + Dump(v));
         }
         out->temperature = v.get<double>();
         return std::nullopt;
       }},
      {"top_k", [&](const std::string& k,
                    const json& v) { return Int(k, v, 0, int64_t{1} << 24, &out->top_k); }},
      {"seed",
       [&](const std::string& k, const json& v) { return Int(k, v, 0, int64_t{1} << 62, &seed); }},
      {"n", [&](const std::string& k,
                const json& v) { return Int(k, v, 1, limits.max_choices, &out->n); }},
      {"stream",
       [&](const std::string& k, const json& v) -> std::optional<ApiError> {
         if (!v.is_null() && !v.is_boolean()) return Bad(k, "'stream' must be true or false");
         out->stream = v == true;
         return std::nullopt;
       }},
      {"stream_options",
       [&](const std::string& k, const json& v) -> std::optional<ApiError> {
         if (v.is_null()) return std::nullopt;
         if (!v.is_object() || (v.contains("include_usage") && !v["include_usage"].is_boolean())) {
           return Bad(k, "'stream_options' must be {\"include_usage\": true|false}");
         }
         out->include_usage = v.value("include_usage", false);
         return std::nullopt;
       }},
      {"stop", [&](const std::string&, const json& v) { return Stop(v, &out->stop); }},
      {"top_p",
       [](const std::string& k, const json& v) {
         return Unsupported(k, v, v.is_null() || (v.is_number() && v.get<double>() == 1));
       }},
      {"presence_penalty",
       [](const std::string& k, const json& v) { return Unsupported(k, v, IsZero(v)); }},
      {"frequency_penalty",
       [](const std::string& k, const json& v) { return Unsupported(k, v, IsZero(v)); }},
      {"logit_bias",
       [](const std::string& k, const json& v) { return Unsupported(k, v, IsEmpty(v)); }},
      {"logprobs",
       [](const std::string& k, const json& v) { return Unsupported(k, v, IsFalse(v)); }},
      {"user", ignored},
  };
  if (chat) {
    fields["messages"] = [](const std::string&, const json& v) { return Messages(v); };
    fields["max_completion_tokens"] = max_tokens;
    fields["top_logprobs"] = [](const std::string& k, const json& v) {
      return Unsupported(k, v, IsZero(v));
    };
    fields["response_format"] = [](const std::string& k, const json& v) {
      return Unsupported(k, v, v.is_null() || v == json{{"type", "text"}});
    };
    fields["tools"] = [](const std::string& k, const json& v) {
      return Unsupported(k, v, v.is_null() || v == json::array());
    };
    fields["tool_choice"] = [](const std::string& k, const json& v) {
      return Unsupported(k, v, v.is_null() || v == "none");
    };
    fields["store"] = [](const std::string& k, const json& v) {
      return Unsupported(k, v, IsFalse(v));
    };
    fields["parallel_tool_calls"] = ignored;  // without tools it means nothing
    fields["metadata"] = ignored;
    fields["service_tier"] = ignored;
  } else {
    fields["prompt"] = [&](const std::string&, const json& v) { return Prompt(v, &out->prompts); };
    fields["best_of"] = [&](const std::string& k, const json& v) {
      return Int(k, v, 1, limits.max_choices, &best_of);
    };
    fields["echo"] = [](const std::string& k, const json& v) {
      return Unsupported(k, v, IsFalse(v));
    };
    fields["suffix"] = [](const std::string& k, const json& v) {
      return Unsupported(k, v, v.is_null() || v == "");
    };
  }
  for (const auto& [key, value] : request.items()) {
    const auto field = fields.find(key);
    if (field == fields.end()) {
      std::vector<std::string> known;
      for (const auto& [name, unused] : fields) known.push_back(name);
      return Bad(key, absl::StrCat("Unrecognized request argument supplied: ", key,
                                   " (this server reads ", absl::StrJoin(known, ", "), ")"));
    }
    if (std::optional<ApiError> e = field->second(key, value)) return e;
  }
  if (best_of != 1 && best_of != out->n) {
    return Unsupported("best_of", request["best_of"], false);
  }
  out->seed = static_cast<uint64_t>(seed);
  if (chat) {
    out->prompts = {ChatPrompt(request["messages"])};
    out->stop.push_back(kChatStop);
  }
  if (static_cast<int64_t>(out->prompts.size()) * out->n > limits.max_choices) {
    return Bad("n", absl::StrCat("prompts × n = ", out->prompts.size() * out->n,
                                 " choices; at most ", limits.max_choices, " in one request"));
  }
  return std::nullopt;
}

std::string ChatPrompt(const json& messages) {
  static const std::map<std::string, std::string> kRole = {
      {"system", "System"}, {"developer", "System"}, {"user", "User"}, {"assistant", "Assistant"}};
  std::string prompt;
  for (const json& m : messages) {
    absl::StrAppend(&prompt, kRole.at(m["role"].get<std::string>()), ": ",
                    ContentText(m.value("content", json(""))), "\n");
  }
  return prompt + "Assistant:";
}

size_t FindStop(std::string_view text, const std::vector<std::string>& stops) {
  size_t first = std::string_view::npos;
  for (const std::string& s : stops) first = std::min(first, text.find(s));
  return first;
}

std::string_view DeltaStream::Visible(std::string_view text) const {
  if (!trim_leading_) return text;
  const size_t start = text.find_first_not_of(" \t\r\n");
  return start == std::string_view::npos ? std::string_view() : text.substr(start);
}

std::string DeltaStream::Next(std::string_view text) {
  const std::string_view v = Visible(text);
  const size_t safe = v.size() - std::max(IncompleteUtf8(v), StopPrefix(v, stops_));
  if (safe <= sent_) return "";
  std::string delta(v.substr(sent_, safe - sent_));
  sent_ = safe;
  return delta;
}

std::string DeltaStream::Finish(std::string_view final_text) {
  const std::string_view v = Visible(final_text);
  std::string rest = sent_ < v.size() ? std::string(v.substr(sent_)) : "";
  sent_ = v.size();
  return rest;
}

std::string ChoiceText(Endpoint endpoint, std::string_view text) {
  if (endpoint != Endpoint::kChat) return std::string(text);
  const size_t start = text.find_first_not_of(" \t\r\n");
  return start == std::string_view::npos ? "" : std::string(text.substr(start));
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string SseData(const json& j) { return "data: " + Dump(j) + "\n\n"; }

json UsageJson(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

namespace {

json Head(const ResponseMeta& meta, const char* object) {
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

const char* ChunkObject(Endpoint e) {
  return e == Endpoint::kChat ? "chat.completion.chunk" : "text_completion";
}

}  // namespace

json ResponseJson(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                  int64_t prompt_tokens, int64_t completion_tokens) {
  const bool chat = meta.endpoint == Endpoint::kChat;
  json out = Head(meta, chat ? "chat.completion" : "text_completion");
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    json c{{"index", i}, {"finish_reason", choices[i].finish_reason}, {"logprobs", nullptr}};
    if (chat) {
      c["message"] = {{"role", "assistant"}, {"content", choices[i].text}};
    } else {
      c["text"] = choices[i].text;
      c["tokens"] = choices[i].tokens;  // an extension: the ids, as `freeride sample` writes them
    }
    list.push_back(std::move(c));
  }
  out["choices"] = std::move(list);
  out["usage"] = UsageJson(prompt_tokens, completion_tokens);
  return out;
}

json ChunkJson(const ResponseMeta& meta, int64_t index, const std::string& text,
               const std::string& finish_reason, bool first) {
  json out = Head(meta, ChunkObject(meta.endpoint));
  json c{{"index", index},
         {"finish_reason", finish_reason.empty() ? json() : json(finish_reason)},
         {"logprobs", nullptr}};
  if (meta.endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && finish_reason.empty())) delta["content"] = text;
    c["delta"] = std::move(delta);
  } else {
    c["text"] = text;
  }
  out["choices"] = json::array({std::move(c)});
  return out;
}

json UsageChunkJson(const ResponseMeta& meta, int64_t prompt_tokens, int64_t completion_tokens) {
  json out = Head(meta, ChunkObject(meta.endpoint));
  out["choices"] = json::array();
  out["usage"] = UsageJson(prompt_tokens, completion_tokens);
  return out;
}

json ModelsJson(const std::string& model, int64_t created) {
  return {{"object", "list"},
          {"data", json::array({{{"id", model},
                                 {"object", "model"},
                                 {"created", created},
                                 {"owned_by", "freeride"}}})}};
}

}  // namespace freeride::serve
