// Tests for the launcher's command line (tools/deepspeed/cli.cpp): accepted DeepSpeed flags with
// their defaults, where options stop, and the flags that are recognised and rejected by name.
#include "cli.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

using Args = std::vector<std::string>;

// Asserts that parsing throws UsageError whose message contains every fragment.
void expect_usage_error(const Args& args, const std::vector<std::string>& fragments) {
  try {
    parse_command_line(args);
    ADD_FAILURE() << "expected UsageError for " << ::testing::PrintToString(args);
  } catch (const UsageError& e) {
    for (const auto& fragment : fragments) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
          << "message '" << e.what() << "' lacks '" << fragment << "'";
    }
  }
}

TEST(Cli, Defaults_MatchDeepSpeed) {
  CommandLine cl = parse_command_line({"prog"});
  EXPECT_EQ(cl.options.num_gpus, -1);
  EXPECT_EQ(cl.options.master_port, 29500);
  EXPECT_EQ(cl.options.master_addr, "") << "resolved later: 127.0.0.1 locally, hostname -I across hosts";
  EXPECT_FALSE(cl.options.no_local_rank);
  EXPECT_EQ(cl.options.hostfile, "/job/hostfile");
  EXPECT_FALSE(cl.options.hostfile_given);
  EXPECT_EQ(cl.options.include, "");
  EXPECT_EQ(cl.options.exclude, "");
  EXPECT_EQ(cl.options.num_nodes, -1);
  EXPECT_EQ(cl.options.launcher, "pdsh");
  EXPECT_EQ(cl.options.launcher_args, "");
  EXPECT_EQ(cl.options.ssh_port, -1);
  EXPECT_EQ(cl.options.node_rank, -1);
  EXPECT_FALSE(cl.options.force_multi || cl.options.no_ssh || cl.options.no_ssh_check);
  EXPECT_FALSE(cl.options.save_pid || cl.options.bind_cores_to_rank);
  EXPECT_EQ(cl.options.world_info, "");
  EXPECT_EQ(cl.options.program, "prog");
  EXPECT_TRUE(cl.options.program_args.empty());
  EXPECT_TRUE(cl.warnings.empty());
}

TEST(Cli, ArgsAfterProgram_AreUntouchedEvenWhenTheyLookLikeOurFlags) {
  CommandLine cl = parse_command_line({"--num_gpus", "2", "prog", "--num_gpus", "7", "--foo", "--", "-h",
                                       "--include", "x"});
  EXPECT_EQ(cl.options.num_gpus, 2);
  EXPECT_EQ(cl.options.program, "prog");
  EXPECT_EQ(cl.options.program_args, (Args{"--num_gpus", "7", "--foo", "--", "-h", "--include", "x"}));
  EXPECT_FALSE(cl.help_requested);
}

TEST(Cli, AcceptsEqualsFormAndAliases) {
  CommandLine cl = parse_command_line({"--num_accelerators=3", "--master_port=1234", "--master_addr",
                                       "10.0.0.1", "--no_local_rank", "--no_python", "--save_pid",
                                       "--bind_cores_to_rank", "--bind_core_list", "0-3",
                                       "--enable_each_rank_log", "/tmp/logs", "--log_level", "warning",
                                       "-q", "--num_nodes", "1", "/usr/bin/python3", "train.py"});
  const LauncherOptions& o = cl.options;
  EXPECT_EQ(o.num_gpus, 3);
  EXPECT_EQ(o.master_port, 1234);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_TRUE(o.no_local_rank && o.no_python && o.save_pid && o.bind_cores_to_rank && o.quiet);
  EXPECT_EQ(o.bind_core_list, "0-3");
  EXPECT_EQ(o.enable_each_rank_log, "/tmp/logs");
  EXPECT_EQ(o.log_level, "warning");
  EXPECT_EQ(o.program, "/usr/bin/python3");
  EXPECT_EQ(o.program_args, (Args{"train.py"}));
}

TEST(Cli, DoubleDash_EndsOptions) {
  CommandLine cl = parse_command_line({"--num_gpus", "2", "--", "prog", "a"});
  EXPECT_EQ(cl.options.program, "prog");
  EXPECT_EQ(cl.options.program_args, (Args{"a"}));
}

TEST(Cli, Help_IsReportedNotThrown) {
  CommandLine cl = parse_command_line({"--help"});
  EXPECT_TRUE(cl.help_requested);
  EXPECT_NE(cl.help_text.find("Usage: deepspeed [OPTIONS] PROGRAM [ARGS...]"), std::string::npos);
  EXPECT_NE(cl.help_text.find("--num_gpus"), std::string::npos);
  EXPECT_TRUE(parse_command_line({"-h"}).help_requested);
}

TEST(Cli, MultiNodeFlags_AreAccepted) {
  CommandLine cl = parse_command_line({"-H", "/nonexistent/hosts", "-i", "worker-0:0,1@worker-1", "--num_nodes",
                                       "2", "--launcher", "OpenMPI", "--launcher_args", "-x FOO --mca btl tcp",
                                       "--ssh_port", "2222", "--force_multi", "--no_ssh_check", "--venv_script",
                                       "/opt/env.sh", "prog", "--launcher_args", "mine"});
  const LauncherOptions& o = cl.options;
  EXPECT_EQ(o.hostfile, "/nonexistent/hosts");
  EXPECT_TRUE(o.hostfile_given);
  EXPECT_EQ(o.include, "worker-0:0,1@worker-1");
  EXPECT_EQ(o.num_nodes, 2);
  EXPECT_EQ(o.launcher, "openmpi") << "case-insensitive, as DeepSpeed lower-cases it";
  EXPECT_EQ(o.launcher_args, "-x FOO --mca btl tcp") << "a value that starts with '-' is still the value";
  EXPECT_EQ(o.ssh_port, 2222);
  EXPECT_TRUE(o.force_multi && o.no_ssh_check);
  EXPECT_EQ(o.venv_script, "/opt/env.sh");
  EXPECT_EQ(o.program_args, (Args{"--launcher_args", "mine"})) << "PROGRAM's own args stay untouched";

  CommandLine eq = parse_command_line({"--exclude=worker-1:0", "-e", "w2", "--no_ssh", "--node_rank=1", "prog"});
  EXPECT_EQ(eq.options.exclude, "w2") << "the last one wins";
  EXPECT_TRUE(eq.options.no_ssh);
  EXPECT_EQ(eq.options.node_rank, 1);
}

