// The main of the GoogleTest executables (in place of gtest_main): runs the tests as gtest_main
// does and, where MXMOE_SKIP_REASONS_DIR is set (tests/CMakeLists.txt sets it on the tests ctest
// runs), records each skipped test's name and reason there, one small file per test
// ("<time>.<pid>.skip": the name on the first line, the reason on the second), written under a
// temporary name and renamed into place, so parallel ctest runs (-j) never see half a file.
// cmake/ctest_skip_reasons.cmake prints those reasons, grouped, after ctest's summary and removes
// the files. The test binaries write them because ctest 4 writes its log (LastTest.log) only after
// the post-test command has run, so the log cannot tell that command why tests were skipped.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <utility>

namespace {

// The reason of one skip: gtest's GTEST_SKIP() message, its lines joined by spaces (as the log
// parser in cmake/ctest_skip_reasons.cmake joins them).
std::string one_line(const std::string& message) {
  std::string out;
  size_t start = 0;
  while (start <= message.size()) {
    size_t end = message.find('\n', start);
    if (end == std::string::npos) end = message.size();
    std::string line = message.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) {
      if (!out.empty()) out.push_back(' ');
      out.append(line);
    }
    start = end + 1;
  }
  const size_t first = out.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return out.substr(first, out.find_last_not_of(" \t") - first + 1);
}

// The first skip message of `result`, or "" when it has none.
std::string skip_message(const testing::TestResult& result) {
  for (int i = 0; i < result.total_part_count(); ++i) {
    const testing::TestPartResult& part = result.GetTestPartResult(i);
    if (part.skipped()) return one_line(part.message());
  }
  return "";
}

class SkipReasonRecorder : public testing::EmptyTestEventListener {
 public:
  explicit SkipReasonRecorder(std::filesystem::path dir) : dir_(std::move(dir)) {}

  void OnTestEnd(const testing::TestInfo& info) override {
    if (!info.result()->Skipped()) return;
    const std::string name = std::string(info.test_suite_name()) + "." + info.name();
    std::string reason = skip_message(*info.result());
    if (reason.empty()) {  // skipped in SetUpTestSuite: the reason is the suite's
      const testing::TestSuite* suite = testing::UnitTest::GetInstance()->current_test_suite();
      if (suite != nullptr) reason = skip_message(suite->ad_hoc_test_result());
    }
    if (reason.empty()) reason = "(no message)";
    record(name, reason);
  }

 private:
  void record(const std::string& name, const std::string& reason) const {
    // Named by when the test ended (nanoseconds, zero-padded: the files sort in the order the tests
    // ran) and by the pid (unique among the processes of a parallel run).
    const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::system_clock::now().time_since_epoch());
    char file[64];
    std::snprintf(file, sizeof file, "%020lld.%ld.skip", static_cast<long long>(now.count()),
                  static_cast<long>(::getpid()));
    const std::filesystem::path final_path = dir_ / file;
    std::string tmp_file = file;
    tmp_file.append(".tmp");
    const std::filesystem::path tmp_path = dir_ / tmp_file;
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    {
      std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
      out << name << '\n' << reason << '\n';
      out.close();
      if (!out) {
        std::fprintf(stderr, "note: could not record the skip reason in %s\n", tmp_path.c_str());
        std::filesystem::remove(tmp_path, ec);
        return;
      }
    }
    std::filesystem::rename(tmp_path, final_path, ec);
    if (ec) {
      std::fprintf(stderr, "note: could not record the skip reason in %s: %s\n", final_path.c_str(),
                   ec.message().c_str());
      std::filesystem::remove(tmp_path, ec);
    }
  }

  std::filesystem::path dir_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (const char* dir = std::getenv("MXMOE_SKIP_REASONS_DIR"); dir != nullptr && *dir != '\0')
    testing::UnitTest::GetInstance()->listeners().Append(new SkipReasonRecorder(dir));  // gtest owns it
  return RUN_ALL_TESTS();
}
