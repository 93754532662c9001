// SPDX-License-Identifier: Apache-2.0
// What the operating system can hand the library: files that are not regular files (FIFOs, sockets, folders)
// as inputs and as save targets, and thread counts the process cannot run. Each is a status and a message,
// never a hang, a replaced device node, a print or the process killed by the OpenMP runtime.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "maxsim/maxsim.hpp"
#include "npy.h"
#include "test_util.h"

namespace maxsim::test {
namespace {

class SystemInput : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/maxsim-system-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) std::system(("rm -rf '" + dir_ + "'").c_str());
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string Fifo(const std::string& name) const {
    const std::string p = Path(name);
    EXPECT_EQ(mkfifo(p.c_str(), 0644), 0);
    return p;
  }
  // A unix socket bound at `name` (the descriptor stays open for the test's lifetime).
  std::string Socket(const std::string& name) {
    const std::string p = Path(name);
    sock_ = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    EXPECT_LT(p.size(), sizeof(addr.sun_path));
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", p.c_str());
    EXPECT_EQ(bind(sock_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    return p;
  }
  std::vector<std::string> Listing() const {
    std::vector<std::string> names;
    std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dir_.c_str()), closedir);
    while (dirent* e = readdir(d.get())) {
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") names.push_back(e->d_name);
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  ~SystemInput() override {
    if (sock_ >= 0) close(sock_);
  }
  std::string dir_;
  int sock_ = -1;
};

// Runs `read` (which opens `fifo`) and expects it to return within a few seconds. If it blocks, the FIFO is
// opened for writing, which releases the reader, and the test fails.
template <typename F>
auto MustNotBlock(const std::string& fifo, F read) {
  auto result = std::async(std::launch::async, read);
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "reading " << fifo << " blocked";
    const int fd = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) close(fd);
  }
  return result.get();
}

Packed SmallPacked() {
  std::vector<float> v(3 * 8, 0.5f);
  const std::vector<uint64_t> off{0, 2, 3};
  return Packed::Pack(nullptr, DenseSets(v.data(), 8, off));
}

TEST_F(SystemInput, LoadingAFifoOrAFolderIsAnErrorNotAHang) {
  const std::string fifo = Fifo("corpus.maxsim");
  for (maxsim_validation level : {MAXSIM_VALIDATE_FAST, MAXSIM_VALIDATE_STANDARD}) {
    maxsim_packed* p = nullptr;
    std::string message;  // maxsim_last_error is per thread: read it on the thread that made the call
    const maxsim_status st = MustNotBlock(fifo, [&] {
      const maxsim_status r = maxsim_packed_load(fifo.c_str(), level, &p);
      message = maxsim_last_error();
      return r;
    });
    EXPECT_EQ(st, MAXSIM_ERR_IO);
    EXPECT_NE(message.find("FIFO"), std::string::npos) << message;
    EXPECT_EQ(p, nullptr);
  }
  maxsim_packed* p = nullptr;
  EXPECT_EQ(maxsim_packed_load(dir_.c_str(), MAXSIM_VALIDATE_STANDARD, &p), MAXSIM_ERR_IO);
  EXPECT_NE(std::string(maxsim_last_error()).find("directory"), std::string::npos) << maxsim_last_error();
}

TEST_F(SystemInput, NpyReaderRefusesFifosAndFolders) {
  const std::string fifo = Fifo("q.npy");
  npy::Array a;
  const std::string err = MustNotBlock(fifo, [&] { return npy::Read(fifo, &a); });
  EXPECT_NE(err.find("FIFO"), std::string::npos) << err;
  const std::string dir_err = npy::Read(dir_, &a);
  EXPECT_NE(dir_err.find("is a directory"), std::string::npos) << dir_err;
}

