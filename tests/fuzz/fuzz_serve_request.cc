// The serve task's request bodies (/v1/completions and /v1/chat/completions): parsed, or an
// OpenAI-shaped error; its error body is made as the server makes it.
#include "freeride/tasks/serve_openai.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  freeride::serve::ParseLimits limits;
  limits.model_name = "gpt2";
  for (freeride::serve::Endpoint endpoint : {freeride::serve::Endpoint::kCompletions, freeride::serve::Endpoint::kChat}) {
    freeride::serve::ParsedRequest parsed;
    std::optional<freeride::serve::ApiError> error =
        freeride::serve::ParseRequest(endpoint, body, limits, &parsed);
    if (error) freeride::serve::ErrorBody(*error);
  }
  return 0;
}
