// The command line run in-process with stdout and stderr captured, for CLI tests.
#pragma once

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/files.h"
#include "gtest/gtest.h"
#include "trainer/cli/cli.h"

namespace freeride {

struct CliResult {
  int status;
  std::string out;
  std::string err;
};

inline CliResult RunCommand(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  std::streambuf* old_out = std::cout.rdbuf(out.rdbuf());
  std::streambuf* old_err = std::cerr.rdbuf(err.rdbuf());
  int status = RunCli(args);
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  return {status, out.str(), err.str()};
}

// Writes TEXT to a file NAME in the test's temporary directory and returns its path.
inline std::string WriteTemp(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + name;
  EXPECT_TRUE(WriteFileAtomically(path, text).ok());
  return path;
}

}  // namespace freeride
