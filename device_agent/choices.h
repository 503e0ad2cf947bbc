// A request's choices (the OpenAI API's `n`, GenerateRequest.n): each prompt computed once
// on the device and the cloud and kept (Agent::KeepPrompt), its choices forking it
// (Agent::GenerateChoice), run together so that the cloud batches them. Shared by the app
// service (agent_service.h) and the OpenAI endpoint (openai_server.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "device_agent/agent.h"
#include "tophat/v1/agent.pb.h"

namespace tophat {

// Runs each(0) .. each(n - 1), `at_once` of them at a time (this thread one of the
// workers), in order of index: a request's choices, which the cloud then batches.
void RunEach(int64_t n, int64_t at_once, const std::function<void(int64_t)>& each);

// One choice: its request to the agent and the prompt (an index into the request's) it
// answers.
struct ChoicePlan {
  v1::GenerateRequest generate;
  size_t prompt = 0;
};

// `n` choices of one prompt's request: copies of it (n cleared), choice j's request id
// `base_id`-j and its seed, if the request has one, the seed + j (as the OpenAI endpoint
// numbers them), so that each is reproducible on its own.
std::vector<ChoicePlan> ChoicesOf(const v1::GenerateRequest& request, int64_t n,
                                  const std::string& base_id);

// The prompts of a request's choices, `n` a prompt, each computed once for its choices to
// fork (Agent::KeepPrompt) when n > 1, `at_once` at a time: entry p is prompt p's, nullopt
// where its choices compute it each. Let go with ForgetKeptPrompts once the choices are done.
using KeptPrompts = std::vector<std::optional<Agent::KeptPrompt>>;
KeptPrompts KeepPrompts(Agent& agent, const std::vector<ChoicePlan>& choices, int64_t n,
                        int64_t at_once, const std::string& caller,
                        const std::function<bool()>& client_gone);

// Choice i: Generate, or a kept prompt's choice (Agent::GenerateChoice).
v1::GenerateResponse GenerateChoice(Agent& agent, const KeptPrompts& kept, const ChoicePlan& choice,
                                    const std::function<bool(const TokenEvent&)>& on_tokens,
                                    const std::string& caller,
                                    const std::function<bool()>& client_gone);

// Lets the kept prompts go. Usage's cached tokens are a prompt's, before this request: what
// computing the kept prompt reused, not what its choices took from it (set on each prompt's
// first choice in `done`).
void ForgetKeptPrompts(Agent& agent, const KeptPrompts& kept, int64_t n,
                       std::vector<v1::GenerateResponse>& done);

}  // namespace tophat
