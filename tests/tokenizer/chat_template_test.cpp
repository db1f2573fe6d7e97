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

// The conversation of llama.cpp's tests/test-chat-template.cpp, whose expected strings (rendered with
// add_generation_prompt) are copied literally below.
const std::vector<ChatMessage> kLlamaCppConversation = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};

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

TEST(ChatTemplate, GlmFamily) {
  EXPECT_EQ(render("chatglm3"),
            "[gMASK]sop<|system|>\n You are terse.<|user|>\n Hi<|assistant|>\n Hello.<|user|>\n Bye<|assistant|>");
  EXPECT_EQ(render("chatglm3", false),
            "[gMASK]sop<|system|>\n You are terse.<|user|>\n Hi<|assistant|>\n Hello.<|user|>\n Bye");
  EXPECT_EQ(render("chatglm4"),
            "[gMASK]<sop><|system|>\nYou are terse.<|user|>\nHi<|assistant|>\nHello.<|user|>\nBye<|assistant|>\n");
  EXPECT_EQ(render("chatglm4", false),
            "[gMASK]<sop><|system|>\nYou are terse.<|user|>\nHi<|assistant|>\nHello.<|user|>\nBye");
  EXPECT_EQ(render("glmedge"), "<|system|>\nYou are terse.<|user|>\nHi<|assistant|>\nHello.<|user|>\nBye<|assistant|>");
  EXPECT_EQ(render("glmedge", false), "<|system|>\nYou are terse.<|user|>\nHi<|assistant|>\nHello.<|user|>\nBye");
  // Falcon 3 shares GLM-Edge's detection (told apart by </s>); this follows llama.cpp's renderer, which its
  // test file has no expected string for.
  EXPECT_EQ(render("falcon3"),
            "<|system|>\nYou are terse.\n<|user|>\nHi\n<|assistant|>\nHello.\n<|user|>\nBye\n<|assistant|>\n");
}

