#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include "gguf/gguf.h"
#include "test_paths.h"
#include "util/error.h"

namespace rf {
namespace {

const std::vector<ChatMessage> kConversation = {
    {"system", "You are terse."},
    {"user", "Hi"},
    {"assistant", "Hello."},
    {"user", "Bye"},
};

std::string render(std::string_view name, bool add_generation_prompt = true) {
  return apply_chat_template(chat_template_from_name(name), kConversation, add_generation_prompt);
}

// Expected strings follow each model's documented prompt format.

TEST(ChatTemplate, ChatML) {
  EXPECT_EQ(render("chatml"),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render("chatml", false).ends_with("Bye<|im_end|>\n"), true);
}

TEST(ChatTemplate, Llama2) {
  EXPECT_EQ(render("llama2"), "[INST] You are terse.\nHi [/INST]Hello.</s>[INST] Bye [/INST]");
  EXPECT_EQ(render("llama2-sys"),
            "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST]Hello.</s>[INST] Bye [/INST]");
  EXPECT_EQ(render("llama2-sys-bos"),
            "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST]Hello.</s><s>[INST] Bye [/INST]");
  const std::vector<ChatMessage> padded = {{"user", "  Hi \n"}};
  EXPECT_EQ(apply_chat_template(ChatTemplate::Llama2SysStrip, padded, true), "[INST] Hi [/INST]");
}

TEST(ChatTemplate, Llama3) {
  EXPECT_EQ(render("llama3"),
            "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, Mistral) {
  EXPECT_EQ(render("mistral-v1"), " [INST] You are terse.\n\nHi [/INST] Hello.</s> [INST] Bye [/INST]");
  EXPECT_EQ(render("mistral-v3"), "[INST] You are terse.\n\nHi[/INST] Hello.</s>[INST] Bye[/INST]");
  EXPECT_EQ(render("mistral-v3-tekken"), "[INST]You are terse.\n\nHi[/INST]Hello.</s>[INST]Bye[/INST]");
  EXPECT_EQ(render("mistral-v7"),
            "[SYSTEM_PROMPT] You are terse.[/SYSTEM_PROMPT][INST] Hi[/INST] Hello.</s>[INST] Bye[/INST]");
}

TEST(ChatTemplate, Zephyr) {
  EXPECT_EQ(render("zephyr"),
            "<|system|>\nYou are terse.<|endoftext|>\n<|user|>\nHi<|endoftext|>\n"
            "<|assistant|>\nHello.<|endoftext|>\n<|user|>\nBye<|endoftext|>\n<|assistant|>\n");
}

TEST(ChatTemplate, Phi3AndPhi4) {
  EXPECT_EQ(render("phi3"),
            "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi<|end|>\n"
            "<|assistant|>\nHello.<|end|>\n<|user|>\nBye<|end|>\n<|assistant|>\n");
  EXPECT_EQ(render("phi4"),
            "<|im_start|>system<|im_sep|>You are terse.<|im_end|><|im_start|>user<|im_sep|>Hi<|im_end|>"
            "<|im_start|>assistant<|im_sep|>Hello.<|im_end|><|im_start|>user<|im_sep|>Bye<|im_end|>"
            "<|im_start|>assistant<|im_sep|>");
}

TEST(ChatTemplate, GemmaFoldsTheSystemMessageIntoTheUserTurn) {
  EXPECT_EQ(render("gemma"),
            "<start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ChatTemplate, OtherFamilies) {
  EXPECT_EQ(render("command-r"),
            "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are terse.<|END_OF_TURN_TOKEN|>"
            "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|>"
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hello.<|END_OF_TURN_TOKEN|>"
            "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Bye<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
  EXPECT_EQ(render("vicuna"), "You are terse.\n\nUSER: Hi\nASSISTANT: Hello.</s>\nUSER: Bye\nASSISTANT:");
  EXPECT_EQ(render("vicuna-orca"), "SYSTEM: You are terse.\nUSER: Hi\nASSISTANT: Hello.</s>\nUSER: Bye\nASSISTANT:");
  EXPECT_EQ(render("deepseek3"),
            "You are terse.\n\n<\xEF\xBD\x9CUser\xEF\xBD\x9C>Hi<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>Hello."
            "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C><\xEF\xBD\x9CUser\xEF\xBD\x9C>Bye"
            "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>");
}

TEST(ChatTemplate, NamesRoundTrip) {
  for (std::string_view name : {"chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "llama3",
                                "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7", "phi3", "phi4",
                                "zephyr", "gemma", "command-r", "deepseek3", "vicuna", "vicuna-orca"}) {
    EXPECT_EQ(chat_template_name(chat_template_from_name(name)), name);
    EXPECT_EQ(detect_chat_template(name), chat_template_from_name(name)) << "a name overrides detection";
  }
}

TEST(ChatTemplate, UnknownNamesAndTemplatesAreErrorsNamingThem) {
  try {
    chat_template_from_name("alpaca");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'alpaca'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("chatml"), std::string::npos) << "lists the known names";
  }
  try {
    detect_chat_template("{% for m in messages %}### Human: {{ m.content }}{% endfor %}");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("### Human"), std::string::npos) << e.what();
  }
}

// Excerpts of the Jinja templates the models ship.
TEST(ChatTemplate, DetectsFamiliesFromJinjaTemplates) {
  const std::pair<const char*, ChatTemplate> cases[] = {
      {"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
       "'<|im_end|>' + '\n'}}{% endfor %}",
       ChatTemplate::ChatML},
      {"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
       "message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + "
       "eos_token}}{% endif %}{% endfor %}",
       ChatTemplate::Llama2},
      {"{% if messages[0]['role'] == 'system' %}{% set system_message = '<<SYS>>\\n' + messages[0]['content'] "
       "+ '\\n<</SYS>>\\n\\n' %}{% endif %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}",
       ChatTemplate::Llama2SysStrip},
      {"{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ "
       "message['content'] | trim + '<|eot_id|>' %}",
       ChatTemplate::Llama3},
      {"{%- if messages[0]['role'] == 'system' %}{{- '[SYSTEM_PROMPT]' + messages[0]['content'] + "
       "'[/SYSTEM_PROMPT]' }}{%- endif %}{{- '[INST]' + message['content'] + '[/INST]' }}",
       ChatTemplate::MistralV7},
      {"{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + "
       "'<|endoftext|>' }}{% endif %}{% endfor %}",
       ChatTemplate::Zephyr},
      {"{{ bos_token }}{% for message in messages %}{{'<start_of_turn>' + role + '\n' + message['content'] | "
       "trim + '<end_of_turn>\n'}}{% endfor %}",
       ChatTemplate::Gemma},
      {"{% for message in messages %}{{'<|im_start|>' + message['role'] + '<|im_sep|>' + message['content'] + "
       "'<|im_end|>'}}{% endfor %}",
       ChatTemplate::Phi4},
  };
  for (const auto& [jinja, expected] : cases) {
    EXPECT_EQ(detect_chat_template(jinja), expected) << jinja;
  }
}

TEST(ChatTemplate, DetectsTheTemplateOfAModelFile) {
  const auto file = gguf::File::open(test::shared_path("vocab/ggml-vocab-phi-3.gguf"));
  EXPECT_EQ(detect_chat_template(file->get<std::string_view>("tokenizer.chat_template")), ChatTemplate::Phi3);
}

}  // namespace
}  // namespace rf
