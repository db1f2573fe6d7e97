#include "tokenizer/chat_template.h"

#include <array>
#include <utility>

#include "util/error.h"

namespace rf {

namespace {

constexpr std::array<std::pair<std::string_view, ChatTemplate>, 22> kNames = {{
    {"chatml", ChatTemplate::ChatML},
    {"llama2", ChatTemplate::Llama2},
    {"llama2-sys", ChatTemplate::Llama2Sys},
    {"llama2-sys-bos", ChatTemplate::Llama2SysBos},
    {"llama2-sys-strip", ChatTemplate::Llama2SysStrip},
    {"llama3", ChatTemplate::Llama3},
    {"mistral-v1", ChatTemplate::MistralV1},
    {"mistral-v3", ChatTemplate::MistralV3},
    {"mistral-v3-tekken", ChatTemplate::MistralV3Tekken},
    {"mistral-v7", ChatTemplate::MistralV7},
    {"phi3", ChatTemplate::Phi3},
    {"phi4", ChatTemplate::Phi4},
    {"falcon3", ChatTemplate::Falcon3},
    {"zephyr", ChatTemplate::Zephyr},
    {"gemma", ChatTemplate::Gemma},
    {"command-r", ChatTemplate::CommandR},
    {"deepseek3", ChatTemplate::DeepSeek3},
    {"chatglm3", ChatTemplate::ChatGLM3},
    {"chatglm4", ChatTemplate::ChatGLM4},
    {"glmedge", ChatTemplate::GLMEdge},
    {"vicuna", ChatTemplate::Vicuna},
    {"vicuna-orca", ChatTemplate::VicunaOrca},
}};

std::string_view trim(std::string_view text) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t begin = text.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(kSpace) + 1 - begin);
}

// Roles written into the prompt as they are: <|im_start|>role, <|role|>...
std::string render_role_tagged(std::span<const ChatMessage> messages, bool add_generation_prompt,
                               std::string_view before_role, std::string_view after_role,
                               std::string_view after_content, bool trim_content = false) {
  std::string out;
  for (const ChatMessage& message : messages) {
    out += before_role;
    out += message.role;
    out += after_role;
    out += trim_content ? trim(message.content) : std::string_view(message.content);
    out += after_content;
  }
  if (add_generation_prompt) {
    out += before_role;
    out += "assistant";
    out += after_role;
  }
  return out;
}

// Llama 2: turns of "[INST] user [/INST] answer</s>"; the tokenizer supplies the first <s>. There is no
// generation prompt: after [/INST] the assistant's turn is already open.
std::string render_llama2(std::span<const ChatMessage> messages, ChatTemplate variant) {
  const bool system_block = variant != ChatTemplate::Llama2;
  const bool bos_between_turns = variant == ChatTemplate::Llama2SysBos;
  const bool strip = variant == ChatTemplate::Llama2SysStrip;
  std::string out = "[INST] ";
  bool inside_turn = true;
  for (const ChatMessage& message : messages) {
    const std::string_view content = strip ? trim(message.content) : std::string_view(message.content);
    if (!inside_turn) {
      out += bos_between_turns ? "<s>[INST] " : "[INST] ";
      inside_turn = true;
    }
    if (message.role == "system") {
      if (system_block) {
        out += "<<SYS>>\n";
        out += content;
        out += "\n<</SYS>>\n\n";
      } else {
        out += content;
        out += "\n";
      }
    } else if (message.role == "user") {
      out += content;
      out += " [/INST]";
    } else {
      out += content;
      out += "</s>";
      inside_turn = false;
    }
  }
  return out;
}

// Mistral v1/v3/v3-tekken differ only in spaces around [INST]; a system message opens the first turn.
std::string render_mistral(std::span<const ChatMessage> messages, ChatTemplate variant) {
  const std::string_view leading_space = variant == ChatTemplate::MistralV1 ? " " : "";
  const std::string_view trailing_space = variant == ChatTemplate::MistralV3Tekken ? "" : " ";
  const bool trim_answers = variant == ChatTemplate::MistralV3;
  std::string out;
  bool inside_turn = false;
  for (const ChatMessage& message : messages) {
    if (!inside_turn) {
      out += leading_space;
      out += "[INST]";
      out += trailing_space;
      inside_turn = true;
    }
    if (message.role == "system") {
      out += message.content;
      out += "\n\n";
    } else if (message.role == "user") {
      out += message.content;
      out += leading_space;
      out += "[/INST]";
    } else {
      out += trailing_space;
      out += trim_answers ? trim(message.content) : std::string_view(message.content);
      out += "</s>";
      inside_turn = false;
    }
  }
  return out;
}