// Each template's expected output in llama.cpp's test-chat-template.cpp (the test case's name in the comment),
// character for character. Whitespace around "   I am an assistant   " shows which templates trim.
TEST(ChatTemplate, MatchesLlamaCppExpectedOutputs) {
  const std::pair<const char*, const char*> cases[] = {
      // teknium/OpenHermes-2.5-Mistral-7B
      {"chatml",
       "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
       "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
       "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n"
       "<|im_start|>assistant\n"},
      // mistralai/Mistral-7B-Instruct-v0.2 (NOTE: Old pre-v1 without a system prompt)
      {"llama2",
       "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assistant   "
       "</s>[INST] Another question [/INST]"},
      // TheBloke/FusionNet_34Bx2_MoE-AWQ
      {"llama2-sys-bos",
       "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] Who are you "
       "[/INST]   I am an assistant   </s><s>[INST] Another question [/INST]"},
      // bofenghuang/vigogne-2-70b-chat
      {"llama2-sys-strip",
       "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you "
       "[/INST]I am an assistant</s>[INST] Another question [/INST]"},
      // google/gemma-7b-it
      {"gemma",
       "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there"
       "<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant"
       "<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n"},
      // eachadea/vicuna-13b-1.1
      {"vicuna",
       "You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    I am "
       "an assistant   </s>\nUSER: Another question\nASSISTANT:"},
      // Orca-Vicuna
      {"vicuna-orca",
       "SYSTEM: You are a helpful assistant\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    "
       "I am an assistant   </s>\nUSER: Another question\nASSISTANT:"},
      // CohereForAI/c4ai-command-r-plus
      {"command-r",
       "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
       "<|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
       "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
       "I am an assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Another question"
       "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
      // Llama-3
      {"llama3",
       "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user"
       "<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant"
       "<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother "
       "question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
      // Phi-3-mini, Phi-3-small, Phi-3-medium, Phi-3-vision
      {"phi3",
       "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n"
       "<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question"
       "<|end|>\n<|assistant|>\n"},
      // ChatGLM3
      {"chatglm3",
       "[gMASK]sop<|system|>\n You are a helpful assistant<|user|>\n Hello<|assistant|>\n Hi there<|user|>\n Who "
       "are you<|assistant|>\n    I am an assistant   <|user|>\n Another question<|assistant|>"},
      // ChatGLM4
      {"chatglm4",
       "[gMASK]<sop><|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\nWho are "
       "you<|assistant|>\n   I am an assistant   <|user|>\nAnother question<|assistant|>\n"},
      // GLMEdge
      {"glmedge",
       "<|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\nWho are you"
       "<|assistant|>\n   I am an assistant   <|user|>\nAnother question<|assistant|>"},
      // mistralai/Mistral-7B-Instruct-v0.2 (mistralai 'v1' template with a system prompt)
      {"mistral-v1",
       " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an "
       "assistant   </s> [INST] Another question [/INST]"},
      // Mistral-Large-Instruct-2407 (mistralai 'v3' template; modified to have system prompt at start)
      {"mistral-v3",
       "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant"
       "</s>[INST] Another question[/INST]"},
      // Mistral-Nemo-Instruct-2407 (mistralai 'v3-tekken' template; modified to have system prompt at start)
      {"mistral-v3-tekken",
       "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   "
       "</s>[INST]Another question[/INST]"},
      // mistralai/Mistral-Large-Instruct-2411 (mistralai 'v7' template)
      {"mistral-v7",
       "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] Who are you"
       "[/INST]    I am an assistant   </s>[INST] Another question[/INST]"},
      // phi-4
      {"phi4",
       "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello<|im_end|>"
       "<|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you<|im_end|>"
       "<|im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|><|im_start|>user<|im_sep|>Another question"
       "<|im_end|><|im_start|>assistant<|im_sep|>"},
  };
  for (const auto& [name, expected] : cases) {
    EXPECT_EQ(apply_chat_template(chat_template_from_name(name), kLlamaCppConversation, true), expected) << name;
  }
}

TEST(ChatTemplate, NamesRoundTrip) {
  for (std::string_view name : {"chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "llama3",
                                "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7", "phi3", "phi4",
                                "falcon3", "zephyr", "gemma", "command-r", "deepseek3", "chatglm3", "chatglm4",
                                "glmedge", "vicuna", "vicuna-orca"}) {
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

// The templates of llama.cpp's test-chat-template.cpp, literally, are detected as llama.cpp detects them.
TEST(ChatTemplate, DetectsLlamaCppTestTemplates) {
  const std::pair<const char*, ChatTemplate> cases[] = {
      // ChatGLM3
      {"{% for message in messages %}{% if loop.first %}[gMASK]sop<|{{ message['role'] }}|>\n {{ message['content'] "
       "}}{% else %}<|{{ message['role'] }}|>\n {{ message['content'] }}{% endif %}{% endfor %}{% if "
       "add_generation_prompt %}<|assistant|>{% endif %}",
       ChatTemplate::ChatGLM3},
      // ChatGLM4 (its <|system|> text is UTF-8 Chinese)
      {"[gMASK]<sop>{% for item in messages %}{% if item['tools'] is defined %}<|system|>\n\xE4\xBD\xA0\xE6\x98\xAF"
       "\xE4\xB8\x80\xE4\xB8\xAA\xE5\x90\x8D\xE4\xB8\xBA ChatGLM \xE7\x9A\x84\xE4\xBA\xBA\xE5\xB7\xA5\xE6\x99\xBA"
       "\xE8\x83\xBD\xE5\x8A\xA9\xE6\x89\x8B\xE3\x80\x82\xE4\xBD\xA0\xE6\x98\xAF\xE5\x9F\xBA\xE4\xBA\x8E\xE6\x99"
       "\xBA\xE8\xB0\xB1"
       "AI\xE8\xAE\xAD\xE7\xBB\x83\xE7\x9A\x84\xE8\xAF\xAD\xE8\xA8\x80\xE6\xA8\xA1\xE5\x9E\x8B GLM-4 "
       "\xE6\xA8\xA1\xE5\x9E\x8B\xE5\xBC\x80\xE5\x8F\x91\xE7\x9A\x84\xEF\xBC\x8C\xE4\xBD\xA0\xE7\x9A\x84\xE4\xBB"
       "\xBB\xE5\x8A\xA1\xE6\x98\xAF\xE9\x92\x88\xE5\xAF\xB9\xE7\x94\xA8\xE6\x88\xB7\xE7\x9A\x84\xE9\x97\xAE\xE9"
       "\xA2\x98\xE5\x92\x8C\xE8\xA6\x81\xE6\xB1\x82\xE6\x8F\x90\xE4\xBE\x9B\xE9\x80\x82\xE5\xBD\x93\xE7\x9A\x84"
       "\xE7\xAD\x94\xE5\xA4\x8D\xE5\x92\x8C\xE6\x94\xAF\xE6\x8C\x81\xE3\x80\x82\n\n# \xE5\x8F\xAF\xE7\x94\xA8\xE5"
       "\xB7\xA5\xE5\x85\xB7{% set tools = item['tools'] %}{% for tool in tools %}{% if tool['type'] "
       "== 'function' %}\n\n## {{ tool['function']['name'] }}\n\n{{ tool['function'] | tojson(indent=4) "
       "}}\n......{% endif %}{% endfor %}{% endif %}{% if item['content'] %}<|{{ item['role'] }}|>{{ "
       "item['metadata'] }}\n{{ item['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt "
       "%}<|assistant|>\n{% endif %}",
       ChatTemplate::ChatGLM4},
      // GLMEdge
      {"{% for item in messages %}{% if item['role'] == 'system' %}<|system|>\n{{ item['content'] }}{% elif "
       "item['role'] == 'user' %}<|user|>\n{{ item['content'] }}{% elif item['role'] == 'assistant' %}<|assistant|>\n"
       "{{ item['content'] }}{% endif %}{% endfor %}<|assistant|>",
       ChatTemplate::GLMEdge},
      // teknium/OpenHermes-2.5-Mistral-7B
      {"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' "
       "+ '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
       ChatTemplate::ChatML},
      // google/gemma-7b-it
      {"{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for "
       "message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
       "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
       "(message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif "
       "%}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if "
       "add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}",
       ChatTemplate::Gemma},
      // Phi-3-mini
      {"{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\n' + "
       "message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% elif (message['role'] == 'assistant') "
       "%}{{message['content'] + '<|end|>' + '\n'}}{% endif %}{% endfor %}",
       ChatTemplate::Phi3},
      // Phi-3-small
      {"{{ bos_token }}{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + message['content'] + "
       "'<|end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% "
       "endif %}",
       ChatTemplate::Phi3},
      // Phi-3-vision
      {"{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + message['content'] + '<|end|>\n' }}{% "
       "endfor %}{% if add_generation_prompt and messages[-1]['role'] != 'assistant' %}{{- '<|assistant|>\n' -}}{% "
       "endif %}",
       ChatTemplate::Phi3},
      // Llama-3
      {"{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
       "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
       "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{{ "
       "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}",
       ChatTemplate::Llama3},
      // phi-4
      {"{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + "
       "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + "
       "message['content'] + '<|im_end|><|im_start|>assistant<|im_sep|>'}}{% elif (message['role'] == 'assistant') "
       "%}{{message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}",
       ChatTemplate::Phi4},
  };
  for (const auto& [jinja, expected] : cases) {
    EXPECT_EQ(chat_template_name(detect_chat_template(jinja)), chat_template_name(expected)) << jinja;
  }
}

// Where the GLM checks sit among the others matters: a GLM-4 template also holds <|user|>, <|assistant|> and
// <|endoftext|> (GLM-Edge's and Zephyr's markers), so [gMASK]<sop> is tested first; ChatGLM3's [gMASK]sop
// comes late, after Llama 3. <|end|> with <|assistant|> stays Phi-3, <|user|> with <|endoftext|> alone Zephyr.
TEST(ChatTemplate, GlmDetectionOrder) {
  EXPECT_EQ(detect_chat_template("[gMASK]<sop>{% for item in messages %}<|{{ item['role'] }}|>\n{{ item['content'] "
                                 "}}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% else %}<|user|>{% "
                                 "endif %}<|endoftext|>"),
            ChatTemplate::ChatGLM4);
  EXPECT_EQ(detect_chat_template("[gMASK]sop{{ '<|start_header_id|>' }}{{ '<|end_header_id|>' }}"),
            ChatTemplate::Llama3);
  EXPECT_EQ(detect_chat_template("[gMASK]sop{% for m in messages %}<|{{ m['role'] }}|>\n {{ m['content'] }}{% endfor "
                                 "%}<|user|><|endoftext|>"),
            ChatTemplate::Zephyr);
  EXPECT_EQ(detect_chat_template("{% for item in messages %}<|{{ item['role'] }}|>\n{% if item.image %}"
                                 "<|begin_of_image|>{% endif %}{{ item['content'] }}{% endfor %}"),
            ChatTemplate::GLMEdge);
  EXPECT_EQ(detect_chat_template("{{ '<|user|>\n' + content + '\n' }}{{ '<|assistant|>\n' + content + '</s>' }}"),
            ChatTemplate::Falcon3);
  EXPECT_EQ(detect_chat_template("{{ '<|user|>\n' + content + '<|end|>' }}{{ '<|assistant|>\n' }}"),
            ChatTemplate::Phi3);
}

TEST(ChatTemplate, DetectsTheTemplateOfAModelFile) {
  const auto file = gguf::File::open(test::shared_path("vocab/ggml-vocab-phi-3.gguf"));
  EXPECT_EQ(detect_chat_template(file->get<std::string_view>("tokenizer.chat_template")), ChatTemplate::Phi3);
}

}  // namespace
}  // namespace rf
