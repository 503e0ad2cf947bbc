#include "models/tokenizers/chat_template.h"

#include <algorithm>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "base/test_util.h"
#include "models/tokenizers/bpe_tokenizer.h"
#include "models/tokenizers/test_tokenizer_json.h"

namespace tophat {
namespace {

using testing::TempDir;
using testing::WriteBytes;
namespace tj = testing::tokenizer_json;

// Template sources in each family's shape (what the recogniser looks at: the control tokens
// the template writes, literal defaults); rendering is checked against Hugging Face's output
// for the real templates, written out by hand below.
constexpr const char* kLlama3Source =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
constexpr const char* kLlama31Source =
    "{{- bos_token }}{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}{{- \"Today Date: \" + date_string }}"
    "{{- system_message }}{{- \"<|eot_id|>\" }}";
// Qwen2's: a default system message written literally, the newline a real one (as in the
// decoded JSON string).
constexpr const char* kQwen2Source =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
// Qwen2.5's: the system message is an expression in one branch and a literal in the other.
constexpr const char* kQwen25Source =
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
    "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are "
    "Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}";
constexpr const char* kChatMlSource =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
constexpr const char* kMistralSource =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% endif %}{% endfor %}";

// The markup of Gemma 3's template (tests/gemma_model_test.py checks the whole one against
// transformers' rendering).
constexpr const char* kGemmaSource =
    "{{ bos_token }}{%- for message in loop_messages -%}{{ '<start_of_turn>' + role + '\\n' "
    "}}{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}{%- endfor -%}"
    "{{'<start_of_turn>model\\n'}}";

// Phi-3 mini's and 3.5's template (a role tag, a newline, the content, <|end|> and a newline;
// tokenizer_config.json's \n decoded to newlines), Phi-3's first one (BOS, Jinja's escapes,
// no system role) and Phi-4-mini's (no newlines, a tool layout not rendered).
constexpr const char* kPhi3Source =
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";
constexpr const char* kPhi3FirstSource =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}"
    "{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n' + '<|assistant|>' + "
    "'\\n'}}{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + "
    "'\\n'}}{% endif %}{% endfor %}";
constexpr const char* kPhi4MiniSource =
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
    "message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + "
    "'<|tool|>' + message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + "
    "message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}";

ChatTemplate Make(const char* source) {
  auto made = ChatTemplate::FromSource(source, "test");
  INFO(made.status().ToString());
  REQUIRE(made.ok());
  return *std::move(made);
}

RenderedChat RenderOk(const ChatTemplate& chat, const std::vector<ChatMessage>& messages) {
  auto rendered = chat.Render(messages);
  INFO(rendered.status().ToString());
  REQUIRE(rendered.ok());
  return *std::move(rendered);
}

std::vector<std::string> Specials(const RenderedChat& chat) {
  std::vector<std::string> out;
  for (const auto& piece : chat.pieces) {
    if (piece.special) out.push_back(piece.text);
  }
  return out;
}

TEST_CASE("Each family is recognised by its template's markup, and an unknown one is refused") {
  CHECK(Make(kLlama3Source).family() == ChatFamily::kLlama3);
  CHECK(Make(kLlama31Source).family() == ChatFamily::kLlama3);
  CHECK(Make(kQwen2Source).family() == ChatFamily::kChatMl);
  CHECK(Make(kChatMlSource).family() == ChatFamily::kChatMl);
  CHECK(Make(kMistralSource).family() == ChatFamily::kMistral);
  CHECK(Make(std::string(kToyChatTemplateSource).c_str()).family() == ChatFamily::kToy);
  CHECK(Make(kLlama3Source).turn_ends() == std::vector<std::string>{"<|eot_id|>"});
  CHECK(Make(kChatMlSource).turn_ends() == std::vector<std::string>{"<|im_end|>"});
  CHECK(Make(kMistralSource).turn_ends().empty());

  auto unknown = ChatTemplate::FromSource(
      "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}{% endfor %}",
      "/models/x/tokenizer_config.json");
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(unknown.status().message()),
             Catch::Contains("/models/x/tokenizer_config.json") &&
                 Catch::Contains("not guessed"));
}

