#include "device_agent/choices.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"

namespace tophat {

void RunEach(int64_t n, int64_t at_once, const std::function<void(int64_t)>& each) {
  std::atomic<int64_t> next = 0;
  const auto work = [&] {
    for (int64_t i = next++; i < n; i = next++) each(i);
  };
  std::vector<std::thread> others;
  for (int64_t w = 1; w < std::min(n, at_once); ++w) others.emplace_back(work);
  work();
  for (std::thread& other : others) other.join();
}

KeptPrompts KeepPrompts(Agent& agent, const std::vector<ChoicePlan>& choices, int64_t n,
                        int64_t at_once, const std::string& caller,
                        const std::function<bool()>& client_gone) {
  const size_t prompts = n > 0 ? choices.size() / static_cast<size_t>(n) : 0;
  KeptPrompts kept(prompts);
  if (n < 2) return kept;
  RunEach(static_cast<int64_t>(prompts), at_once, [&](int64_t p) {
    kept[p] = agent.KeepPrompt(choices[p * n].generate, caller, client_gone);
  });
  return kept;
}

v1::GenerateResponse GenerateChoice(Agent& agent, const KeptPrompts& kept, const ChoicePlan& choice,
                                    const std::function<bool(const TokenEvent&)>& on_tokens,
                                    const std::string& caller,
                                    const std::function<bool()>& client_gone) {
  const std::optional<Agent::KeptPrompt>& prompt = kept[choice.prompt];
  return prompt ? agent.GenerateChoice(choice.generate, *prompt, on_tokens, caller, client_gone)
                : agent.Generate(choice.generate, on_tokens, caller, client_gone);
}

void ForgetKeptPrompts(Agent& agent, const KeptPrompts& kept, int64_t n,
                       std::vector<v1::GenerateResponse>& done) {
  for (size_t p = 0; p < kept.size(); ++p) {
    if (!kept[p]) continue;
    agent.ForgetKeptPrompt(*kept[p]);
    done[p * static_cast<size_t>(n)].mutable_stats()->set_reused_prompt_tokens(
        static_cast<uint32_t>(kept[p]->reused_prompt_tokens));
  }
}

std::vector<ChoicePlan> ChoicesOf(const v1::GenerateRequest& request, int64_t n,
                                  const std::string& base_id) {
  std::vector<ChoicePlan> choices;
  for (int64_t j = 0; j < n; ++j) {
    ChoicePlan& choice = choices.emplace_back(ChoicePlan{.generate = request});
    choice.generate.clear_n();
    choice.generate.set_request_id(absl::StrCat(base_id, "-", j));
    if (request.sampling().has_seed()) {
      choice.generate.mutable_sampling()->set_seed(request.sampling().seed() +
                                                   static_cast<uint64_t>(j));
    }
  }
  return choices;
}

}  // namespace tophat
