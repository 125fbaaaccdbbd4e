// The serve task's OpenAI subset without a server: request parsing (the fields OpenAI's clients
// send by default accepted, anything else refused by name in OpenAI's error shape), the chat
// template, stop sequences, the streamed deltas, server-sent-event framing and the Prometheus
// text of /metrics.
#include "freeride/tasks/serve_openai.h"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "freeride/tasks/serve_metrics.h"
#include "gtest/gtest.h"

namespace freeride::serve {
namespace {

using nlohmann::json;

const ParseLimits kLimits{/*max_tokens_limit=*/64, /*model_name=*/"step_00000010"};

std::optional<ApiError> Parse(Endpoint e, const json& body, ParsedRequest* out) {
  return ParseRequest(e, body.dump(), kLimits, out);
}

TEST(ServeOpenAiTest, AcceptsWhatOpenAiClientsSendByDefault) {
  ParsedRequest r;
  const json body = {{"model", "step_00000010"},
                     {"prompt", "And"},
                     {"max_tokens", 5},
                     {"temperature", 0.5},
                     {"top_p", 1},
                     {"n", 1},
                     {"stream", false},
                     {"logprobs", nullptr},
                     {"echo", false},
                     {"stop", nullptr},
                     {"presence_penalty", 0},
                     {"frequency_penalty", 0},
                     {"best_of", 1},
                     {"logit_bias", json::object()},
                     {"user", "someone"},
                     {"suffix", nullptr},
                     {"seed", 7}};
  EXPECT_EQ(Parse(Endpoint::kCompletions, body, &r), std::nullopt);
  EXPECT_EQ(r.prompts, std::vector<std::string>{"And"});
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.temperature, 0.5);
  EXPECT_EQ(r.seed, 7u);
  EXPECT_FALSE(r.stream);
  EXPECT_TRUE(r.stop.empty());
}

TEST(ServeOpenAiTest, ReadsStreamStopListPromptsAndN) {
  ParsedRequest r;
  EXPECT_EQ(Parse(Endpoint::kCompletions,
                  {{"prompt", {"a", "b"}},
                   {"stream", true},
                   {"stream_options", {{"include_usage", true}}},
                   {"stop", "\n"},
                   {"n", 2}},
                  &r),
            std::nullopt);
  EXPECT_EQ(r.prompts, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(r.n, 2);
  ParsedRequest list;
  EXPECT_EQ(Parse(Endpoint::kCompletions, {{"prompt", "a"}, {"stop", {"x", "yz"}}}, &list),
            std::nullopt);
  EXPECT_EQ(list.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_EQ(list.max_tokens, 16);  // OpenAI's default
}

// The field at fault is named in `param`, with the status and code OpenAI uses.
void ExpectRefused(Endpoint e, const json& body, int status, const std::string& param,
                   const std::string& words, const std::string& code = "") {
  ParsedRequest r;
  const std::optional<ApiError> error = Parse(e, body, &r);
  ASSERT_TRUE(error.has_value()) << body.dump();
  EXPECT_EQ(error->status, status) << body.dump();
  EXPECT_EQ(error->param, param) << body.dump();
  EXPECT_NE(error->message.find(words), std::string::npos) << error->message;
  EXPECT_EQ(error->code, code) << body.dump();
}

TEST(ServeOpenAiTest, RefusesNonDefaultUnsupportedAndUnknownFieldsByName) {
  const Endpoint c = Endpoint::kCompletions;
  ExpectRefused(c, {{"prompt", "a"}, {"echo", true}}, 400, "echo", "not supported",
                "unsupported_parameter");
  ExpectRefused(c, {{"prompt", "a"}, {"logprobs", 2}}, 400, "logprobs", "not supported",
                "unsupported_parameter");
  ExpectRefused(c, {{"prompt", "a"}, {"presence_penalty", 0.5}}, 400, "presence_penalty",
                "not supported", "unsupported_parameter");
  ExpectRefused(c, {{"prompt", "a"}, {"top_p", 0.9}}, 400, "top_p", "not supported",
                "unsupported_parameter");
  ExpectRefused(c, {{"prompt", "a"}, {"best_of", 3}}, 400, "best_of", "not supported",
                "unsupported_parameter");
  ExpectRefused(c, {{"prompt", "a"}, {"bogus", 1}}, 400, "bogus",
                "Unrecognized request argument supplied: bogus");
  ExpectRefused(c, {{"prompt", "a"}, {"max_tokens", 65}}, 400, "max_tokens", "[1, 64]");
  ExpectRefused(c, {{"prompt", "a"}, {"max_tokens", 0}}, 400, "max_tokens", "[1, 64]");
  ExpectRefused(c, {{"prompt", "a"}, {"stop", {"a", "b", "c", "d", "e"}}}, 400, "stop",
                "at most 4");
  ExpectRefused(c, {{"prompt", "a"}, {"stop", ""}}, 400, "stop", "non-empty");
  ExpectRefused(c, {{"prompt", {1, 2}}}, 400, "prompt", "token arrays are not supported");
  ExpectRefused(c, {{"max_tokens", 4}}, 400, "prompt", "'prompt' is required");
  ExpectRefused(c, {{"prompt", "a"}, {"model", "gpt-4"}}, 404, "model", "does not exist",
                "model_not_found");
  ExpectRefused(c, {{"prompt", {"a", "b", "c"}}, {"n", 6}}, 400, "n", "at most 16");
  ParsedRequest r;
  const std::optional<ApiError> not_json = ParseRequest(c, "{not json", kLimits, &r);
  ASSERT_TRUE(not_json.has_value());
  EXPECT_EQ(not_json->message, "the body is not a JSON object");
}

TEST(ServeOpenAiTest, ChatUsesThePlainTemplateAndStopsAtTheNextUserTurn) {
  ParsedRequest r;
  const json messages = {{{"role", "system"}, {"content", "Be brief."}},
                         {{"role", "user"}, {"content", "Who made light?"}},
                         {{"role", "assistant"}, {"content", "God."}},
                         {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Why?"}}}}}};
  EXPECT_EQ(Parse(Endpoint::kChat,
                  {{"model", "step_00000010"}, {"messages", messages}, {"stop", "Amen"}}, &r),
            std::nullopt);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0],
            "System: Be brief.\nUser: Who made light?\nAssistant: God.\nUser: Why?\nAssistant:");
  EXPECT_EQ(r.stop, (std::vector<std::string>{"Amen", "\nUser:"}));
  EXPECT_EQ(r.max_tokens, -1);  // as many as fit
  ExpectRefused(Endpoint::kChat, {{"messages", {{{"role", "tool"}, {"content", "x"}}}}}, 400,
                "messages[0].role", "not supported");
  ExpectRefused(Endpoint::kChat, {{"messages", json::array()}}, 400, "messages", "non-empty");
  ExpectRefused(Endpoint::kChat, {{"messages", messages}, {"tools", {{{"type", "function"}}}}}, 400,
                "tools", "not supported", "unsupported_parameter");
  ExpectRefused(Endpoint::kChat, {{"messages", messages}, {"prompt", "a"}}, 400, "prompt",
                "Unrecognized request argument");
}

TEST(ServeOpenAiTest, FindsTheEarliestStopSequence) {
  EXPECT_EQ(FindStop("abc\nUser: x", {"\nUser:"}), 3u);
  EXPECT_EQ(FindStop("one two three", {"three", "two"}), 4u);
  EXPECT_EQ(FindStop("nothing here", {"x"}), std::string::npos);
  EXPECT_EQ(FindStop("anything", {}), std::string::npos);
}

TEST(ServeOpenAiTest, DeltasNeverSendWhatAStopSequenceOrAHalfCharacterMayTakeBack) {
  DeltaStream d({"\nUser:"}, /*trim_leading=*/false);
  EXPECT_EQ(d.Next("Hello"), "Hello");
  EXPECT_EQ(d.Next("Hello world\n"), " world");  // "\n" may begin "\nUser:"
  EXPECT_EQ(d.Next("Hello world\nUs"), "");
  EXPECT_EQ(d.Next("Hello world\nUsa"), "\nUsa");  // it did not
  // The model side cut the text before the stop sequence; the rest is what remains.
  EXPECT_EQ(d.Finish("Hello world\nUsa b"), " b");

  DeltaStream cut({"\nUser:"}, false);
  EXPECT_EQ(cut.Next("Fine.\nUse"), "Fine.");
  EXPECT_EQ(cut.Finish("Fine."), "");

  DeltaStream utf8({}, false);
  const std::string e_acute = "\xc3\xa9";
  EXPECT_EQ(utf8.Next("caf" + e_acute.substr(0, 1)), "caf");
  EXPECT_EQ(utf8.Next("caf" + e_acute), e_acute);

  DeltaStream chat({}, /*trim_leading=*/true);
  EXPECT_EQ(chat.Next(" "), "");
  EXPECT_EQ(chat.Next(" In the"), "In the");
  EXPECT_EQ(chat.Finish(" In the beginning"), " beginning");
  EXPECT_EQ(ChoiceText(Endpoint::kChat, "  In"), "In");
  EXPECT_EQ(ChoiceText(Endpoint::kCompletions, "  In"), "  In");
}

TEST(ServeOpenAiTest, ServerSentEventsAndBodiesHaveOpenAiShapes) {
  const ResponseMeta meta{Endpoint::kCompletions, "cmpl-3", "m", 100};
  const std::string event = SseData(ChunkJson(meta, 1, "hi", "", false));
  ASSERT_EQ(event.rfind("data: ", 0), 0u);
  ASSERT_EQ(event.substr(event.size() - 2), "\n\n");
  EXPECT_EQ(event.find('\n'), event.size() - 2);  // one line: JSON has no raw newline
  const json chunk = json::parse(event.substr(6));
  EXPECT_EQ(chunk["object"], "text_completion");
  EXPECT_EQ(chunk["choices"][0]["index"], 1);
  EXPECT_EQ(chunk["choices"][0]["text"], "hi");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");
  EXPECT_EQ(std::string(kSseKeepAlive).front(), ':');  // a comment, never data

  const ResponseMeta chat{Endpoint::kChat, "chatcmpl-3", "m", 100};
  const json first = ChunkJson(chat, 0, "", "", true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(ChunkJson(chat, 0, "", "stop", false)["choices"][0]["delta"], json::object());
  const json usage = UsageChunkJson(chat, 3, 4);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"],
            (json{{"prompt_tokens", 3}, {"completion_tokens", 4}, {"total_tokens", 7}}));

  const json answer = ResponseJson(chat, {{"God.", "stop", {1, 2}}}, 3, 2);
  EXPECT_EQ(answer["object"], "chat.completion");
  EXPECT_EQ(answer["choices"][0]["message"], (json{{"role", "assistant"}, {"content", "God."}}));
  EXPECT_EQ(answer["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(answer["usage"]["total_tokens"], 5);

  const json error = json::parse(ErrorBody({429, "full", "rate_limit_exceeded", "", "x"}));
  EXPECT_EQ(error, (json{{"error",
                          {{"message", "full"},
                           {"type", "rate_limit_exceeded"},
                           {"param", nullptr},
                           {"code", "x"}}}}));
  // A completion cut inside a UTF-8 character is still sent, the byte replaced.
  EXPECT_NO_THROW(Dump(json{{"text", std::string("caf\xc3")}}));

  const json models = ModelsJson("step_00000010", 5);
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "step_00000010");
  EXPECT_EQ(models["data"][0]["object"], "model");
}

TEST(ServeMetricsTest, PrometheusTextHasCountersHistogramsAndGauges) {
  Metrics m;
  m.CountRequest("/v1/completions", 200);
  m.CountRequest("/v1/completions", 200);
  m.CountRequest("/v1/completions", 400);
  m.CountRequest("say \"hi\"\n", 404);
  m.AddTokens(3, 0);
  m.AddTokens(0, 20);
  m.ObserveLatency(0.015625, 0.25);  // binary fractions: their sums print exactly
  m.ObserveLatency(0.1875, 200);
  Gauges g;
  g.queue = 2, g.active_slots = 1, g.slots = 4, g.rejected = 5, g.cancelled = 1;
  const std::string text = m.Prometheus(g);
  auto has = [&](const std::string& line) {
    EXPECT_NE(text.find("\n" + line + "\n"), std::string::npos) << line << "\n" << text;
  };
  has("# TYPE freeride_serve_requests_total counter");
  has("freeride_serve_requests_total{route=\"/v1/completions\",status=\"200\"} 2");
  has("freeride_serve_requests_total{route=\"/v1/completions\",status=\"400\"} 1");
  has("freeride_serve_requests_total{route=\"say \\\"hi\\\"\\n\",status=\"404\"} 1");
  has("freeride_serve_prompt_tokens_total 3");
  has("freeride_serve_completion_tokens_total 20");
  has("# TYPE freeride_serve_time_to_first_token_seconds histogram");
  has("freeride_serve_time_to_first_token_seconds_bucket{le=\"0.01\"} 0");
  has("freeride_serve_time_to_first_token_seconds_bucket{le=\"0.025\"} 1");
  has("freeride_serve_time_to_first_token_seconds_bucket{le=\"0.25\"} 2");
  has("freeride_serve_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2");
  has("freeride_serve_time_to_first_token_seconds_count 2");
  has("freeride_serve_time_to_first_token_seconds_sum 0.203125");
  // Beyond the last bound: only in +Inf.
  has("freeride_serve_request_duration_seconds_bucket{le=\"120\"} 1");
  has("freeride_serve_request_duration_seconds_bucket{le=\"+Inf\"} 2");
  has("freeride_serve_request_duration_seconds_sum 200.25");
  has("freeride_serve_queue_depth 2");
  has("freeride_serve_slots_active 1");
  has("freeride_serve_slots 4");
  has("freeride_serve_rejected_total 5");
  has("freeride_serve_cancelled_total 1");
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.rfind("# HELP freeride_serve_requests_total", 0), 0u);
}

}  // namespace
}  // namespace freeride::serve
