// After a run of the GPU tests, one summary per kernel that failed somewhere: on which shapes it
// passes and on which it fails. CTest runs one test per process, so this shows when the test
// program runs several shapes at once, as in
//     build/bin/fa_gpu_tests --gtest_filter='*ch03_mine*'
// which is how README's "Add your own kernel" suggests to see where a kernel goes wrong.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace {

class ShapeSummary : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo& info) override {
    // Parameterized kernel tests print their parameter as "<kernel> on <shape>".
    const char* param = info.value_param();
    if (!param) return;
    const std::string text = param;
    const std::size_t on = text.find(" on ");
    if (on == std::string::npos) return;
    Outcome& k = kernels_[text.substr(0, on)];
    const std::string shape =
        std::string(info.name()).substr(0, std::string(info.name()).find('/')) + " " + text.substr(on + 4);
    if (info.result()->Skipped()) {
      ++k.skipped;
    } else if (info.result()->Passed()) {
      k.passed.push_back(shape);
    } else {
      k.failed.push_back(shape);
    }
  }

  void OnTestProgramEnd(const ::testing::UnitTest&) override {
    bool header = false;
    for (const auto& [name, k] : kernels_) {
      if (k.failed.empty()) continue;
      if (!header) std::printf("\nWhich shapes pass, per kernel that failed somewhere:\n");
      header = true;
      std::printf("  %s: %zu of %zu shapes pass%s\n", name.c_str(), k.passed.size(), k.passed.size() + k.failed.size(),
                  k.skipped ? (", " + std::to_string(k.skipped) + " skipped (not supported here)").c_str() : "");
      for (const std::string& s : k.failed) std::printf("    FAIL %s\n", s.c_str());
      for (const std::string& s : k.passed) std::printf("    ok   %s\n", s.c_str());
    }
    std::fflush(stdout);
  }

 private:
  struct Outcome {
    std::vector<std::string> passed, failed;
    int skipped = 0;
  };
  std::map<std::string, Outcome> kernels_;
};

// Registered before gtest_main's RUN_ALL_TESTS; GoogleTest owns (and deletes) the listener.
const bool registered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new ShapeSummary);
  return true;
}();

}  // namespace
