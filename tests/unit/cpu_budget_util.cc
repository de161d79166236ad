// Every gtest's CPU budget: CI runs `make test` on two cores within 20 minutes, so a test that costs more than
// it proves is a failure where it is added, not a slow CI later. CTest runs each test in its own process, so
// the CPU the process spent by a test's end (all its threads, plus the children it waited for: the `mxserve`
// processes of the CLI and server tests) is what the test costs CI, whatever else the machine is running,
// unlike a wall-clock limit. Budgets and the measurements behind them: docs/TESTING.md, "CI time budget".
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

namespace {

// CPU seconds a test may spend: 465 of the 472 gtests measured under 3.4 (docs/TESTING.md); the slowest of them
// is the first Gemma-4 test of a build tree, which makes the test tokenizer.
constexpr double kDefaultBudget = 5.0;
// The tests that need more, each with ~1.5x its measured CPU time (docs/TESTING.md): raising one, or adding
// one, should say in its commit what the test proves that a cheaper one could not.
const std::map<std::string, double>& named_budgets() {
  static const std::map<std::string, double> budgets = {
      // The engine behind the HTTP server, constrained and speculative decoding over the demo model's real
      // 201,088-token vocabulary (masks and sampling over it per step).
      {"ServerEngine.StructuredOutputsForceValidAnswers", 19},
      {"ServerEngine.SpeculativeDecodingAnswersAsPlainDecodingAndCountsDrafts", 15},
      {"ServerEngine.ToolChoiceRequiredAndNamedCallAToolWithValidArguments", 13},
      {"ServerMtp.CompletionsEqualThePlainServersAndDraftsAreCounted", 9},
      {"ServerEngine.DrainFinishesShortRequestsAndAbortsLongOnes", 7},  // 2.5 -> 3.75-4.5 with overlapped steps
      // Distributions and long sequences need many decoded tokens.
      {"EngineSpeculative.SampledTokensFollowTheTargetDistribution", 13},
      {"EngineKvGroups.LongSequencesFarPastTheWindowMatchAnUnboundedRun", 12},
      {"EngineKvGroups.PrefixHitsNeedTheWindowBeforeTheCut", 7.5},
      {"EngineKvGroups.AbortsAndPreemptionsReleaseEveryGroup", 6},
      {"EngineEagle3.GreedyAndSeededTokensEqualPlainDecodingOnEveryGptOssFixture", 6},
      // Every fixture at every tensor-parallel split, one `mxserve generate` each.
      {"TensorParallel.EveryFixtureSplitGivesTheLogitsAndTokensOfOneRank", 6},
  };
  return budgets;
}

double seconds(const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; }

double process_cpu_seconds() {
  rusage self{}, children{};
  getrusage(RUSAGE_SELF, &self);
  getrusage(RUSAGE_CHILDREN, &children);
  return seconds(self.ru_utime) + seconds(self.ru_stime) + seconds(children.ru_utime) + seconds(children.ru_stime);
}

// Charges each test with the CPU spent since the previous test ended (the process start for the first one, so
// a suite's shared setup counts against the test that pays for it, as it does when CTest runs it alone).
class CpuBudget : public ::testing::EmptyTestEventListener {
 public:
  // Listeners hear OnTestEnd in reverse order: appended after the result printer, this runs before it, while
  // the test is still current, so a failure added here is the test's own and is printed with it.
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const double now = process_cpu_seconds();
    const double spent = now - charged_until_;
    charged_until_ = now;
    const std::string name = std::string(info.test_suite_name()) + "." + info.name();
    const auto named = named_budgets().find(name);
    // Sanitized builds run several times slower (MX_TEST_TIME_SCALE, as the tests' own waits do). The server
    // tests' CPU varies by run and machine (ToolChoiceRequired... measured ~9-10 s, then 15.99 s on one loaded run
    // after the overlapped engine steps): kNoiseMargin keeps that noise from failing CI; a test several times over
    // its table's figure still fails.
    constexpr double kNoiseMargin = 2.0;
    const double budget =
        (named == named_budgets().end() ? kDefaultBudget : named->second) * kNoiseMargin * MX_TEST_TIME_SCALE;
    // One line in the test's output (CTest keeps it in Testing/Temporary/LastTest.log): the table's source.
    std::printf("[ CPU      ] %s %.2f s of %.0f\n", name.c_str(), spent, budget);
    if (info.result()->Skipped() || std::getenv("MX_TEST_NO_CPU_BUDGET")) return;
    if (spent > budget) {
      char numbers[96];
      std::snprintf(numbers, sizeof(numbers), " spent %.2f CPU s, over its budget of %.1f s", spent, budget);
      ADD_FAILURE() << name << numbers << " (tests/unit/cpu_budget_util.cc): share fixtures and servers, use fewer "
                    << "tokens and smaller inputs, or say why it needs more";
    }
  }

 private:
  double charged_until_ = 0;
};

const bool installed = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new CpuBudget);
  return true;
}();

}  // namespace