// A save replaces a regular file (atomically) but never a FIFO, socket or folder: it refuses with a message
// and leaves the target as it was, with no temporary file behind.
TEST_F(SystemInput, SavesRefuseTargetsThatAreNotRegularFiles) {
  Packed p = SmallPacked();
  const std::string fifo = Fifo("fifo.maxsim"), sock = Socket("sock.maxsim"), folder = Path("folder.maxsim");
  ASSERT_EQ(mkdir(folder.c_str(), 0755), 0);
  const std::string link = Path("link.maxsim");
  ASSERT_EQ(symlink(fifo.c_str(), link.c_str()), 0);
  const auto before = Listing();
  const struct {
    std::string path;
    const char* kind;
  } cases[] = {{fifo, "FIFO"}, {sock, "socket"}, {folder, "directory"}, {link, "FIFO"}};
  for (const auto& c : cases) {
    EXPECT_EQ(maxsim_packed_save(p.get(), c.path.c_str()), MAXSIM_ERR_IO) << c.path;
    EXPECT_NE(std::string(maxsim_last_error()).find(c.kind), std::string::npos) << maxsim_last_error();
    npy::Array a;
    a.dtype = npy::Dtype::kF32;
    a.shape = {1};
    a.data.assign(4, 0);
    const std::string err = npy::Write(c.path, a);
    EXPECT_NE(err.find(c.kind), std::string::npos) << err;
  }
  EXPECT_EQ(Listing(), before) << "a target was replaced or a temporary file was left behind";
  struct stat st;
  ASSERT_EQ(stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  // A regular file is replaced, and reads back.
  const std::string ok = Path("ok.maxsim");
  std::ofstream(ok) << "old";
  ASSERT_EQ(maxsim_packed_save(p.get(), ok.c_str()), MAXSIM_OK) << maxsim_last_error();
  Packed back = Packed::Load(ok);
  EXPECT_EQ(back.Describe().size, p.Describe().size);
}

maxsim_status CreateWithThreads(int32_t threads, maxsim_context** ctx) {
  maxsim_options o;
  maxsim_options_init(&o);
  o.num_threads = threads;
  o.load_plugins = 0;
  o.backend = "cpu";
  return maxsim_context_create(&o, ctx);
}

// Counts above the documented 4096 (and negative ones) are refused with a status; 4096 itself works, scoring
// included (a team of 4096 OpenMP threads).
TEST(Threads, CountsOutsideOneTo4096AreRefused) {
  for (int32_t n : {-1, 4097, 5000, 100000, INT_MAX, INT_MIN}) {
    maxsim_context* ctx = nullptr;
    EXPECT_EQ(CreateWithThreads(n, &ctx), MAXSIM_ERR_INVALID_ARGUMENT) << n;
    EXPECT_NE(std::string(maxsim_last_error()).find("4096"), std::string::npos) << maxsim_last_error();
    EXPECT_EQ(ctx, nullptr);
  }
  maxsim_options o;
  maxsim_options_init(&o);
  o.num_threads = 4096;
  o.load_plugins = 0;
  o.backend = "cpu";
  Context ctx(o);
  EXPECT_EQ(ctx.Threads(), 4096);
  std::vector<float> d(2048 * 4, 0.25f), q(2 * 4, 1.0f);
  const std::vector<uint64_t> doff{0, 2048}, qoff{0, 2};
  const auto s = ctx.ScoreMatrix(DenseSets(q.data(), 4, qoff), 1, DenseSets(d.data(), 4, doff), 1);
  EXPECT_EQ(s[0], 2.0f);
}

// Run in a child process: an unprivileged user with a process limit (ulimit -u) asks for more threads than it
// may start. The library must answer with a status; libgomp would print "Thread creation failed" and exit.
TEST(Threads, ThreadCreationFailureIsAStatusNotAnExit) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to switch to an unprivileged user whose process limit applies";
  char tmpl[] = "/tmp/maxsim-threads-XXXXXX";
  const int out_fd = mkstemp(tmpl);
  ASSERT_GE(out_fd, 0);
  const std::string out = tmpl;
  auto run = [&](const char* threads) {
    const pid_t pid = fork();
    if (pid < 0) {
      ADD_FAILURE() << threads << " threads: fork failed: " << std::strerror(errno);
      return std::string();
    }
    if (pid == 0) {
      ftruncate(out_fd, 0);
      dup2(out_fd, 1);
      dup2(out_fd, 2);
      if (setgid(65534) != 0 || setuid(65534) != 0) _exit(77);
      const rlimit limit{48, 48};
      if (setrlimit(RLIMIT_NPROC, &limit) != 0) _exit(78);
      execl(MAXSIM_THREAD_CHILD_PATH, MAXSIM_THREAD_CHILD_PATH, threads, static_cast<char*>(nullptr));
      _exit(79);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    std::ifstream in(out);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << threads << " threads: the child did not exit normally (status " << status << "):\n" << text.str();
    return text.str();
  };
  const std::string many = run("400");
  EXPECT_NE(many.find("create MAXSIM_ERR_INVALID_ARGUMENT"), std::string::npos) << many;
  EXPECT_NE(many.find("ulimit -u"), std::string::npos) << many;
  EXPECT_EQ(many.find("Thread creation failed"), std::string::npos) << many;
  const std::string few = run("8");
  EXPECT_NE(few.find("create MAXSIM_OK"), std::string::npos) << few;
  EXPECT_NE(few.find("score MAXSIM_OK"), std::string::npos) << few;
  close(out_fd);
  unlink(out.c_str());
}

}  // namespace
}  // namespace maxsim::test
