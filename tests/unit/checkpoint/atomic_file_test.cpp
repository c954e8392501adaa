// Atomic writes: a save that dies midway (SIGXFSZ from a file-size limit kills the writer inside
// write(2), as kill -9 would) leaves the previous file intact; `latest` moves only between the
// two barriers of commit_checkpoint.
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "deepspeed/checkpoint.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::checkpoint {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  while (const dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  return names;
}

TEST(AtomicFile, CommitReplacesTheFileAndLeavesNoTemporary) {
  testing::TempDir dir;
  const std::string path = dir.file("f.txt");
  write_file_atomically(path, "old");
  write_file_atomically(path, "new content");
  EXPECT_EQ(read_file(path), "new content");
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"f.txt"});
}

TEST(AtomicFile, AbandonedWriteLeavesTheOldFile) {
  testing::TempDir dir;
  const std::string path = dir.file("f.txt");
  write_file_atomically(path, "old");
  {
    AtomicFile file(path);
    file.write("partial", 7);
    EXPECT_EQ(file.temp_path().find(dir.path() + "/.f.txt.tmp."), 0u);
    EXPECT_EQ(entries(dir.path()).size(), 2u);
  }  // destroyed without commit, e.g. by an exception
  EXPECT_EQ(read_file(path), "old");
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"f.txt"});
}

TEST(AtomicFile, WriterKilledMidSaveLeavesThePreviousCheckpoint) {
  testing::TempDir dir;
  const std::string path = dir.file("mp_rank_00_model_states.pt");
  Dict old_value = new_dict();
  old_value.insert("step", int64_t{1});
  save(old_value, path);
  Dict big = new_dict();
  big.insert("step", int64_t{2});
  big.insert("w", at::ones({1 << 20}));  // 4 MiB, over the child's 256 KiB limit

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    struct rlimit no_core {0, 0}, small {256 << 10, 256 << 10};
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::setrlimit(RLIMIT_FSIZE, &small);  // the kernel sends SIGXFSZ when a write crosses it
    try {
      save(big, path);
    } catch (...) {
      ::_exit(3);  // SIGXFSZ ignored somehow: the write failed with EFBIG instead
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE((WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ) ||
              (WIFEXITED(status) && WEXITSTATUS(status) == 3))
      << "the writer was expected to die mid-write; status " << status;

  EXPECT_EQ(load(path).toGenericDict().at("step").toInt(), 1);
  // The dead writer's temporary is a dot-file that DeepSpeed's globs never match...
  for (const auto& name : entries(dir.path())) {
    EXPECT_TRUE(name == "mp_rank_00_model_states.pt" || name[0] == '.') << name;
  }
  EXPECT_EQ(list_files_with_suffix(dir.path(), "_model_states.pt").size(), 1u);
  // ... and the next save goes through.
  save(big, path);
  EXPECT_EQ(load(path).toGenericDict().at("step").toInt(), 2);
}

// A failing write (EFBIG here, ENOSPC on a full disk) surfaces as a CheckpointError naming the
// file and errno's text, through LibTorch's zip writer, without aborting the process.
TEST(AtomicFile, FailedWriteThrowsAndKeepsThePreviousFile) {
  testing::TempDir dir;
  const std::string path = dir.file("optim.pt");
  write_file_atomically(path, "previous");
  Dict big = new_dict();
  big.insert("w", at::ones({1 << 20}));
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // write(2) now fails with EFBIG instead of killing us
    struct rlimit small {256 << 10, 256 << 10};
    ::setrlimit(RLIMIT_FSIZE, &small);
    try {
      save(big, path);
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      const bool named = what.find(path) != std::string::npos &&
                         what.find("File too large") != std::string::npos;
      ::_exit(named ? 3 : 4);
    } catch (...) {
      ::_exit(5);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the writer died with signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 3) << "3: CheckpointError naming the file and the errno text";
  EXPECT_EQ(read_file(path), "previous");
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"optim.pt"});  // temporary removed
}

TEST(AtomicFile, WriteErrorsNameTheFile) {
  EXPECT_THROW_WITH(AtomicFile("/nonexistent-dir/x.pt"), CheckpointError,
                    "cannot create a file in /nonexistent-dir (to write /nonexistent-dir/x.pt)");
  EXPECT_THROW_WITH(AtomicFile("/tmp/"), CheckpointError, "is not a file path");
}

TEST(AtomicFile, CreateDirectoriesMakesParentsAndRefusesAFileInTheWay) {
  testing::TempDir dir;
  create_directories(dir.file("a/b/c"));
  create_directories(dir.file("a/b/c"));  // exists: fine
  EXPECT_EQ(entries(dir.file("a/b")), std::vector<std::string>{"c"});
  write_file_atomically(dir.file("file"), "x");
  EXPECT_THROW_WITH(create_directories(dir.file("file/sub")), CheckpointError,
                    "a file of that name exists");
}

TEST(Latest, WrittenWithoutNewlineAndReadStripped) {
  testing::TempDir dir;
  EXPECT_FALSE(read_latest(dir.path()).has_value());
  write_latest(dir.path(), "global_step10");
  EXPECT_EQ(read_file(dir.file("latest")), "global_step10");
  EXPECT_EQ(read_latest(dir.path()), "global_step10");
  write_file_atomically(dir.file("latest"), "  step 2\n");  // written by hand
  EXPECT_EQ(read_latest(dir.path()), "step 2");
  write_file_atomically(dir.file("latest"), "\n");
  EXPECT_THROW_WITH(read_latest(dir.path()), CheckpointError, "latest is empty");
}

TEST(Latest, CommitCheckpointMovesLatestBetweenTheBarriers) {
  testing::TempDir dir;
  write_latest(dir.path(), "old");
  create_directories(dir.file("new"));
  std::vector<std::string> seen_at_barrier;
  auto barrier = [&] { seen_at_barrier.push_back(*read_latest(dir.path())); };
  commit_checkpoint(dir.path(), "new", /*is_global_rank0=*/true, /*save_latest=*/true, barrier);
  EXPECT_EQ(seen_at_barrier, (std::vector<std::string>{"old", "new"}));

  seen_at_barrier.clear();
  commit_checkpoint(dir.path(), "other", /*is_global_rank0=*/false, true, barrier);
  EXPECT_EQ(seen_at_barrier, (std::vector<std::string>{"new", "new"}));  // not rank 0
  commit_checkpoint(dir.path(), "other", true, /*save_latest=*/false, barrier);
  EXPECT_EQ(read_latest(dir.path()), "new");
}

}  // namespace
}  // namespace deepspeed::checkpoint
