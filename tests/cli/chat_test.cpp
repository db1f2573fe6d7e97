// `rocmforge chat` with stdin a pipe: one reply per user line, and a full context said plainly.
#include "cli/cli_run.h"

namespace rf::test {
namespace {

class ChatTest : public CliTest {
 protected:
  const std::string stories_ = model_path("stories260K.gguf");
};

TEST_F(ChatTest, OneReplyPerLine) {
  const RunResult result =
      run("chat -m '" + stories_ + "' --system 'Tell stories.' -n 12 --seed 3 --ctx 256", "Hello there\nTell me more\n");
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_EQ(lines(result.out).size(), 2u) << result.out;
  EXPECT_EQ(result.err, "");
}

TEST_F(ChatTest, FullContextIsSaidNotFailed) {
  const RunResult result = run("chat -m '" + stories_ + "' --chat-template chatml -n 8 --ctx 40",
                               "Once upon a time\nthere was a dog\nand a cat\nand a bird\n");
  EXPECT_EQ(result.status, 0) << result.err;
  EXPECT_NE(result.err.find("the context of 40 tokens is full"), std::string::npos) << result.err;
}

TEST_F(ChatTest, UnknownTemplateIsAnError) {
  expect_error("chat -m '" + stories_ + "' --chat-template no-such-template", "no-such-template");
}

}  // namespace
}  // namespace rf::test
