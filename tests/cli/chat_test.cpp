// `rocmforge chat` with stdin a pipe: one reply per user line, and a full context said plainly.
#include "cli/cli_run.h"

namespace rf::test {
namespace {

class ChatTest : public CliTest {
 protected:
  // Runs `rocmforge ARGS` with `input` on stdin (CliTest::run gives it /dev/null).
  RunResult run_with_input(const std::string& args, const std::string& input) const {
    std::ofstream(path("stdin"), std::ios::binary) << input;
    const std::string command = "'" + cli_path() + "' " + args + " <'" + path("stdin") + "' >'" + path("stdout") +
                                "' 2>'" + path("stderr") + "'";
    const int raw = std::system(command.c_str());
    return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, read_text(path("stdout")), read_text(path("stderr"))};
  }

  const std::string stories_ = model_path("stories260K.gguf");
};

TEST_F(ChatTest, OneReplyPerLine) {
  const RunResult result =
      run_with_input("chat -m '" + stories_ + "' --system 'Tell stories.' -n 12 --seed 3 --ctx 256",
                     "Hello there\nTell me more\n");
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_EQ(lines(result.out).size(), 2u) << result.out;
  EXPECT_EQ(result.err, "");
}

TEST_F(ChatTest, FullContextIsSaidNotFailed) {
  const RunResult result = run_with_input("chat -m '" + stories_ + "' --chat-template chatml -n 8 --ctx 40",
                                          "Once upon a time\nthere was a dog\nand a cat\nand a bird\n");
  EXPECT_EQ(result.status, 0) << result.err;
  EXPECT_NE(result.err.find("the context of 40 tokens is full"), std::string::npos) << result.err;
}

TEST_F(ChatTest, UnknownTemplateIsAnError) {
  expect_error("chat -m '" + stories_ + "' --chat-template no-such-template", "no-such-template");
}

}  // namespace
}  // namespace rf::test