std::string render_mistral_v7(std::span<const ChatMessage> messages) {
  std::string out;
  for (const ChatMessage& message : messages) {
    if (message.role == "system") {
      out += "[SYSTEM_PROMPT] " + message.content + "[/SYSTEM_PROMPT]";
    } else if (message.role == "user") {
      out += "[INST] " + message.content + "[/INST]";
    } else {
      out += " " + message.content + "</s>";
    }
  }
  return out;
}

// Gemma has no system role: a system message is put in front of the next user message.
std::string render_gemma(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  std::string system_prompt;
  for (const ChatMessage& message : messages) {
    if (message.role == "system") {
      system_prompt += trim(message.content);
      continue;
    }
    // As llama.cpp: the role as written, "model" for "assistant"; the system text goes to the first turn that
    // is not the model's.
    const std::string_view role = message.role == "assistant" ? "model" : std::string_view(message.role);
    out += "<start_of_turn>";
    out += role;
    out += "\n";
    if (!system_prompt.empty() && role != "model") {
      out += system_prompt + "\n\n";
      system_prompt.clear();
    }
    out += trim(message.content);
    out += "<end_of_turn>\n";
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

std::string render_command_r(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  for (const ChatMessage& message : messages) {
    const std::string_view role_token = message.role == "system" ? "<|SYSTEM_TOKEN|>"
                                        : message.role == "user" ? "<|USER_TOKEN|>"
                                                                 : "<|CHATBOT_TOKEN|>";
    out += "<|START_OF_TURN_TOKEN|>";
    out += role_token;
    out += trim(message.content);
    out += "<|END_OF_TURN_TOKEN|>";
  }
  if (add_generation_prompt) out += "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>";
  return out;
}

std::string render_deepseek3(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  constexpr std::string_view kUser = "<\xEF\xBD\x9CUser\xEF\xBD\x9C>";
  constexpr std::string_view kAssistant = "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>";
  constexpr std::string_view kEnd = "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
  std::string out;
  for (const ChatMessage& message : messages) {
    if (message.role == "system") {
      out += message.content + "\n\n";
    } else if (message.role == "user") {
      out += kUser;
      out += message.content;
    } else {
      out += kAssistant;
      out += message.content;
      out += kEnd;
    }
  }
  if (add_generation_prompt) out += kAssistant;
  return out;
}

std::string render_vicuna(std::span<const ChatMessage> messages, bool add_generation_prompt, ChatTemplate variant) {
  std::string out;
  for (const ChatMessage& message : messages) {
    if (message.role == "system") {
      out += variant == ChatTemplate::VicunaOrca ? "SYSTEM: " + message.content + "\n" : message.content + "\n\n";
    } else if (message.role == "user") {
      out += "USER: " + message.content + "\n";
    } else {
      out += "ASSISTANT: " + message.content + "</s>\n";
    }
  }
  if (add_generation_prompt) out += "ASSISTANT:";
  return out;
}

}  // namespace

ChatTemplate chat_template_from_name(std::string_view name) {
  for (const auto& [known, chat_template] : kNames) {
    if (known == name) return chat_template;
  }
  std::string known_names;
  for (const auto& entry : kNames) known_names += (known_names.empty() ? "" : ", ") + std::string(entry.first);
  fail("unknown chat template '{}' (known: {})", name, known_names);
}

std::string_view chat_template_name(ChatTemplate chat_template) {
  for (const auto& [name, known] : kNames) {
    if (known == chat_template) return name;
  }
  return "?";
}

ChatTemplate detect_chat_template(std::string_view jinja_or_name) {
  for (const auto& [name, chat_template] : kNames) {
    if (name == jinja_or_name) return chat_template;
  }
  const auto contains = [&](std::string_view marker) { return jinja_or_name.find(marker) != std::string_view::npos; };
  // The order matters: it is llama.cpp's, where earlier families' markers may also occur in later ones.
  if (contains("<|im_start|>")) return contains("<|im_sep|>") ? ChatTemplate::Phi4 : ChatTemplate::ChatML;
  if (jinja_or_name.starts_with("mistral") || contains("[INST]")) {
    if (contains("[SYSTEM_PROMPT]")) return ChatTemplate::MistralV7;
    if (contains("' [INST] ' + system_message") || contains("[AVAILABLE_TOOLS]")) {
      if (contains(" [INST]")) return ChatTemplate::MistralV1;
      if (contains("\"[INST]\"")) return ChatTemplate::MistralV3Tekken;
      return ChatTemplate::MistralV3;
    }
    if (contains("content.strip()")) return ChatTemplate::Llama2SysStrip;
    if (contains("bos_token + '[INST]")) return ChatTemplate::Llama2SysBos;
    if (contains("<<SYS>>")) return ChatTemplate::Llama2Sys;
    return ChatTemplate::Llama2;
  }
  if (contains("<|assistant|>") && contains("<|end|>")) return ChatTemplate::Phi3;
  // GLM-4 templates also hold <|user|> and <|assistant|>: [gMASK]<sop> is tested before GLM-Edge's markers.
  if (contains("[gMASK]<sop>")) return ChatTemplate::ChatGLM4;
  // llama.cpp's GLM-Edge test takes any template with <|user|> and <|assistant|> left here, Zephyr templates
  // that write out <|assistant|> included; one with </s> is Falcon 3.
  if (contains("<|assistant|>") && contains("<|user|>")) {
    return contains("</s>") ? ChatTemplate::Falcon3 : ChatTemplate::GLMEdge;
  }
  if (contains("<|{{ item['role'] }}|>") && contains("<|begin_of_image|>")) return ChatTemplate::GLMEdge;
  if (contains("<|user|>") && contains("<|endoftext|>")) return ChatTemplate::Zephyr;
  if (contains("<start_of_turn>")) return ChatTemplate::Gemma;
  if (contains("USER: ") && contains("ASSISTANT: ")) {
    return contains("SYSTEM: ") ? ChatTemplate::VicunaOrca : ChatTemplate::Vicuna;
  }
  if (contains("<|START_OF_TURN_TOKEN|>") && contains("<|USER_TOKEN|>")) return ChatTemplate::CommandR;
  if (contains("<|start_header_id|>") && contains("<|end_header_id|>")) return ChatTemplate::Llama3;
  if (contains("[gMASK]sop")) return ChatTemplate::ChatGLM3;  // chatglm3-6b; late, as in llama.cpp
  if (contains("<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>") && contains("<\xEF\xBD\x9CUser\xEF\xBD\x9C>")) {
    return ChatTemplate::DeepSeek3;
  }
  constexpr size_t kQuoted = 60;
  fail("unrecognized chat template '{}{}'", jinja_or_name.substr(0, kQuoted),
       jinja_or_name.size() > kQuoted ? "..." : "");
}

std::string apply_chat_template(ChatTemplate chat_template, std::span<const ChatMessage> messages,
                                bool add_generation_prompt) {
  switch (chat_template) {
    case ChatTemplate::ChatML:
      return render_role_tagged(messages, add_generation_prompt, "<|im_start|>", "\n", "<|im_end|>\n");
    case ChatTemplate::Phi4:
      return render_role_tagged(messages, add_generation_prompt, "<|im_start|>", "<|im_sep|>", "<|im_end|>");
    case ChatTemplate::Llama3:
      return render_role_tagged(messages, add_generation_prompt, "<|start_header_id|>", "<|end_header_id|>\n\n",
                                "<|eot_id|>", /*trim_content=*/true);
    case ChatTemplate::Phi3:
      return render_role_tagged(messages, add_generation_prompt, "<|", "|>\n", "<|end|>\n");
    case ChatTemplate::Zephyr:
      return render_role_tagged(messages, add_generation_prompt, "<|", "|>\n", "<|endoftext|>\n");
    case ChatTemplate::Falcon3:
      return render_role_tagged(messages, add_generation_prompt, "<|", "|>\n", "\n");
    // The GLM turns have no end marker (the next role tag ends a turn); their generation prompts differ from
    // the role tags: no "\n " after <|assistant|> for ChatGLM3 and GLM-Edge, "\n" for ChatGLM4.
    case ChatTemplate::ChatGLM3:
      return "[gMASK]sop" + render_role_tagged(messages, false, "<|", "|>\n ", "") +
             (add_generation_prompt ? "<|assistant|>" : "");
    case ChatTemplate::ChatGLM4:
      return "[gMASK]<sop>" + render_role_tagged(messages, add_generation_prompt, "<|", "|>\n", "");
    case ChatTemplate::GLMEdge:
      return render_role_tagged(messages, false, "<|", "|>\n", "") + (add_generation_prompt ? "<|assistant|>" : "");
    case ChatTemplate::Llama2:
    case ChatTemplate::Llama2Sys:
    case ChatTemplate::Llama2SysBos:
    case ChatTemplate::Llama2SysStrip:
      return render_llama2(messages, chat_template);
    case ChatTemplate::MistralV1:
    case ChatTemplate::MistralV3:
    case ChatTemplate::MistralV3Tekken:
      return render_mistral(messages, chat_template);
    case ChatTemplate::MistralV7:
      return render_mistral_v7(messages);
    case ChatTemplate::Gemma:
      return render_gemma(messages, add_generation_prompt);
    case ChatTemplate::CommandR:
      return render_command_r(messages, add_generation_prompt);
    case ChatTemplate::DeepSeek3:
      return render_deepseek3(messages, add_generation_prompt);
    case ChatTemplate::Vicuna:
    case ChatTemplate::VicunaOrca:
      return render_vicuna(messages, add_generation_prompt, chat_template);
  }
  fail("invalid chat template value {}", static_cast<int>(chat_template));
}

}  // namespace rf