TEST_CASE("Llama 3 renders as Hugging Face does: BOS, headers, trimmed content, the assistant's "
          "header open") {
  const RenderedChat chat = RenderOk(
      Make(kLlama3Source), {{"system", "You are terse."}, {"user", "  Hi there \n"}});
  CHECK(chat.bos);
  CHECK(chat.ToString() ==
        "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");

  // 3.1 always writes its system header, with the leading system message inside it.
  const RenderedChat v31 = RenderOk(Make(kLlama31Source), {{"user", "Hi"}});
  CHECK(v31.ToString() ==
        "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 26 Jul 2024\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const RenderedChat v31_system =
      RenderOk(Make(kLlama31Source), {{"system", "Be brief."}, {"user", "Hi"}});
  CHECK(v31_system.ToString().find("Today Date: 26 Jul 2024\n\nBe brief.<|eot_id|>") !=
        std::string::npos);
}

TEST_CASE("ChatML renders its default system message only where the template writes one") {
  const std::vector<ChatMessage> turn = {{"user", "Hi"}};
  CHECK(RenderOk(Make(kQwen2Source), turn).ToString() ==
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(RenderOk(Make(kQwen25Source), turn).ToString().starts_with(
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
      "assistant.<|im_end|>\n<|im_start|>user\nHi"));
  CHECK(RenderOk(Make(kChatMlSource), turn).ToString() ==
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // A system message of the caller's replaces the default.
  CHECK(RenderOk(Make(kQwen2Source), {{"system", "Be brief."}, {"user", "Hi"}}).ToString() ==
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  CHECK_FALSE(RenderOk(Make(kChatMlSource), turn).bos);
}

TEST_CASE("Mistral alternates user and assistant, and refuses what its template would") {
  const ChatTemplate mistral = Make(kMistralSource);
  const RenderedChat chat =
      RenderOk(mistral, {{"user", "a"}, {"assistant", "b"}, {"user", "c"}});
  CHECK(chat.bos);
  CHECK(chat.ToString() == "[INST] a [/INST]b</s>[INST] c [/INST]");
  CHECK(Specials(chat) == std::vector<std::string>{"</s>"});

  auto twice = mistral.Render(std::vector<ChatMessage>{{"user", "a"}, {"user", "b"}});
  REQUIRE_FALSE(twice.ok());
  CHECK_THAT(std::string(twice.status().message()),
             Catch::StartsWith("messages[1]") && Catch::Contains("alternate"));
  // This template has no system role (v0.1/v0.2 raise); one that places it (v0.3) gets it
  // before the last user message.
  auto system = mistral.Render(std::vector<ChatMessage>{{"system", "s"}, {"user", "a"}});
  REQUIRE_FALSE(system.ok());
  CHECK_THAT(std::string(system.status().message()), Catch::StartsWith("messages[0]"));
  const std::string with_system = std::string(kMistralSource) + "{# system #}";
  CHECK(RenderOk(Make(with_system.c_str()),
                 {{"system", "s"}, {"user", "a"}, {"assistant", "b"}, {"user", "c"}})
            .ToString() == "[INST] a [/INST]b</s>[INST] s\n\nc [/INST]");
  auto tool = mistral.Render(std::vector<ChatMessage>{{"tool", "x"}});
  REQUIRE_FALSE(tool.ok());
  CHECK_THAT(std::string(tool.status().message()), Catch::Contains("tool messages"));
}

// Phi-4's (14B) template as its tokenizer_config.json publishes it.
constexpr const char* kPhi4Source =
    "{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system"
    "<|im_sep|>' + message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}"
    "{{'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|>'}}{% elif "
    "(message['role'] == 'assistant') %}{{'<|im_start|>assistant<|im_sep|>' + "
    "message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}";

TEST_CASE("Phi-4 parts each role from its content with <|im_sep|>, nothing between turns") {
  const ChatTemplate phi4 = Make(kPhi4Source);
  CHECK(phi4.family() == ChatFamily::kChatMlImSep);
  CHECK(phi4.turn_ends() == std::vector<std::string>{"<|im_end|>"});
  CHECK_FALSE(phi4.tool_call_syntax().has_value());
  const RenderedChat chat = RenderOk(
      phi4, {{"system", "Be brief."}, {"user", " a\n"}, {"assistant", "b"}, {"user", "c"}});
  CHECK_FALSE(chat.bos);
  CHECK(chat.ToString() ==
        "<|im_start|>system<|im_sep|>Be brief.<|im_end|><|im_start|>user<|im_sep|> a\n"
        "<|im_end|><|im_start|>assistant<|im_sep|>b<|im_end|><|im_start|>user<|im_sep|>c"
        "<|im_end|><|im_start|>assistant<|im_sep|>");
  CHECK(Specials(chat).size() == 14);
  CHECK(Specials(chat)[1] == "<|im_sep|>");
  auto tool = phi4.Render(std::vector<ChatMessage>{{"user", "a"}, {"tool", "x"}});
  REQUIRE_FALSE(tool.ok());
  CHECK_THAT(std::string(tool.status().message()),
             Catch::Contains("(chatml_im_sep) has no tool-call layout"));
  // Phi-4-reasoning's template, which adds a thinking instruction, is not guessed.
  auto reasoning = ChatTemplate::FromSource(
      std::string(kPhi4Source) + "{{ '<think>' }}{{ '</think>' }}", "phi4r/tokenizer_config.json");
  REQUIRE_FALSE(reasoning.ok());
  CHECK_THAT(std::string(reasoning.status().message()),
             Catch::Contains("phi4r/tokenizer_config.json: chat_template writes <|im_sep|> and "
                             "<think>"));
}

TEST_CASE("Phi writes each turn between its role tag and <|end|>, with newlines in Phi-3's") {
  const std::vector<ChatMessage> messages = {
      {"system", "Be brief."}, {"user", "a"}, {"assistant", "b"}, {"user", "c"}};
  const ChatTemplate phi3 = Make(kPhi3Source);
  CHECK(phi3.family() == ChatFamily::kPhi);
  CHECK(phi3.turn_ends() == std::vector<std::string>{"<|end|>"});
  RenderedChat chat = RenderOk(phi3, messages);
  CHECK_FALSE(chat.bos);
  CHECK(chat.ToString() ==
        "<|system|>\nBe brief.<|end|>\n<|user|>\na<|end|>\n<|assistant|>\nb<|end|>\n"
        "<|user|>\nc<|end|>\n<|assistant|>\n");
  CHECK(Specials(chat) == std::vector<std::string>{"<|system|>", "<|end|>", "<|user|>", "<|end|>",
                                                   "<|assistant|>", "<|end|>", "<|user|>",
                                                   "<|end|>", "<|assistant|>"});

  const ChatTemplate phi4 = Make(kPhi4MiniSource);
  CHECK(phi4.family() == ChatFamily::kPhi);
  chat = RenderOk(phi4, messages);
  CHECK_FALSE(chat.bos);
  CHECK(chat.ToString() ==
        "<|system|>Be brief.<|end|><|user|>a<|end|><|assistant|>b<|end|><|user|>c<|end|>"
        "<|assistant|>");
  CHECK_FALSE(phi4.tool_call_syntax().has_value());

  // Phi-3's first template: BOS, the same turns, and no place for a system message.
  const ChatTemplate first = Make(kPhi3FirstSource);
  chat = RenderOk(first, {{"user", "a"}, {"assistant", "b"}, {"user", "c"}});
  CHECK(chat.bos);
  CHECK(chat.ToString() ==
        "<|user|>\na<|end|>\n<|assistant|>\nb<|end|>\n<|user|>\nc<|end|>\n<|assistant|>\n");
  auto system = first.Render(messages);
  REQUIRE_FALSE(system.ok());
  CHECK_THAT(std::string(system.status().message()),
             Catch::Contains("messages[0]: this model's chat template (Phi) has no system role"));
  auto other = phi3.Render(std::vector<ChatMessage>{{"user", "a"}, {"developer", "x"}});
  REQUIRE_FALSE(other.ok());
  CHECK_THAT(std::string(other.status().message()),
             Catch::Contains("messages[1]: role \"developer\": Phi's template takes system, "
                             "user and assistant"));
  auto tool = phi3.Render(std::vector<ChatMessage>{{"user", "a"}, {"tool", "x"}});
  REQUIRE_FALSE(tool.ok());
  CHECK_THAT(std::string(tool.status().message()),
             Catch::Contains("(phi) has no tool-call layout"));
}

TEST_CASE(
    "Gemma opens its first turn with the system text, names the assistant model and "
    "trims each turn") {
  const ChatTemplate gemma = Make(kGemmaSource);
  CHECK(gemma.family() == ChatFamily::kGemma);
  CHECK(gemma.turn_ends() == std::vector<std::string>{"<end_of_turn>"});
  const RenderedChat chat = RenderOk(
      gemma, {{"system", " Be brief. "}, {"user", " a\n"}, {"assistant", "b "}, {"user", "c"}});
  CHECK(chat.bos);
  CHECK(chat.ToString() ==
        "<start_of_turn>user\n Be brief. \n\na<end_of_turn>\n<start_of_turn>model\nb"
        "<end_of_turn>\n<start_of_turn>user\nc<end_of_turn>\n<start_of_turn>model\n");
  CHECK(Specials(chat) == std::vector<std::string>{"<start_of_turn>", "<end_of_turn>",
                                                   "<start_of_turn>", "<end_of_turn>",
                                                   "<start_of_turn>", "<end_of_turn>",
                                                   "<start_of_turn>"});
  // Turns alternate from user; roles past the first system are user and assistant only;
  // tools have no layout in its template.
  for (const std::vector<ChatMessage>& refused :
       {std::vector<ChatMessage>{{"assistant", "a"}},
        std::vector<ChatMessage>{{"user", "a"}, {"user", "b"}},
        std::vector<ChatMessage>{{"user", "a"}, {"system", "b"}}}) {
    auto rendered = gemma.Render(refused);
    REQUIRE_FALSE(rendered.ok());
    CHECK_THAT(std::string(rendered.status().message()), Catch::Contains("Gemma's template"));
  }
  auto tool = gemma.Render(std::vector<ChatMessage>{{"tool", "x"}});
  REQUIRE_FALSE(tool.ok());
  CHECK_THAT(std::string(tool.status().message()), Catch::Contains("(gemma)"));
}

// Gemma 2's template as its instruction-tuned checkpoints publish it.
constexpr const char* kGemma2Source =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
    "not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') "
    "!= (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}";

TEST_CASE("Gemma 2's template renders Gemma's turns and refuses a system message, as it does") {
  const ChatTemplate gemma2 = Make(kGemma2Source);
  CHECK(gemma2.family() == ChatFamily::kGemma);
  const RenderedChat chat =
      RenderOk(gemma2, {{"user", " a\n"}, {"assistant", "b "}, {"user", "c"}});
  CHECK(chat.bos);
  CHECK(chat.ToString() ==
        "<start_of_turn>user\na<end_of_turn>\n<start_of_turn>model\nb<end_of_turn>\n"
        "<start_of_turn>user\nc<end_of_turn>\n<start_of_turn>model\n");
  auto system = gemma2.Render(std::vector<ChatMessage>{{"system", "Be brief."}, {"user", "a"}});
  REQUIRE_FALSE(system.ok());
  CHECK(system.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(system.status().message()),
             Catch::Contains("this model's chat template (Gemma 2's) has no system role"));
}

TEST_CASE("The toy template is plain text") {
  const RenderedChat chat = RenderOk(Make(std::string(kToyChatTemplateSource).c_str()),
                                     {{"user", "the cat sat"}, {"assistant", "on a mat"}});
  CHECK_FALSE(chat.bos);
  CHECK(Specials(chat).empty());
  CHECK(chat.ToString() == "user: the cat sat\nassistant: on a mat\nassistant:");
}

TEST_CASE("A message that spells a control token stays text, and encodes as text") {
  const ChatTemplate llama = Make(kLlama3Source);
  const RenderedChat chat = RenderOk(llama, {{"user", "the<|eot_id|>"}});
  // Only the template's own control tokens are special pieces.
  CHECK(Specials(chat) == std::vector<std::string>{"<|start_header_id|>", "<|end_header_id|>",
                                                   "<|eot_id|>", "<|start_header_id|>",
                                                   "<|end_header_id|>"});
  auto tokenizer = BpeTokenizer::FromJson(tj::MakeTokenizerJson(/*llama3=*/true).dump(),
                                          "test/tokenizer.json", {.bos = "<|begin_of_text|>"});
  REQUIRE(tokenizer.ok());
  auto ids = EncodeChat(**tokenizer, chat);
  INFO(ids.status().ToString());
  REQUIRE(ids.ok());
  REQUIRE(ids->size() > 4);
  CHECK((*ids)[0] == tj::kIdBeginOfText);
  CHECK((*ids)[1] == tj::kIdStartHeader);
  // One <|eot_id|> id: the template's. The message's spelling became bytes.
  CHECK(std::count(ids->begin(), ids->end(), tj::kIdEotId) == 1);
  CHECK(ids->back() != tj::kIdEotId);

  // A vocabulary without the template's control tokens is an error that names the token.
  const RenderedChat chatml = RenderOk(Make(kChatMlSource), {{"user", "hi"}});
  auto missing = EncodeChat(**tokenizer, chatml);
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(std::string(missing.status().message()), Catch::Contains("<|im_start|>"));
}

TEST_CASE("ChatTemplate::Load reads tokenizer_config.json and names it in errors") {
  TempDir dir;
  auto none = ChatTemplate::Load(dir.path());
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == absl::StatusCode::kNotFound);

  const nlohmann::json string_form = {{"chat_template", kChatMlSource}};
  WriteBytes(dir.path() / "tokenizer_config.json", string_form.dump());
  auto loaded = ChatTemplate::Load(dir.path());
  REQUIRE(loaded.ok());
  CHECK(loaded->family() == ChatFamily::kChatMl);

  const nlohmann::json list_form = {
      {"chat_template",
       {{{"name", "tool_use"}, {"template", kChatMlSource}},
        {{"name", "default"}, {"template", kLlama3Source}}}}};
  WriteBytes(dir.path() / "tokenizer_config.json", list_form.dump());
  loaded = ChatTemplate::Load(dir.path());
  REQUIRE(loaded.ok());
  CHECK(loaded->family() == ChatFamily::kLlama3);

  WriteBytes(dir.path() / "tokenizer_config.json", R"({"bos_token": "<s>"})");
  none = ChatTemplate::Load(dir.path());
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(none.status().message()),
             Catch::Contains("tokenizer_config.json") && Catch::Contains("chat_template"));

  WriteBytes(dir.path() / "tokenizer_config.json", R"({"chat_template": "{{ messages }}"})");
  auto unknown = ChatTemplate::Load(dir.path());
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(std::string(unknown.status().message()), Catch::Contains("tokenizer_config.json"));
}

// The instructions by which the tool layouts are recognised, as the real templates write them
// (each inside one Jinja string there).
const std::string kLlama31ToolsSource =
    std::string(kLlama31Source) +
    "{{- \"Given the following functions, please respond with a JSON for a function call \" }}";
const std::string kQwen25ToolsSource =
    std::string(kQwen25Source) +
    "{{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user "
    "query.\\n\\n\" }}";

// A tool as an app sends it, keys in its order (not sorted), and a call to it.
const std::string kWeatherTool =
    R"({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", )"
    R"("parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})";
