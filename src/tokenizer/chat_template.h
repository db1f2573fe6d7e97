// Chat prompt formats. Models ship a Jinja template (tokenizer.chat_template); like llama.cpp's
// llm_chat_detect_template we recognize the common families by distinctive markers and render them in C++,
// without a Jinja engine.
#pragma once
#include <span>
#include <string>
#include <string_view>

namespace rf {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

enum class ChatTemplate {
  ChatML,          // <|im_start|>role\n...<|im_end|>\n (Qwen, Yi, many fine-tunes)
  Llama2,          // [INST] ... [/INST] answer</s>, a system message prefixed to the first user message
  Llama2Sys,       // the same with the system message in <<SYS>> ... <</SYS>>
  Llama2SysBos,    // ... and <s> before each later [INST]
  Llama2SysStrip,  // ... with messages stripped of surrounding whitespace
  Llama3,          // <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  ChatGLM3,        // [gMASK]sop<|role|>\n ... (no end marker), then <|assistant|>
  ChatGLM4,        // [gMASK]<sop><|role|>\n... (no end marker), then <|assistant|>\n
  GLMEdge,         // <|role|>\n... (no end marker), then <|assistant|>
  MistralV1,       // " [INST] ... [/INST] answer</s>"
  MistralV3,       // "[INST] ... [/INST] answer</s>"
  MistralV3Tekken, // "[INST]...[/INST]answer</s>"
  MistralV7,       // [SYSTEM_PROMPT] ... [/SYSTEM_PROMPT][INST] ... [/INST] answer</s>
  Phi3,            // <|role|>\n...<|end|>\n
  Phi4,            // <|im_start|>role<|im_sep|>...<|im_end|>
  Falcon3,         // <|role|>\n...\n
  Zephyr,          // <|role|>\n...<|endoftext|>\n
  Gemma,           // <start_of_turn>user\n...<end_of_turn>\n, "model" for the assistant, no system role
  CommandR,        // <|START_OF_TURN_TOKEN|><|USER_TOKEN|>...<|END_OF_TURN_TOKEN|>
  DeepSeek3,       // <｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜>
  Vicuna,          // USER: ...\nASSISTANT: ...</s>\n
  VicunaOrca,      // the same with "SYSTEM: ...\n"
};

// The template named `name` as in llama.cpp ("chatml", "llama2", "llama2-sys", "llama3", "mistral-v7", "phi3",
// "zephyr", "gemma", "chatglm4"...). An unknown name is an rf::Error that lists the known ones.
ChatTemplate chat_template_from_name(std::string_view name);
std::string_view chat_template_name(ChatTemplate chat_template);

// The family of `jinja_or_name`: a template name, or a model's Jinja source recognized by its markers.
// Neither is an rf::Error quoting the start of the template.
ChatTemplate detect_chat_template(std::string_view jinja_or_name);

// Renders a conversation. add_generation_prompt opens the assistant's turn for the model to write. The text
// starts without BOS (the tokenizer adds it) and is meant to be encoded with parse_special, so that markers
// such as <|im_start|> become their tokens.
std::string apply_chat_template(ChatTemplate chat_template, std::span<const ChatMessage> messages,
                                bool add_generation_prompt);

}  // namespace rf
