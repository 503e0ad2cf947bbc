#include "sdk/conversation.h"

namespace tophat {

Conversation::Conversation(Client& client, v1::GenerateRequest options)
    : client_(client), options_(std::move(options)) {
  options_.clear_input();
  options_.clear_request_id();  // each turn is its own request
}

absl::StatusOr<GenerateResult> Conversation::Say(
    const std::string& message,
    const std::function<void(const v1::GenerateResponse&)>& on_update) {
  v1::GenerateRequest request = options_;
  const std::string prompt = transcript_ + message;
  request.set_prompt(prompt);
  absl::StatusOr<GenerateResult> result = client_.Generate(request, on_update);
  if (result.ok() && (result->finish_reason == v1::FINISH_REASON_STOP ||
                      result->finish_reason == v1::FINISH_REASON_LENGTH)) {
    transcript_ = prompt + result->text;
  }
  return result;
}

}  // namespace tophat