ChatMessage Calls(std::vector<std::string> cities) {
  ChatMessage message{.role = "assistant", .content = ""};
  for (const std::string& city : cities) {
    message.tool_calls.push_back({.id = "call_" + city,
                                  .name = "get_weather",
                                  .arguments = R"({"city":")" + city + "\"}"});
  }
  return message;
}
ChatMessage Answer(std::string content, std::string id) {
  return {.role = "tool", .content = std::move(content), .tool_call_id = std::move(id)};
}

TEST_CASE("Only the templates with a tool layout tophat renders take tools") {
  CHECK(Make(kLlama31ToolsSource.c_str()).tool_call_syntax().has_value());
  CHECK(Make(kQwen25ToolsSource.c_str()).tool_call_syntax().has_value());
  CHECK(Make(std::string(kToyChatTemplateSource).c_str()).tool_call_syntax().has_value());
  // Qwen3 writes Qwen2.5's instructions (without a default system message).
  CHECK(Make((kQwen25ToolsSource +
              "{{- '<think>' + r + '</think>' }}{%- if enable_thinking %}{%- endif %}")
                 .c_str())
            .tool_call_syntax()
            .has_value());
  // Llama 3.1 without its instructions, Llama 3, Qwen2, QwQ (the same instructions, another
  // layout) and Mistral have none.
  CHECK_FALSE(Make(kLlama31Source).tool_call_syntax().has_value());
  CHECK_FALSE(Make(kLlama3Source).tool_call_syntax().has_value());
  CHECK_FALSE(Make(kQwen2Source).tool_call_syntax().has_value());
  CHECK_FALSE(Make((kQwen25ToolsSource +
                    "{{- '<think>' + r + '</think>' }}{{- '<|im_start|>assistant\\n<think>\\n' }}")
                       .c_str())
                  .tool_call_syntax()
                  .has_value());
  CHECK_FALSE(Make(kMistralSource).tool_call_syntax().has_value());

  const std::vector<std::string> tools = {kWeatherTool};
  for (const char* source : {kLlama3Source, kQwen2Source, kMistralSource}) {
    auto refused = Make(source).Render(std::vector<ChatMessage>{{"user", "hi"}}, tools);
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(std::string(refused.status().message()),
               Catch::StartsWith("tools:") && Catch::Contains("no tool-call layout"));
    // A conversation that holds a call or an answer is refused the same way.
    auto answer = Make(source).Render(std::vector<ChatMessage>{{"user", "hi"}, Calls({"Oslo"})});
    CHECK_FALSE(answer.ok());
  }
}

