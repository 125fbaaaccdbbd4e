// The OpenAI API subset the `serve` task speaks, as pure functions the HTTP side (serve_http.cc)
// calls and the unit tests check: parsing /v1/completions and /v1/chat/completions bodies (the
// fields OpenAI's clients send by default are accepted at their default values, and refused by
// name with any other), the chat template for a base model, stop sequences, the streamed text
// deltas (never a byte that a stop sequence may take back, nor half a UTF-8 character), the
// response, chunk and error bodies, and server-sent-event framing. docs/serve.md documents them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace freeride::serve {

enum class Endpoint { kCompletions, kChat };

// An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with `status`.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the field at fault; "" for none (null)
  std::string code;   // "" for none (null)
};
std::string ErrorBody(const ApiError& e);

// The role lines of the chat template: each message as "System: ...", "User: ..." or
// "Assistant: ..." on a line of its own, then "Assistant:" for the reply.
inline constexpr char kChatStop[] = "\nUser:";

struct ParsedRequest {
  std::vector<std::string> prompts;  // for chat: the one templated conversation
  int64_t max_tokens = 16;           // -1: as many as fit, up to the limit (chat's default)
  double temperature = 1;
  int64_t top_k = 40;
  uint64_t seed = 1337;
  int64_t n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
  std::vector<std::string> stop;
};

struct ParseLimits {
  int64_t max_tokens_limit = 256;
  std::string model_name;    // the one `model` a request may name
  int64_t max_choices = 16;  // prompts × n in one request
};

// Reads the body of a request to `endpoint` into `out`, or returns why not.
std::optional<ApiError> ParseRequest(Endpoint endpoint, const std::string& body,
                                     const ParseLimits& limits, ParsedRequest* out);

// The conversation `messages` (already checked) as the chat template's prompt.
std::string ChatPrompt(const nlohmann::json& messages);

// Where the first of `stops` begins in `text` (the earliest), or npos.
size_t FindStop(std::string_view text, const std::vector<std::string>& stops);

// Turns one choice's growing text into the deltas a stream sends. Bytes that may still become
// a stop sequence, or that end inside a UTF-8 character, wait for the next text; with
// `trim_leading` (chat: the reply after "Assistant:") leading whitespace is never sent.
class DeltaStream {
 public:
  DeltaStream(std::vector<std::string> stops, bool trim_leading)
      : stops_(std::move(stops)), trim_leading_(trim_leading) {}
  // The new text that is safe to send, given everything generated so far.
  std::string Next(std::string_view text);
  // The rest, once the choice is done with `final_text` (already cut at its stop sequence).
  std::string Finish(std::string_view final_text);

 private:
  std::string_view Visible(std::string_view text) const;
  std::vector<std::string> stops_;
  bool trim_leading_;
  size_t sent_ = 0;
};

// The reply as the choice's text (chat: leading whitespace trimmed).
std::string ChoiceText(Endpoint endpoint, std::string_view text);

// JSON as sent: invalid UTF-8 (a completion cut inside a character) replaced, never thrown.
std::string Dump(const nlohmann::json& j);
// One server-sent event carrying `j`.
std::string SseData(const nlohmann::json& j);
inline constexpr char kSseDone[] = "data: [DONE]\n\n";
// A comment line: keeps a quiet stream's connection alive and is ignored by every client.
inline constexpr char kSseKeepAlive[] = ": keep-alive\n\n";

struct ResponseMeta {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id, model;
  int64_t created = 0;
};
struct ChoiceResult {
  std::string text;  // as returned (ChoiceText)
  std::string finish_reason;
  std::vector<int32_t> tokens;
};
nlohmann::json UsageJson(int64_t prompt_tokens, int64_t completion_tokens);
// The whole answer of a request that does not stream.
nlohmann::json ResponseJson(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                            int64_t prompt_tokens, int64_t completion_tokens);
// One streamed chunk of choice `index`: `text` new, `finish_reason` "" while it goes on; a
// chat's first chunk of a choice (`first`) carries the assistant role.
nlohmann::json ChunkJson(const ResponseMeta& meta, int64_t index, const std::string& text,
                         const std::string& finish_reason, bool first);
// The last chunk under stream_options.include_usage: no choices, the usage.
nlohmann::json UsageChunkJson(const ResponseMeta& meta, int64_t prompt_tokens,
                              int64_t completion_tokens);
// The answer to GET /v1/models.
nlohmann::json ModelsJson(const std::string& model, int64_t created);

}  // namespace freeride::serve
