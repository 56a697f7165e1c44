// The in-process key (common/in_process_key.h): 16 bytes, the same on every call, accepted only as
// a whole; another process draws another key.
#include "common/in_process_key.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace paramd {
namespace {

std::string Hex(const std::string& bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : bytes) {
    hex += kHex[c >> 4];
    hex += kHex[c & 15];
  }
  return hex;
}

TEST(InProcessKeyTest, IsSixteenBytesTheSameOnEveryCall) {
  const std::string& key = InProcessKey();
  EXPECT_EQ(key.size(), 16u);
  EXPECT_EQ(&InProcessKey(), &key);
  EXPECT_EQ(InProcessKey(), key);
  EXPECT_NE(key, std::string(16, '\0')) << "the key was not drawn";
}

TEST(InProcessKeyTest, OnlyTheWholeKeyIsAccepted) {
  const std::string key = InProcessKey();
  EXPECT_TRUE(IsInProcessKey(key));
  EXPECT_FALSE(IsInProcessKey(""));
  EXPECT_FALSE(IsInProcessKey(key.substr(0, 15)));
  EXPECT_FALSE(IsInProcessKey(key + "x"));
  for (size_t i = 0; i < key.size(); ++i) {
    std::string changed = key;
    changed[i] = static_cast<char>(changed[i] ^ 1);
    EXPECT_FALSE(IsInProcessKey(changed)) << "byte " << i;
  }
}

// A process started afresh (fork + exec of this test) draws its own key; a child that is only
// forked shares the parent's memory image, so exec is what a daemon and a trainer of two
// processes are.
TEST(InProcessKeyTest, AnotherProcessHasAnotherKey) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    dup2(fds[1], STDOUT_FILENO);
    execl("/proc/self/exe", "in_process_key_test", "--gtest_filter=InProcessKeyTest.PrintsItsKey",
          "--gtest_brief=1", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buffer[256];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof(buffer))) > 0;) out.append(buffer, n);
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  const size_t at = out.find("key:");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string theirs = out.substr(at + 4, 32);
  EXPECT_EQ(theirs.size(), 32u);
  EXPECT_NE(theirs, Hex(InProcessKey()));
}

// Run by AnotherProcessHasAnotherKey in a process of its own.
TEST(InProcessKeyTest, PrintsItsKey) { printf("key:%s\n", Hex(InProcessKey()).c_str()); }

}  // namespace
}  // namespace paramd