TEST_CASE("Llama 3.1 writes tools into the first user message, a call as JSON and an answer as "
          "ipython, as its template does") {
  const ChatTemplate llama = Make(kLlama31ToolsSource.c_str());
  const std::vector<std::string> tools = {kWeatherTool};
  auto rendered = llama.Render(
      std::vector<ChatMessage>{{"system", "Be brief."}, {"user", " Weather in Paris? "},
                               Calls({"Paris"}), Answer("22 \"C\"", "call_Paris")},
      tools);
  INFO(rendered.status().ToString());
  REQUIRE(rendered.ok());
  // tojson(indent=4) of the tool, keys in the app's order; the answer a JSON string.
  CHECK(rendered->ToString() ==
        "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please "
        "respond with a JSON for a function call with its proper arguments that best answers "
        "the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
        "dictionary of argument name and its value}.Do not use variables.\n\n"
        "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n"
        "        \"description\": \"Weather in a city\",\n        \"parameters\": {\n"
        "            \"type\": \"object\",\n            \"properties\": {\n"
        "                \"city\": {\n                    \"type\": \"string\"\n"
        "                }\n            },\n            \"required\": [\n"
        "                \"city\"\n            ]\n        }\n    }\n}\n\n"
        "Weather in Paris?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
        "<|start_header_id|>ipython<|end_header_id|>\n\n\"22 \\\"C\\\"\"<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(Specials(*rendered).size() == 14);  // 3 per turn, 2 opening the answer

  // One call a message; a call's arguments must be JSON.
  auto two = llama.Render(std::vector<ChatMessage>{{"user", "x"}, Calls({"Oslo", "Rome"})});
  REQUIRE_FALSE(two.ok());
  CHECK_THAT(std::string(two.status().message()),
             Catch::StartsWith("messages[1]") && Catch::Contains("one tool call"));
  ChatMessage broken = Calls({"Oslo"});
  broken.tool_calls[0].arguments = "{\"city\":";
  auto bad = llama.Render(std::vector<ChatMessage>{{"user", "x"}, broken});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()),
             Catch::Contains("messages[1].tool_calls[0].function.arguments"));
  // Tools need a first user message to go into.
  auto alone = llama.Render(std::vector<ChatMessage>{{"system", "s"}}, tools);
  CHECK_FALSE(alone.ok());
}