TEST(Cli, PerNodeMode_FlagsAreParsed) {
  CommandLine cl = parse_command_line({"--world_info=-_abc=", "--node_rank=1", "--master_addr=10.0.0.1",
                                       "--master_port=29501", "--stop_on_stdin_eof", "--", "prog", "a"});
  EXPECT_EQ(cl.options.world_info, "-_abc=");
  EXPECT_EQ(cl.options.node_rank, 1);
  EXPECT_TRUE(cl.options.stop_on_stdin_eof);
  EXPECT_EQ(cl.options.program, "prog");
  EXPECT_EQ(cl.options.program_args, (Args{"a"}));
  EXPECT_EQ(parse_command_line({"--world_info", "-abc", "prog"}).options.world_info, "-abc");
}

class CliRejectsFlag : public ::testing::TestWithParam<Args> {};

TEST_P(CliRejectsFlag, NamingTheFlag) {
  Args args = GetParam();
  const std::string flag = args.front().substr(0, args.front().find('='));
  args.push_back("prog");
  expect_usage_error(args, {flag, "not supported"});
}

INSTANTIATE_TEST_SUITE_P(Elastic, CliRejectsFlag,
                         ::testing::Values(Args{"--min_elastic_nodes", "1"}, Args{"--max_elastic_nodes", "2"},
                                           Args{"--elastic_training"}, Args{"--launcher", "jsrun"},
                                           Args{"--launcher=JSRUN"}));

TEST(Cli, MpiLaunchersAreTakenInAnyCase) {
  for (const char* l : {"mpich", "IMPI", "MVAPICH"}) {
    std::string lower = l;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_EQ(parse_command_line({"--launcher", l, "prog"}).options.launcher, lower);
  }
}

TEST(Cli, Autotuning_TakesTuneOrRun) {
  EXPECT_EQ(parse_command_line({"--autotuning", "tune", "prog"}).options.autotuning, "tune");
  EXPECT_EQ(parse_command_line({"--autotuning=run", "prog", "--x"}).options.autotuning, "run");
  EXPECT_EQ(parse_command_line({"prog"}).options.autotuning, "");
  expect_usage_error({"--autotuning", "search", "prog"}, {"--autotuning", "search"});
}

TEST(Cli, UnknownLauncher_ListsTheSupportedOnes) {
  expect_usage_error({"--launcher", "pbs", "prog"},
                     {"--launcher 'pbs'", "pdsh, openmpi, mpich, impi, mvapich or slurm"});
}

TEST(Cli, BadSshPort_IsNamed) {
  expect_usage_error({"--ssh_port", "0", "prog"}, {"--ssh_port 0"});
  expect_usage_error({"--ssh_port", "70000", "prog"}, {"--ssh_port 70000"});
}

TEST(Cli, ExistingHostfile_IsTaken) {
  const std::string path = ::testing::TempDir() + "/ds_launcher_cli_test_hostfile";
  std::ofstream(path) << "worker-0 slots=8\nworker-1 slots=8\n";
  CommandLine cl = parse_command_line({"--hostfile", path, "prog"});
  EXPECT_EQ(cl.options.hostfile, path);
  EXPECT_TRUE(cl.warnings.empty());
  std::remove(path.c_str());
}

TEST(Cli, MissingHostfile_WarnsAndRunsLocally) {
  CommandLine cl = parse_command_line({"-H", "/nonexistent/hostfile", "--num_gpus", "2", "prog"});
  ASSERT_EQ(cl.warnings.size(), 1u);
  EXPECT_EQ(cl.warnings[0], "Unable to find hostfile, will proceed with training with local resources only.");
  EXPECT_EQ(cl.options.num_gpus, 2);
}

TEST(Cli, Module_IsRejectedWithAWayOut) {
  expect_usage_error({"--module", "pkg.train"}, {"--module", "not supported", "python3 -m"});
}

TEST(Cli, UnknownOptionBeforeProgram_IsNamed) {
  expect_usage_error({"--num_gpu", "2", "prog"}, {"unknown option '--num_gpu'"});
  expect_usage_error({"--bogus=1", "prog"}, {"'--bogus=1'"});
}

TEST(Cli, MissingProgram_SaysUsage) {
  expect_usage_error({}, {"missing PROGRAM", "deepspeed [OPTIONS] PROGRAM"});
  expect_usage_error({"--num_gpus", "2"}, {"missing PROGRAM"});
}

TEST(Cli, BadValues_AreUsageErrors) {
  expect_usage_error({"--num_gpus", "two", "prog"}, {"--num_gpus"});
  expect_usage_error({"--log_level", "loud", "prog"}, {"--log_level", "loud"});
  expect_usage_error({"--master_port", "prog"}, {"--master_port"});
}

}  // namespace
}  // namespace deepspeed::launcher
