// tophat::Conversation: a conversation with the device's model through its agent, turn by
// turn. Each turn sends the conversation so far and the new message; the agent finds the
// earlier turns' positions in its conversation cache (on the device and, parked, on the
// cloud) by the prompt's token prefix, so only the new message is computed and sent
// (docs/openai.md "Conversations"). The answer is what a fresh request of the same text
// gives. Where the agent no longer holds the conversation the turn is a fresh request.
//
// Plain text, no chat template: the transcript grows by each message and its answer as
// written. Chat-formatted conversations go through the OpenAI endpoint, which applies the
// model's template. Not thread-safe: one turn at a time.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "sdk/client.h"

namespace tophat {

class Conversation {
 public:
  // `client` outlives the conversation. Every turn's request is `options` (sampling,
  // max_new_tokens, stop ids, ...) with the transcript as its prompt.
  explicit Conversation(Client& client, v1::GenerateRequest options = {});

  // Sends the transcript followed by `message`. When the agent answers (stop or length), the
  // message and the answer join the transcript; a failed or cancelled turn leaves it as it
  // was. Transport failures are an error status, as Client::Generate's.
  absl::StatusOr<GenerateResult> Say(
      const std::string& message,
      const std::function<void(const v1::GenerateResponse&)>& on_update = {});

  const std::string& transcript() const { return transcript_; }

 private:
  Client& client_;
  v1::GenerateRequest options_;
  std::string transcript_;
};

}  // namespace tophat