TEST_CASE("Qwen2.5 writes tools into the system turn, calls in <tool_call> tags and a run of "
          "answers as one user turn, as its template does") {
  const ChatTemplate qwen = Make(kQwen25ToolsSource.c_str());
  const std::vector<std::string> tools = {kWeatherTool};
  auto rendered = qwen.Render(
      std::vector<ChatMessage>{{"user", "Weather in Paris and Rome?"},
                               Calls({"Paris", "Rome"}), Answer("22 C", "call_Paris"),
                               Answer("25 C", "call_Rome")},
      tools);
  INFO(rendered.status().ToString());
  REQUIRE(rendered.ok());
  CHECK(rendered->ToString() ==
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n" + kWeatherTool +
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
        "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", "
        "\"arguments\": {\"city\": \"Rome\"}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n22 C\n</tool_response>\n<tool_response>\n25 C\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n");
  // A system message of the caller's replaces the default, before the tools.
  auto system = qwen.Render(std::vector<ChatMessage>{{"system", "Be brief."}, {"user", "x"}}, tools);
  REQUIRE(system.ok());
  CHECK(system->ToString().starts_with("<|im_start|>system\nBe brief.\n\n# Tools\n"));
  CHECK(system->ToString().find("Be brief.", 30) == std::string::npos);

  // What the model writes for a call is what the template renders for one.
  const ToolCallSyntax syntax = *qwen.tool_call_syntax();
  CHECK(rendered->ToString().find("assistant\n" + syntax.open + "get_weather" + syntax.between +
                                  "{\"city\": \"Paris\"}" + syntax.close + *syntax.separator +
                                  syntax.open) != std::string::npos);
}

