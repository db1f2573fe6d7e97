// OpenAI's official Node client, unmodified (tests/server/openai_client, `openai` pinned in its package-lock.json),
// against `rocmforge serve` on the CPU: its check.mjs lists the model, completes and chats greedily, streamed and not,
// and gets the client's typed errors; its answers must be `rocmforge run --temp 0`'s and `rocmforge chat --temp 0`'s.
// Skipped where Node.js 20 or the installed package is missing (`make test` installs the package with npm ci).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "server/server_process.h"
#include "tokenizer/chat_template.h"

namespace rf::test {
namespace {

// The client's folder lies beside this source file: tests run from the build tree, which has no copy of it.
const fs::path kClientDir = fs::path(__FILE__).parent_path() / "openai_client";

// Whether `node` runs and is Node.js 20 or later, the oldest the pinned client supports.
bool has_node_20() {
  return std::system(R"(node -e 'process.exit(parseInt(process.versions.node) >= 20 ? 0 : 1)' 2>/dev/null)") == 0;
}

TEST_F(ServerTest, OfficialNodeClientCompletesChatsAndStreams) {
  if (!has_node_20())
    GTEST_SKIP() << "needs Node.js 20 or later as `node`, and npm (e.g. nodesource.com's Debian package nodejs), then "
                 << "npm ci --prefix " << kClientDir.string() << " (make test runs it)";
  if (!fs::exists(kClientDir / "node_modules/openai/package.json"))
    GTEST_SKIP() << "the openai package is not installed: npm ci --prefix " << kClientDir.string()
                 << " (make test runs it)";

  const std::string prompt = "Once upon a time", message = "Tell me a story about a dog";
  constexpr int kMaxTokens = 24;
  const json expected = {
      {"prompt", prompt},
      {"message", message},
      {"max_tokens", kMaxTokens},
      {"completion", run_greedy(kStories, prompt, kMaxTokens)},
      {"prompt_tokens", token_count(kStories, prompt)},
      // The stories model has no chat template of its own: the server chats with chatml.
      {"chat", chat_greedy(kStories, message, "chatml", kMaxTokens)},
      {"chat_prompt_tokens",
       token_count(kStories,
                   apply_chat_template(ChatTemplate::ChatML, std::vector<ChatMessage>{{"user", message}}, true))}};
  std::ofstream(path("expected.json")) << expected.dump();

  // With a key, so that the client's Authorization header is checked and a wrong key's refusal can be.
  ServerProcess server(serve_args(kStories), "sk-local");
  const std::string command =
      fmt::format("OPENAI_API_KEY=sk-local node '{}' http://127.0.0.1:{}/v1 '{}' >'{}' 2>&1",
                  (kClientDir / "check.mjs").string(), server.port(), path("expected.json"), path("node.out"));
  const int raw = std::system(command.c_str());
  const int status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  EXPECT_EQ(status, 0) << command << "\n" << read_text(path("node.out")) << "server log:\n" << server.log();
}

}  // namespace
}  // namespace rf::test