TEST_CASE("Tool calls are read back from what a model wrote, or the whole text is content") {
  const std::vector<std::string> names = {"get_weather", "get_time"};
  const ToolCallSyntax hermes = *Make(kQwen25ToolsSource.c_str()).tool_call_syntax();
  ToolCallReading read = ReadToolCalls(
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
      "\"arguments\": {}}\n</tool_call>\n",
      hermes, names);
  CHECK(read.content == "Let me look.");
  REQUIRE(read.calls.size() == 2);
  CHECK(read.calls[0].name == "get_weather");
  CHECK(read.calls[0].arguments == R"({"city":"Paris","days":2})");  // key order kept
  CHECK(read.calls[1].arguments == "{}");

  for (const char* text : {
           "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}\n"
           "</tool_call>",                                                     // not JSON
           "<tool_call>\n{\"name\": \"launch\", \"arguments\": {}}\n</tool_call>",  // no such tool
           "<tool_call>\n{\"name\": \"get_time\", \"arguments\": []}\n</tool_call>",  // not an object
           "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n",            // unclosed
           "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call> and then text",
       }) {
    INFO(text);
    read = ReadToolCalls(text, hermes, names);
    CHECK(read.calls.empty());
    CHECK(read.content == text);
  }
  CHECK(ReadToolCalls("It is sunny.", hermes, names).content == "It is sunny.");

  const ToolCallSyntax llama = *Make(kLlama31ToolsSource.c_str()).tool_call_syntax();
  read = ReadToolCalls(" {\"name\": \"get_time\", \"parameters\": {\"zone\": \"UTC\"}}\n",
                       llama, names);
  REQUIRE(read.calls.size() == 1);
  CHECK(read.content.empty());
  CHECK(read.calls[0].arguments == R"({"zone":"UTC"})");
  CHECK(ReadToolCalls("{\"a\": 1}", llama, names).calls.empty());
  CHECK(ReadToolCalls("It is {\"name\": \"get_time\"}", llama, names).calls.empty());
}

TEST_CASE("The toy template writes tools and calls in plain text, in its own syntax") {
  const ChatTemplate toy = Make(std::string(kToyChatTemplateSource).c_str());
  auto rendered = toy.Render(
      std::vector<ChatMessage>{{"user", "weather?"}, Calls({"Oslo"}), Answer("cold", "call_Oslo")},
      std::vector<std::string>{R"({"type": "function", "function": {"name": "get_weather"}})"});
  REQUIRE(rendered.ok());
  CHECK(rendered->ToString() ==
        "tools: [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}]\n"
        "user: weather?\nassistant: <tool_call>{\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"Oslo\"}}</tool_call>\ntool: cold\nassistant:");
}

}  // namespace
}  // namespace tophat

namespace tophat {
namespace {

// Qwen3's template in the parts the recogniser reads: ChatML, <think> blocks and the
// enable_thinking switch (its rendering is written out by hand below, from the template).
constexpr const char* kQwen3Source =
    "{%- for message in messages %}{%- if message.role == 'assistant' %}{%- if '</think>' in "
    "content %}{%- set reasoning_content = content.split('</think>')[0] %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content + "
    "'\\n</think>\\n\\n' + content }}{%- endif %}{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is "
    "defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}";
// QwQ's: the generation prompt opens the block; history keeps only what follows </think>.
constexpr const char* kQwqSource =
    "{%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}";

TEST_CASE("Qwen3's template thinks unless enable_thinking is false, and drops past reasoning",
          "[thinking]") {
  const ChatTemplate qwen3 = Make(kQwen3Source);
  CHECK(qwen3.family() == ChatFamily::kChatMl);
  CHECK(qwen3.thinking() == ThinkingStyle::kSwitch);
  CHECK(qwen3.Thinks({}));
  CHECK_FALSE(qwen3.Thinks({.enable_thinking = false}));
  CHECK_FALSE(qwen3.tool_call_syntax().has_value());

  const std::vector<ChatMessage> question = {{"user", "Which is greater, 9.11 or 9.8?"}};
  const RenderedChat thinking = RenderOk(qwen3, question);
  CHECK(thinking.ToString() ==
        "<|im_start|>user\nWhich is greater, 9.11 or 9.8?<|im_end|>\n<|im_start|>assistant\n");
  auto answering = qwen3.Render(question, {}, {.enable_thinking = false});
  REQUIRE(answering.ok());
  CHECK(answering->ToString() ==
        "<|im_start|>user\nWhich is greater, 9.11 or 9.8?<|im_end|>\n<|im_start|>assistant\n"
        "<think>\n\n</think>\n\n");
  // The block's tags are the vocabulary's tokens, not text.
  CHECK(Specials(*answering) == std::vector<std::string>{"<|im_start|>", "<|im_end|>",
                                                         "<|im_start|>", "<think>", "</think>"});

  // An earlier answer keeps only its content, whether the reasoning came in the content (a
  // client that sent back the whole text) or beside it.
  ChatMessage answered{.role = "assistant", .content = "9.8 is greater."};
  answered.reasoning = "Compare the tenths.";
  for (const ChatMessage& earlier :
       {answered, ChatMessage{.role = "assistant",
                              .content = "<think>\nCompare the tenths.\n</think>\n\n9.8 is "
                                         "greater."}}) {
    const RenderedChat next =
        RenderOk(qwen3, {question[0], earlier, {"user", "And 9.11 or 9.2?"}});
    CHECK(next.ToString() ==
          "<|im_start|>user\nWhich is greater, 9.11 or 9.8?<|im_end|>\n<|im_start|>assistant\n"
          "9.8 is greater.<|im_end|>\n<|im_start|>user\nAnd 9.11 or 9.2?<|im_end|>\n"
          "<|im_start|>assistant\n");
  }
  // Reasoning given apart (even empty): the content is taken as it is, </think> and all.
  ChatMessage given{.role = "assistant", .content = "a</think>b"};
  given.reasoning = "";
  CHECK(RenderOk(qwen3, {question[0], given, {"user", "c"}}).ToString() ==
        "<|im_start|>user\nWhich is greater, 9.11 or 9.8?<|im_end|>\n<|im_start|>assistant\n"
        "a</think>b<|im_end|>\n<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n");
  // After the last user message (a turn in progress) the reasoning stays, in its block.
  const RenderedChat in_progress = RenderOk(qwen3, {question[0], answered});
  CHECK(in_progress.ToString() ==
        "<|im_start|>user\nWhich is greater, 9.11 or 9.8?<|im_end|>\n<|im_start|>assistant\n"
        "<think>\nCompare the tenths.\n</think>\n\n9.8 is greater.<|im_end|>\n"
        "<|im_start|>assistant\n");
}

TEST_CASE(
    "Qwen3 writes tools after the system message, and calls after the reasoning of a "
    "turn in progress",
    "[thinking]") {
  const ChatTemplate qwen3 =
      Make((std::string(kQwen3Source) + "{{- \"# Tools\\n\\nYou may call one or more functions to "
                                        "assist with the user query.\" }}")
               .c_str());
  REQUIRE(qwen3.tool_call_syntax().has_value());
  const std::vector<std::string> tools = {R"({"type": "function", "function": {"name": "f"}})"};
  ChatMessage calls{.role = "assistant", .content = ""};
  calls.reasoning = "Call f.";
  calls.tool_calls = {{.id = "call_1", .name = "f", .arguments = "{}"},
                      {.id = "call_2", .name = "f", .arguments = R"({"x": 1})"}};
  const std::vector<ChatMessage> turn = {
      {"user", "Do it."}, calls, {.role = "tool", .content = "ok", .tool_call_id = "call_1"}};
  const std::string tools_block =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
      "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}\n</tools>\n\nFor each "
      "function call, return a json object with function name and arguments within "
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
      "\"arguments\": <args-json-object>}\n</tool_call>";
  auto rendered = qwen3.Render(turn, tools);
  INFO(rendered.status().ToString());
  REQUIRE(rendered.ok());
  // No default system message: the tools alone; the calls right after the reasoning block.
  CHECK(rendered->ToString() ==
        "<|im_start|>system\n" + tools_block +
            "<|im_end|>\n<|im_start|>user\nDo it.<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nCall f.\n</think>\n\n<tool_call>\n{\"name\": \"f\", "
            "\"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": "
            "{\"x\": 1}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nok\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\n");
  // With a system message, it and a blank line come first.
  std::vector<ChatMessage> with_system = {{"system", "Be brief."}, {"user", "Do it."}};
  auto system = qwen3.Render(with_system, tools);
  REQUIRE(system.ok());
  CHECK(system->ToString().starts_with("<|im_start|>system\nBe brief.\n\n# Tools\n"));
}

TEST_CASE("QwQ's template opens the thinking block in the prompt, and has no switch",
          "[thinking]") {
  const ChatTemplate qwq = Make(kQwqSource);
  CHECK(qwq.thinking() == ThinkingStyle::kOpened);
  CHECK(qwq.Thinks({.enable_thinking = false}));
  const RenderedChat chat =
      RenderOk(qwq, {{"user", "Hi"},
                     {"assistant", "<think>\nA greeting.\n</think>\n\nHello."},
                     {"user", "Bye"}});
  CHECK(chat.ToString() ==
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n<think>\n");
  CHECK(Specials(chat).back() == "<think>");
}

// DeepSeek-R1's (its distills' too), in shape: BOS and the last system message, the turns,
// an answer's text after its </think>, and a generation prompt that opens the block.
constexpr const char* kDeepSeekR1Source =
    "{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == "
    "'user' %}{{'<｜User｜>' + message['content']}}{%- endif %}{% set content = "
    "message['content'] %}{% if '</think>' in content %}{% set content = "
    "content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + "
    "'<｜end▁of▁sentence｜>'}}{%- endfor -%}{% if add_generation_prompt and not ns.is_tool %}"
    "{{'<｜Assistant｜><think>\\n'}}{% endif %}";

TEST_CASE(
    "DeepSeek-R1's template opens the thinking block, and keeps an answer's text after "
    "its </think>",
    "[thinking]") {
  const ChatTemplate r1 = Make(kDeepSeekR1Source);
  CHECK(r1.family() == ChatFamily::kDeepSeekR1);
  CHECK(ChatFamilyName(r1.family()) == "deepseek_r1");
  CHECK(r1.thinking() == ThinkingStyle::kOpened);
  CHECK(r1.Thinks({.enable_thinking = false}));
  CHECK(r1.turn_ends().empty());  // the tokenizer's EOS ends a turn
  CHECK_FALSE(r1.tool_call_syntax().has_value());
  // Each expected string is transformers' rendering of DeepSeek-R1-Distill's template.
  const RenderedChat question = RenderOk(r1, {{"user", "Which is greater, 9.11 or 9.8?"}});
  CHECK(question.bos);
  CHECK(question.ToString() == "<｜User｜>Which is greater, 9.11 or 9.8?<｜Assistant｜><think>\n");
  CHECK(Specials(question) == std::vector<std::string>{"<｜User｜>", "<｜Assistant｜>", "<think>"});
  // The system message bare after BOS; the reasoning of an earlier answer dropped, the
  // newlines after its </think> kept, as the template's split keeps them.
  const RenderedChat history =
      RenderOk(r1, {{"system", "Be brief."},
                    {"user", "Hi"},
                    {"assistant", "<think>\nA greeting.\n</think>\n\nHello."},
                    {"user", "Bye"}});
  CHECK(history.ToString() ==
        "Be brief.<｜User｜>Hi<｜Assistant｜>\n\nHello.<｜end▁of▁sentence｜><｜User｜>Bye"
        "<｜Assistant｜><think>\n");
  CHECK(Specials(history) == std::vector<std::string>{"<｜User｜>", "<｜Assistant｜>",
                                                      "<｜end▁of▁sentence｜>", "<｜User｜>",
                                                      "<｜Assistant｜>", "<think>"});
  // The last system message wins, wherever it stands; text after the last </think> is kept,
  // and reasoning given apart is dropped too.
  ChatMessage answered{.role = "assistant", .content = "x</think>y</think>\n\nz"};
  answered.reasoning = "dropped";
  CHECK(RenderOk(r1, {{"system", "A"}, {"user", "u"}, answered, {"system", "B"}, {"user", "v"}})
            .ToString() ==
        "B<｜User｜>u<｜Assistant｜>\n\nz<｜end▁of▁sentence｜><｜User｜>v<｜Assistant｜><think>\n");
  // A turn the assistant ends still gets the generation prompt after it.
  CHECK(RenderOk(r1, {{"user", "u"}, {"assistant", "w"}}).ToString() ==
        "<｜User｜>u<｜Assistant｜>w<｜end▁of▁sentence｜><｜Assistant｜><think>\n");

  // Roles it has no place for, and tools (it writes no tool definitions), are refused.
  const std::vector<ChatMessage> answered_by_tool = {
      {"user", "u"}, {.role = "tool", .content = "ok", .tool_call_id = "c"}};
  auto tool = r1.Render(answered_by_tool);
  REQUIRE_FALSE(tool.ok());
  CHECK_THAT(std::string(tool.status().message()), Catch::Contains("deepseek_r1"));
  const std::vector<ChatMessage> critic = {{"user", "u"}, {"critic", "no"}};
  auto other = r1.Render(critic);
  REQUIRE_FALSE(other.ok());
  CHECK_THAT(std::string(other.status().message()),
             Catch::StartsWith("messages[1]: role \"critic\": DeepSeek-R1's template"));

  // The first release's template leaves <think> to the model: it still thinks.
  std::string first_release = kDeepSeekR1Source;
  first_release.replace(first_release.find("<think>\\n"), 9, "");
  const ChatTemplate r1_first = Make(first_release.c_str());
  CHECK(r1_first.thinking() == ThinkingStyle::kAlways);
  CHECK(r1_first.Thinks({.enable_thinking = false}));
  CHECK(RenderOk(r1_first, {{"user", "u"}}).ToString() == "<｜User｜>u<｜Assistant｜>");
  // DeepSeek's templates that do not think are not guessed at.
  auto v3 = ChatTemplate::FromSource("{{'<｜User｜>' + m}}{{'<｜Assistant｜>'}}",
                                     "tokenizer_config.json");
  REQUIRE_FALSE(v3.ok());
  CHECK_THAT(std::string(v3.status().message()),
             Catch::StartsWith("tokenizer_config.json: chat_template writes <｜User｜>"));
}

TEST_CASE("A ChatML template that thinks in another layout is refused, not guessed",
          "[thinking]") {
  auto refused = ChatTemplate::FromSource(
      "{{- '<|im_start|>' + message.role }}{{- '<think>' + r + '</think>' }}{{- '<|im_end|>' }}",
      "tokenizer_config.json");
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()),
             Catch::StartsWith("tokenizer_config.json: chat_template writes <think>"));
}

}  // namespace
}  // namespace tophat
